"""Hugging Face config.json import on the real configs of today's models (tests/hf_configs/, copied from the
models' Hugging Face pages): the true parameter count at the sequence length the user asks for, or a refusal
with the real reason."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gbmw.errors import GbmwError, SpecError
from gbmw.specs.hf_import import import_hf_config
from gbmw.specs.jobs import load_job
from gbmw.specs.models import load_model

CONFIGS = Path(__file__).parent / "hf_configs"

PUBLISHED_PARAMETERS = {
    # The parameter count of each checkpoint (the sum over its safetensors / the model card).
    "gpt2-xl": 1_557_611_200,
    "t5-large": 737_668_096,
    "Llama-2-7b-hf": 6_738_415_616,
    "Meta-Llama-3-8B": 8_030_261_248,
    "Mistral-7B-v0.1": 7_241_732_096,
    "Mistral-Nemo-Base-2407": 12_247_782_400,  # 32 heads × head_dim 128 = 4096 ≠ hidden 5120
    "Qwen2-7B": 7_615_616_512,  # q/k/v biases
}
EXACT = set(PUBLISHED_PARAMETERS)
"""Every dense model above is counted exactly (the target is ±0.5 %)."""


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
@pytest.mark.parametrize("seq_length", [None, 512])
def test_parameter_count_is_the_published_one_at_any_sequence_length(name, seq_length):
    notes: list[str] = []
    model = load_model(CONFIGS / f"{name}.json", "bf16", seq_length, notes=notes)
    published = PUBLISHED_PARAMETERS[name]
    if name in EXACT:
        assert model.parameter_count == published
    assert model.parameter_count == pytest.approx(published, rel=0.005)
    if seq_length is not None:
        assert model.sequence_length == seq_length
        assert not any("tokens per sample" in note for note in notes)
    else:
        assert any("tokens per sample, the config's" in note for note in notes)


@pytest.mark.parametrize("name, field, value", [
    ("Mixtral-8x7B-v0.1", "num_local_experts", "8"),
    ("mixtral-7b-8expert", "num_experts", "8"),  # model_type mistral: MoE all the same
])
def test_mixture_of_experts_is_refused_for_that_reason(name, field, value):
    with pytest.raises(SpecError, match=rf"field `{field}`: value {value} — a mixture-of-experts model"):
        import_hf_config(CONFIGS / f"{name}.json", 4096)


def test_mixtral_type_without_expert_fields_is_still_moe(tmp_path):
    config = json.loads((CONFIGS / "Mixtral-8x7B-v0.1.json").read_text())
    del config["num_local_experts"], config["num_experts_per_tok"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(SpecError, match=r"`model_type`: value 'mixtral' — a mixture-of-experts architecture"):
        import_hf_config(path)


def test_default_sequence_length_is_the_maximum_with_a_note():
    notes: list[str] = []
    arch = import_hf_config(CONFIGS / "Mistral-Nemo-Base-2407.json", notes=notes)
    assert arch.seq_length == 1024000
    assert any("1024000 tokens per sample, the config's `max_position_embeddings`" in note for note in notes)
    assert any("attention costed as standard" in note for note in notes)


def test_sequence_longer_than_the_model_takes_is_refused():
    with pytest.raises(SpecError, match=r"Llama-2-7b-hf.json: field `max_position_embeddings`: value 4096 — the "
                                        r"model takes at most 4096 tokens per sample, but a sequence length of 8192"):
        import_hf_config(CONFIGS / "Llama-2-7b-hf.json", 8192)
    with pytest.raises(SpecError, match=r"field `n_positions`: value 1024"):
        import_hf_config(CONFIGS / "gpt2-xl.json", 2048)


def test_head_dim_sets_the_attention_width():
    arch = import_hf_config(CONFIGS / "Mistral-Nemo-Base-2407.json", 4096)
    assert arch.attention_head_dim == 128 and arch.num_heads * arch.attention_head_dim == 4096
    model = load_model(CONFIGS / "Mistral-Nemo-Base-2407.json", "bf16", 4096)
    block = model.layers[1]
    h, attention, kv = 5120, 4096, 1024
    assert block.parameter_count == h * attention * 2 + h * kv * 2 + 3 * h * 14336 + 2 * h


def test_qwen2_has_qkv_biases_only():
    arch = import_hf_config(CONFIGS / "Qwen2-7B.json", 4096)
    assert arch.bias is False and arch.qkv_bias is True
    assert arch.sliding_window is None  # use_sliding_window false


def test_sliding_window_changes_flops_only_with_flash_attention_beyond_the_window():
    path = CONFIGS / "Mistral-7B-v0.1.json"

    def block_flops(seq: int, flash: bool) -> float:
        return load_model(path, "bf16", seq, flash).layers[1].forward_flops_per_sample

    def square_flops(seq: int) -> float:  # the same model with no window: the full score matrix
        notes: list[str] = []
        arch = import_hf_config(path, seq, True, notes).model_copy(update={"sliding_window": None})
        from gbmw.specs.models import build_model
        return build_model(arch, "bf16").layers[1].forward_flops_per_sample

    assert block_flops(4096, True) == square_flops(4096)  # within the window: nothing skipped
    assert block_flops(8192, False) == square_flops(8192)  # standard attention computes and masks every score
    assert block_flops(8192, True) < square_flops(8192)
    saved = square_flops(8192) - block_flops(8192, True)
    assert saved == 4 * 8192 * (8192 - 4096) * 4096  # QK^T and scores × V over the keys outside the window
    notes: list[str] = []
    import_hf_config(path, 8192, False, notes)
    assert any("sliding window 4096 < 8192 tokens: standard attention computes every score" in n for n in notes)


def test_flash_attention_stores_no_scores():
    standard = load_model(CONFIGS / "Llama-2-7b-hf.json", "bf16", 4096, False)
    flash = load_model(CONFIGS / "Llama-2-7b-hf.json", "bf16", 4096, True)
    assert flash.architecture.attention == "flash"
    scores = 32 * 4096 * 4096 * 2  # heads × s² × 2 bytes (no dropout)
    saved = standard.layers[1].stashed_activation_bytes_per_sample - \
        flash.layers[1].stashed_activation_bytes_per_sample
    assert saved == scores - 32 * 4096 * 4  # flash keeps one fp32 log-sum-exp per row


def test_job_fields_and_overrides(tmp_path):
    shutil.copy(CONFIGS / "Qwen2-7B.json", tmp_path / "config.json")
    job_path = tmp_path / "job.yaml"
    job_path.write_text("model: config.json\ncluster: a100-80g-x32\nprecision: bf16\nseq_length: 2048\n"
                        "flash_attention: true\n")
    job = load_job(job_path)
    assert job.model.sequence_length == 2048 and job.model.architecture.attention == "flash"
    assert job.notes == ()
    job = load_job(job_path, seq_length=8192, flash_attention=False)
    assert job.model.sequence_length == 8192 and job.model.architecture.attention == "standard"


def test_sequence_length_on_an_image_model_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "vit", "num_hidden_layers": 2, "hidden_size": 64,
                                "num_attention_heads": 4, "intermediate_size": 128, "image_size": 32,
                                "patch_size": 16}))
    with pytest.raises(SpecError, match="vit model's tokens are its image patches"):
        import_hf_config(path, 128)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gbmw.cli.main", *args], capture_output=True, text=True, timeout=300)


def test_cli_seq_length_and_flash_attention(tmp_path):
    shutil.copy(CONFIGS / "Mistral-Nemo-Base-2407.json", tmp_path / "config.json")
    job = tmp_path / "job.yaml"
    job.write_text("model: config.json\ncluster: h100-80g-x64\nprecision: bf16\nglobal_batch: 256\n")
    result = run("estimate", str(job), "--uniform", "tp=8,pp=1,zero=1,ckpt=full,micro=1", "--seq-length", "4096",
                 "--flash-attention", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)
    assert "tokens per sample" not in result.stderr and "attention costed" not in result.stderr
    result = run("estimate", str(job), "--uniform", "tp=8,pp=1,zero=1,ckpt=full,micro=1", "--json")
    assert result.returncode == 0, result.stderr
    assert "note: " in result.stderr and "1024000 tokens per sample" in result.stderr
    result = run("plan", str(job), "--seq-length", "2000000")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "field `max_position_embeddings`: value 1024000" in result.stderr


def _hf_job(tmp_path: Path, name: str, seq_length: int):
    shutil.copy(CONFIGS / f"{name}.json", tmp_path / "config.json")
    job_path = tmp_path / "job.yaml"
    job_path.write_text(f"model: config.json\ncluster: a100-80g-x32\nprecision: bf16\nseq_length: {seq_length}\n")
    return load_job(job_path)


@pytest.mark.parametrize("target", ["megatron-core", "megatron-deepspeed"])
def test_megatron_arguments_say_what_the_hf_config_says(tmp_path, target):
    import dataclasses

    from gbmw import uniform_plan
    from gbmw.adapters.megatron import megatron_args_to_plan, plan_target, plan_to_megatron_args

    def arguments(name: str, seq_length: int = 4096, tp: int = 4) -> tuple[list[str], object, object]:
        folder = tmp_path / f"{name}-{seq_length}"
        folder.mkdir()
        job = _hf_job(folder, name, seq_length)
        plan = uniform_plan(job, f"tp={tp},pp=1,zero=1,ckpt=full,micro=1,batch=256")
        return plan_to_megatron_args(plan, job, target), plan, job

    def value(args: list[str], flag: str) -> str | None:
        return args[args.index(flag) + 1] if flag in args else None

    args, plan, job = arguments("Mistral-Nemo-Base-2407")
    assert value(args, "--kv-channels") == "128"  # 32 heads × 128 on a hidden size of 5120
    again = megatron_args_to_plan(args, job, target)
    assert again == dataclasses.replace(plan, estimate=None, target=plan_target(target))
    args, _, _ = arguments("Meta-Llama-3-8B")
    flag = "--rotary-base" if target == "megatron-core" else "--rotary-position-embeddings-theta"
    assert value(args, flag) == "500000" and "--kv-channels" not in args
    if target == "megatron-core":
        args, _, _ = arguments("Qwen2-7B")
        assert "--add-qkv-bias" in args and "--disable-bias-linear" in args
    else:
        with pytest.raises(GbmwError, match="Megatron-DeepSpeed has no flag for biases on q/k/v alone"):
            arguments("Qwen2-7B")
    with pytest.raises(GbmwError, match=r"sliding-window attention \(4096 tokens\) at a sequence of 8192"):
        arguments("Mistral-7B-v0.1", 8192)
    args, _, _ = arguments("gpt2-xl", 512, tp=1)  # 25 heads
    assert value(args, "--seq-length") == "512" and value(args, "--max-position-embeddings") == "1024"


@pytest.mark.torch
def test_profile_model_at_the_sequence_length_asked(tmp_path):
    from gbmw.cli.main import main

    output = tmp_path / "profile.yaml"
    assert main(["profile", "model", "gpt-tiny", "--seq-length", "16", "--repeats", "1", "--min-seconds", "0",
                 "-o", str(output)]) == 0
    assert "sequence_length: 16\n" in output.read_text()
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {output}\ncluster: cpu-x4\nprecision: fp32\nglobal_batch: 16\nseq_length: 32\n")
    with pytest.raises(SpecError, match="measured at that length, not the 32 asked for"):
        load_job(job)


def test_qwen2_sliding_window_only_where_its_blocks_use_it(tmp_path):
    config = json.loads((CONFIGS / "Qwen2-7B.json").read_text())
    path = tmp_path / "config.json"
    for use, first, expected in ((True, 28, None), (True, 0, 131072), (False, 0, None)):
        path.write_text(json.dumps({**config, "use_sliding_window": use, "max_window_layers": first}))
        assert import_hf_config(path, 4096).sliding_window == expected
    path.write_text(json.dumps({**config, "use_sliding_window": True, "max_window_layers": 20}))
    with pytest.raises(SpecError, match=r"`sliding_window`: value 131072 — 8 of 28 blocks attend through the window"):
        import_hf_config(path, 4096)


@pytest.mark.parametrize("changes, expected", [
    ({"num_hidden_layers": -3}, "field `num_hidden_layers`: value -3 — must be at least 1"),
    ({"intermediate_size": 10**15}, "field `intermediate_size`: value 1000000000000000 — must be at most 1048576"),
    ({"num_attention_heads": 7}, "config.json: hidden size 4096 is not divisible by 7 attention heads"),
])
def test_an_error_names_the_key_the_config_json_has(tmp_path, changes, expected):
    """gbmw reads `num_hidden_layers` as its `num_layers`, `intermediate_size` as `ffn_hidden_size`: the error names
    what the user can find in the file, and a check of the whole mapping is not pinned on a made-up field."""
    config = json.loads((CONFIGS / "Llama-2-7b-hf.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **changes}))
    with pytest.raises(SpecError) as raised:
        import_hf_config(tmp_path / "config.json", seq_length=1024)
    assert str(raised.value).endswith(expected), str(raised.value)
