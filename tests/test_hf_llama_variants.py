"""Hugging Face config.json import of Qwen3, Gemma and Phi-3 (gbmw.specs.hf_llama_variants) on real configs
(tests/hf_configs/, provenance in its README.md): parameter counts exact against transformers' own build of each
config, each difference from LLaMA costed as it runs, a one-line refusal for what gbmw cannot cost as the file says
(Gemma 2 among it), and a plan from the command line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gbmw.errors import GbmwError, SpecError
from gbmw.space.runtime_support import runtime_refusal
from gbmw.specs.hf_import import import_hf_config
from gbmw.specs.models import build_model, load_model

CONFIGS = Path(__file__).parent / "hf_configs"

TRANSFORMERS_PARAMETERS = {
    # sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters()) under transformers 5.24 on the
    # meta device (tied head counted once); test_counts_are_what_transformers_builds re-counts them where torch is.
    # Against the published sizes: Qwen3-0.6B and -14B's model cards (0.6B, 0.44B without the embeddings; 14.8B,
    # 13.2B without the embedding and head), Gemma 2B and 7B, named by their counts without the embeddings
    # (1,981,884,416 and 7,751,248,896 here), Phi-3-mini and Phi-3.5-mini (3.8B).
    "Qwen3-0.6B": 596_049_920,
    "Qwen3-14B": 14_768_307_200,
    "gemma-2b-it": 2_506_172_416,
    "gemma-7b-it": 8_537_680_896,
    "Phi-3-mini-4k-instruct": 3_821_079_552,
    "Phi-3.5-mini-instruct": 3_821_079_552,
}


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_PARAMETERS))
@pytest.mark.parametrize("seq_length", [None, 512])
def test_parameter_counts_are_exact(name, seq_length):
    model = load_model(CONFIGS / f"{name}.json", "bf16", seq_length)
    assert model.parameter_count == TRANSFORMERS_PARAMETERS[name]
    assert model.sequence_length == (seq_length or json.loads((CONFIGS / f"{name}.json").read_text())[
        "max_position_embeddings"])


def _build(config: dict):
    """transformers' model of a config.json (its `auto_map` names the checkpoint's own code, not read here), on the
    meta device."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**{key: value for key, value in config.items() if key != "auto_map"})
    with torch.device("meta"):
        return config, transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(TRANSFORMERS_PARAMETERS))
def test_counts_are_what_transformers_builds(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    _, built = _build(json.loads((CONFIGS / f"{name}.json").read_text()))
    counted = sum(parameter.numel() for parameter in built.parameters())
    assert counted == TRANSFORMERS_PARAMETERS[name]
    assert load_model(CONFIGS / f"{name}.json", "bf16", 2048).parameter_count == counted


@pytest.mark.torch
@pytest.mark.parametrize("name, changes", [
    ("Qwen3-0.6B", {"head_dim": None}),  # transformers' default 128, not hidden_size / heads (64)
    ("gemma-7b-it", {"head_dim": None}),  # 256, not 3072 / 16
    ("gemma-2b-it", {"tie_word_embeddings": False}),
    ("Phi-3-mini-4k-instruct", {"num_key_value_heads": 8, "head_dim": 64}),
])
def test_defaults_and_variations_count_what_transformers_builds(tmp_path, name, changes):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    config = {key: value for key, value in {**json.loads((CONFIGS / f"{name}.json").read_text()), **changes}.items()
              if value is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    _, built = _build(config)
    assert load_model(tmp_path / "config.json", "bf16", 2048).parameter_count == sum(
        parameter.numel() for parameter in built.parameters())


@pytest.mark.torch
def test_qwen3_windows_the_blocks_transformers_windows(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    config = {**json.loads((CONFIGS / "Qwen3-14B.json").read_text()), "use_sliding_window": True,
              "sliding_window": 4096, "max_window_layers": 30}
    (tmp_path / "config.json").write_text(json.dumps(config))
    transformers_config, _ = _build(config)
    arch = import_hf_config(tmp_path / "config.json", 8192)
    assert arch.sliding_window == 4096
    assert [arch.is_windowed_block(i) for i in range(arch.num_layers)] == [
        kind == "sliding_attention" for kind in transformers_config.layer_types]


def test_each_variant_as_its_modeling_code_builds_it():
    h, heads, kv, head_dim, ffn = 1024, 16, 8, 128, 3072  # Qwen3-0.6B
    qwen = build_model(import_hf_config(CONFIGS / "Qwen3-0.6B.json", 2048), "bf16")
    # q/k/v/o of head_dim 128 (16 heads on a hidden size of 1024), q_norm and k_norm, SwiGLU, two RMSNorms: the
    # 15,730,944 a torchinfo summary of the checkpoint prints per block (the README's provenance note)
    assert qwen.layers[1].parameter_count == h * (heads + 2 * kv) * head_dim + heads * head_dim * h + 2 * head_dim \
        + 3 * h * ffn + 2 * h == 15_730_944
    gemma_arch = import_hf_config(CONFIGS / "gemma-2b-it.json", 2048)
    assert (gemma_arch.gated_activation, gemma_arch.scaled_embeddings, gemma_arch.tie_embeddings) == (
        "gelu", True, True)
    gemma = build_model(gemma_arch, "bf16")
    h, heads, kv, head_dim, ffn = 2048, 8, 1, 256, 16384
    assert gemma.layers[1].parameter_count == h * (heads + 2 * kv) * head_dim + heads * head_dim * h + 3 * h * ffn \
        + 2 * h  # multi-query attention of head_dim 256, GeGLU, two RMSNorms; no biases
    head = gemma.layers[-1]
    assert gemma.layers[0].parameter_count == 256000 * h and head.tied_to == "embedding"
    assert head.parameter_count - head.tied_parameter_count == h  # the final norm beside the tied table
    phi = build_model(import_hf_config(CONFIGS / "Phi-3-mini-4k-instruct.json", 4096), "bf16")
    h, ffn = 3072, 8192
    assert phi.layers[1].parameter_count == 3 * h * h + h * h + 2 * h * ffn + ffn * h + 2 * h  # qkv_proj, o_proj,
    # gate_up_proj, down_proj, two RMSNorms: the same weights as separate q, k, v and gate, up


def test_gemma_scales_its_embeddings_in_one_more_pass_and_geglu_costs_as_swiglu():
    s, h, d = 2048, 2048, 2
    arch = import_hf_config(CONFIGS / "gemma-2b-it.json", s)
    scaled, plain = (build_model(arch.model_copy(update={"scaled_embeddings": flag}), "bf16").layers[0]
                     for flag in (True, False))
    traffic = "forward_memory_traffic_bytes_per_sample"
    assert getattr(scaled, traffic) - getattr(plain, traffic) == 2 * s * h * d
    assert scaled.model_copy(update={traffic: 0.0}) == plain.model_copy(update={traffic: 0.0})  # no parameters,
    # nothing kept for the backward
    swiglu = build_model(arch.model_copy(update={"gated_activation": "silu"}), "bf16")
    assert swiglu.layers[1:] == build_model(arch, "bf16").layers[1:]  # each gate keeps its input: the same blocks


def test_qwen3_norms_each_query_and_key_head():
    arch = import_hf_config(CONFIGS / "Qwen3-14B.json", 2048)
    assert (arch.qk_norm, arch.head_dim, arch.num_kv_heads) == ("head", 128, 8)
    without = build_model(arch.model_copy(update={"qk_norm": "none"}), "bf16").layers[1]
    assert build_model(arch, "bf16").layers[1].parameter_count - without.parameter_count == 2 * 128


def test_dropout_on_the_probabilities_alone_is_costed_so(tmp_path):
    config = {**json.loads((CONFIGS / "Phi-3-mini-4k-instruct.json").read_text()), "attention_dropout": 0.1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    arch = import_hf_config(tmp_path / "config.json", 1024)
    assert (arch.dropout, arch.attention_dropout) == (False, True)
    assert build_model(arch, "bf16").layers[0].intermediate_activation_bytes_per_sample == 0  # no embedding dropout


def _refusal(tmp_path: Path, base: str, changes: dict) -> str:
    config = {**json.loads((CONFIGS / f"{base}.json").read_text()), **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({key: value for key, value in config.items() if value is not None}))
    with pytest.raises(SpecError) as raised:
        import_hf_config(path, 1024)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


@pytest.mark.parametrize("base, changes, expected", [
    ("Qwen3-0.6B", {"attention_bias": True}, "field `attention_bias`: value True — Qwen3 puts biases on q, k, v and "
                                             "the output projection but never on the MLP"),
    ("gemma-2b-it", {"attention_bias": True}, "field `attention_bias`: value True — Gemma puts biases"),
    ("gemma-2b-it", {"hidden_act": "relu"}, "field `hidden_act`: value 'relu' — gbmw costs a gated MLP with a GELU or "
                                            "SiLU gate"),
    ("gemma-7b-it", {"hidden_activation": "silu"}, "fields `hidden_act` 'gelu' and `hidden_activation` 'silu' — "
                                                   "transformers 5 runs hidden_act and earlier releases"),
    ("Phi-3-mini-4k-instruct", {"resid_pdrop": 0.1}, "field `resid_pdrop`: value 0.1 — gbmw's dropout on the hidden "
                                                     "states comes with one on the embeddings"),
    ("Phi-3-mini-4k-instruct", {"attention_dropout": 1.0}, "field `attention_dropout`: value 1.0 — a dropout "
                                                           "probability"),
    ("Qwen3-14B", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": -1},
     "field `max_window_layers`: value -1"),
    ("Qwen3-14B", {"head_dim": 0}, "field `head_dim`"),
    ("gemma-2b-it", {"num_hidden_layers": None}, "field `num_hidden_layers` is required for model_type 'gemma'"),
    ("Phi-3-mini-4k-instruct", {"num_key_value_heads": 5}, "num_heads 32 is not a multiple of num_kv_heads 5"),
])
def test_what_gbmw_cannot_cost_as_the_file_says_is_refused_in_one_line(tmp_path, base, changes, expected):
    assert expected in _refusal(tmp_path, base, changes)


def test_gemma_2_is_refused_by_its_model_type():
    """Gemma 2's four norms per block and soft-capped scores and logits are no layout of gbmw's: the real
    gemma-2-2b config.json is refused in one line, naming the key."""
    with pytest.raises(SpecError) as raised:
        import_hf_config(CONFIGS / "gemma-2-2b.json", 4096)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{CONFIGS / 'gemma-2-2b.json'}: field `model_type`: value 'gemma2' — Gemma 2 norms each "
                              "sub-block's output as well as its input")
    assert "`attn_logit_softcapping`" in message and "`final_logit_softcapping`" in message


def test_an_unknown_model_type_lists_the_new_ones(tmp_path):
    assert "qwen2, qwen3, gemma, phi3, bloom" in _refusal(tmp_path, "gemma-2b-it", {"model_type": "gemma3_text"})


def test_phi_3_5_notes_its_longrope_and_window_longer_than_the_sequence():
    notes: list[str] = []
    arch = import_hf_config(CONFIGS / "Phi-3.5-mini-instruct.json", 8192, True, notes)
    assert arch.rope_scaling == "longrope" and not any(arch.is_windowed_block(i) and arch.attended_tokens(i) < 8192
                                                       for i in range(arch.num_layers))
    assert any("rope_scaling longrope: costed as plain rotary" in note for note in notes)
    phi3 = import_hf_config(CONFIGS / "Phi-3-mini-4k-instruct.json", 4096, True)
    assert {phi3.attended_tokens(i) for i in range(phi3.num_layers)} == {2047}  # every block windowed


@pytest.mark.parametrize("name, field", [("gemma-2b-it", "`gated_activation: gelu`"),
                                         ("Qwen3-0.6B", "`qk_norm: head`")])
def test_gbmw_runtime_refuses_what_it_does_not_build(name, field):
    refusal = runtime_refusal(import_hf_config(CONFIGS / f"{name}.json", 1024), "bf16")
    assert refusal is not None and field in refusal
    assert runtime_refusal(import_hf_config(CONFIGS / "gemma-2b-it.json", 1024).model_copy(
        update={"gated_activation": "silu"}), "bf16").count("`scaled_embeddings: true`") == 1


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gbmw.cli.main", *args], capture_output=True, text=True, timeout=300)


def _job(tmp_path: Path, name: str) -> Path:
    shutil.copy(CONFIGS / f"{name}.json", tmp_path / "config.json")
    job = tmp_path / "job.yaml"
    job.write_text("model: config.json\ncluster: a100-80g-x32\nprecision: bf16\nglobal_batch: 256\nseq_length: 1024\n")
    return job


def test_gbmw_plan_plans_gemma_for_deepspeed_and_warns_for_the_runtime(tmp_path):
    job = _job(tmp_path, "gemma-2b-it")
    result = run("plan", str(job), "--target", "deepspeed", "--approximate")
    assert result.returncode == 0, result.stderr
    assert "samples/s" in result.stdout and "Traceback" not in result.stderr
    assert "(2.51B parameters" in result.stdout
    result = run("plan", str(job), "--approximate")
    assert result.returncode == 0, result.stderr
    assert "warning: `gbmw train` cannot run this plan" in result.stderr and "`gated_activation: gelu`" in result.stderr


def test_megatron_arguments_carry_qwen3_and_refuse_gemma(tmp_path):
    from gbmw import uniform_plan
    from gbmw.adapters.megatron import plan_to_megatron_args
    from gbmw.specs.jobs import load_job

    job = load_job(_job(tmp_path, "Qwen3-0.6B"))  # head_dim 128 on 16 heads of a hidden size of 1024
    arguments = plan_to_megatron_args(uniform_plan(job, "tp=1,pp=1,zero=1,ckpt=full,micro=1,batch=256"), job,
                                      "megatron-core")
    assert "--qk-layernorm" in arguments and "--kv-channels 128" in " ".join(arguments)
    job = load_job(_job(tmp_path, "gemma-2b-it"))
    plan = uniform_plan(job, "tp=1,pp=1,zero=1,ckpt=full,micro=1,batch=256")
    for target in ("megatron-core", "megatron-deepspeed"):
        with pytest.raises(GbmwError, match=r"cannot express `gated_activation: gelu` \(BLOOM, OPT and Falcon's "
                                            r"layouts, and Gemma's GeGLU and scaled embeddings, have no Megatron"):
            plan_to_megatron_args(plan, job, target)


def test_a_recipe_with_a_gelu_gate_and_no_gated_mlp_is_one_line():
    from gbmw.specs.architectures import parse_architecture

    recipe = dict(family="gpt", name="tiny", num_layers=2, hidden_size=64, num_heads=4, seq_length=16, vocab_size=100,
                  gated_activation="gelu")
    with pytest.raises(SpecError) as raised:
        parse_architecture(recipe, "tiny.yaml")
    assert "gated_activation 'gelu' without gated_mlp" in str(raised.value) and "\n" not in str(raised.value)
    assert parse_architecture({**recipe, "gated_mlp": True}, "tiny.yaml").gated_activation == "gelu"
