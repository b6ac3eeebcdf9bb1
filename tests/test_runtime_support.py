"""What gbmw's runtime cannot train is said when planning for it (`gbmw plan`, default `--target runtime`) in one
line, and `gbmw train` refuses with the same sentence (gbmw.space.runtime_support)."""

from pathlib import Path

import pytest

from gbmw.cli.main import main
from gbmw.space.runtime_support import runtime_refusal, runtime_warning
from gbmw.specs.jobs import load_job

JOBS = sorted(path.stem for path in (Path(__file__).resolve().parent.parent / "recipes" / "jobs").glob("*.yaml"))


@pytest.mark.parametrize("job_name", JOBS)
def test_every_bundled_job_is_runnable_or_refused_with_its_reason(job_name):
    job = load_job(job_name)
    family = job.model.architecture.family
    refusal = runtime_refusal(job.model.architecture, job.precision)
    if getattr(job.model.architecture, "latent_attention", None) is not None:
        assert "`latent_attention` (multi-head latent attention, DeepSeek-V2/V3)" in refusal
    elif family in ("gpt", "bert") and job.precision in ("fp32", "bf16"):
        assert refusal is None  # LLaMA-style decoders included (llama-7b, llama-tiny)
    elif family not in ("gpt", "bert"):
        assert f"`family: {family}` is planned but not trained by gbmw's runtime" in refusal
    else:
        assert f"precision {job.precision}: gbmw's runtime trains in fp32, tf32 or bf16" in refusal
    assert runtime_warning(job, "deepspeed") is None  # said only when planning for the runtime


def test_a_layer_list_has_no_modules_to_build():
    assert "layer list" in runtime_refusal(None)


def test_hf_features_the_runtime_does_not_build_are_refused():
    from gbmw.specs.architectures import parse_architecture

    base = dict(family="gpt", name="m", num_layers=2, hidden_size=64, num_heads=4, seq_length=32, vocab_size=100,
                bias=False, norm="rms", gated_mlp=True, position_embedding="rotary")
    assert runtime_refusal(parse_architecture(base, "t"), "fp32") is None
    qwen_like = parse_architecture({**base, "qkv_bias": True}, "t")
    assert "`qkv_bias: true` with `bias: false`" in runtime_refusal(qwen_like, "fp32")
    windowed = parse_architecture({**base, "sliding_window": 16}, "t")
    assert "`sliding_window: 16` is shorter than seq_length 32" in runtime_refusal(windowed, "fp32")
    assert runtime_refusal(parse_architecture({**base, "sliding_window": 32}, "t"), "fp32") is None


def test_plan_for_the_runtime_warns_in_one_line(capsys):
    assert main(["plan", "t5-large-32_rtx-titan-x8", "--json"]) == 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("warning: `gbmw train` cannot run this plan: model t5-large-32: ")
    assert main(["plan", "t5-large-32_rtx-titan-x8", "--target", "megatron-core", "--json"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["plan", "llama-tiny_cpu-x4", "--json"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.torch
def test_train_refuses_with_the_sentence_plan_warned_of(tmp_path, capsys):
    pytest.importorskip("torch")
    plan = tmp_path / "plan.yaml"
    assert main(["plan", "vit-huge-32_rtx-titan-x8", "-o", str(plan)]) == 0
    warning = capsys.readouterr().err.strip().removeprefix("warning: `gbmw train` cannot run this plan: ")
    assert main(["train", "vit-huge-32_rtx-titan-x8", "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert warning in err and err.count("\n") == 1 and "Traceback" not in err
