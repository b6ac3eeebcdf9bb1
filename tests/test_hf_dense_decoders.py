"""Hugging Face config.json import of the dense decoders BLOOM, OPT and Falcon (gbmw.specs.hf_dense_decoders) on real
configs (tests/hf_configs/, provenance in its README.md): parameter counts exact against transformers' own build of
each config, the layouts costed as they run, a one-line refusal for what gbmw cannot cost as the file says, and a
plan from the command line."""

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
    # bigscience/bloom-560m's model card: "559,214,592 parameters".
    "bloom-560m": 559_214_592,
    "opt-125m": 125_239_296,
    "opt-1.3b": 1_315_758_080,
    "opt-66b": 65_719_701_504,
    "falcon-7b": 6_921_720_704,  # the first config (model_type RefinedWebModel)
    "falcon-7b-instruct": 6_921_720_704,  # the same model in model_type falcon
    "falcon-40b-instruct": 41_303_293_952,
}


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_PARAMETERS))
@pytest.mark.parametrize("seq_length", [None, 512])
def test_parameter_counts_are_exact(name, seq_length):
    model = load_model(CONFIGS / f"{name}.json", "bf16", seq_length)
    assert model.parameter_count == TRANSFORMERS_PARAMETERS[name]
    assert model.sequence_length == (seq_length or 2048)


def _transformers_config(config: dict):
    """transformers' config of a config.json; the first Falcon configs are named as transformers' Falcon names them
    (model_type falcon; RefinedWeb is the new decoder architecture, its n_head_kv the key/value heads)."""
    import transformers

    config = {key: value for key, value in config.items() if key != "auto_map"}
    if config["model_type"] in ("RefinedWeb", "RefinedWebModel"):
        config.update(new_decoder_architecture=config["model_type"] == "RefinedWeb", model_type="falcon",
                      num_hidden_layers=config.pop("n_layer"), num_attention_heads=config.pop("n_head"))
        if "n_head_kv" in config:
            config["num_kv_heads"] = config.pop("n_head_kv")
    return transformers.AutoConfig.for_model(**config)


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(TRANSFORMERS_PARAMETERS))
def test_counts_are_what_transformers_builds(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(
            _transformers_config(json.loads((CONFIGS / f"{name}.json").read_text())))
    counted = sum(parameter.numel() for parameter in built.parameters())
    assert counted == TRANSFORMERS_PARAMETERS[name]
    assert load_model(CONFIGS / f"{name}.json", "bf16", 2048).parameter_count == counted


def test_each_layout_as_its_modeling_code_builds_it():
    bloom = build_model(import_hf_config(CONFIGS / "bloom-560m.json", 2048), "bf16")
    h, vocab = 1024, 250880
    assert bloom.layers[0].parameter_count == vocab * h + 2 * h  # word embeddings and their LayerNorm, no positions
    assert bloom.layers[1].parameter_count == (3 * h * h + 3 * h) + (h * h + h) + 2 * (4 * h * h) + 4 * h + h + 4 * h
    opt = import_hf_config(CONFIGS / "opt-125m.json", 1024)
    assert (opt.mlp_activation, opt.position_offset, opt.dropout, opt.attention_dropout) == ("relu", 2, True, False)
    assert build_model(opt, "bf16").layers[0].parameter_count == (50272 + 2048 + 2) * 768
    seven, old_seven = (import_hf_config(CONFIGS / f"{name}.json", 2048) for name in ("falcon-7b-instruct", "falcon-7b"))
    assert (seven.num_kv_heads, seven.parallel_attention_norms, seven.position_embedding) == (1, 1, "rotary")
    assert build_model(seven, "bf16").layers == build_model(old_seven, "bf16").layers
    forty = import_hf_config(CONFIGS / "falcon-40b-instruct.json", 2048)
    assert (forty.num_kv_heads, forty.parallel_attention_norms) == (8, 2)
    h, head_dim = 8192, 64
    assert build_model(forty, "bf16").layers[1].parameter_count == h * (128 + 2 * 8) * head_dim + h * h \
        + 2 * 4 * h * h + 2 * 2 * h  # grouped QKV, dense, the MLP, ln_attn and ln_mlp; no biases


def _block(name: str, seq: int = 2048, **update):
    arch = import_hf_config(CONFIGS / f"{name}.json", seq).model_copy(update=update)
    return build_model(arch, "bf16").layers[1]


def test_side_by_side_blocks_keep_one_residual_sum_and_norm_fewer():
    """Attention and MLP on one shared norm (Falcon-7B) keep neither the attention's residual sum nor a second norm's
    output and statistics; on two norms (Falcon-40B) a second norm output and its statistics but no sum."""
    s, h, d = 2048, 4544, 2
    sequential, shared = _block("falcon-7b", parallel_attention_norms=0), _block("falcon-7b")
    assert sequential.parameter_count - shared.parameter_count == 2 * h  # the MLP's own LayerNorm
    kept = sequential.intermediate_activation_bytes_per_sample - shared.intermediate_activation_bytes_per_sample
    assert kept == s * h * d * 2 + s * 8  # the residual sum, the MLP norm's output, its fp32 mean and 1/std
    assert sequential.forward_flops_per_sample == shared.forward_flops_per_sample
    two = _block("falcon-7b", parallel_attention_norms=2)
    assert two.intermediate_activation_bytes_per_sample - shared.intermediate_activation_bytes_per_sample == \
        s * h * d + s * 8


def test_relu_keeps_one_ffn_wide_tensor_and_opt_drops_no_attention_probabilities():
    s, ffn, heads, d = 1024, 3072, 12, 2
    relu, gelu = _block("opt-125m", s), _block("opt-125m", s, mlp_activation="gelu")
    assert gelu.intermediate_tp_split_activation_bytes_per_sample - relu.intermediate_tp_split_activation_bytes_per_sample \
        == s * ffn * d  # GELU keeps its input beside the output FC2 keeps; ReLU keeps only that output
    dropped = _block("opt-125m", s, attention_dropout=None)  # the probabilities dropped too, as `dropout` says
    assert dropped.intermediate_tp_split_activation_bytes_per_sample - relu.intermediate_tp_split_activation_bytes_per_sample \
        == heads * s * s * (1 + d)  # each score's mask byte and its dropped copy


def test_alibi_sets_no_maximum_and_learned_positions_do():
    assert import_hf_config(CONFIGS / "bloom-560m.json", 8192).seq_length == 8192
    with pytest.raises(SpecError, match=r"field `max_position_embeddings`: value 2048 — the model takes at most 2048"):
        import_hf_config(CONFIGS / "opt-125m.json", 4096)


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
    ("opt-125m", {"do_layer_norm_before": False}, "field `do_layer_norm_before`: value False — post-norm blocks"),
    ("opt-125m", {"word_embed_proj_dim": 512}, "field `word_embed_proj_dim`: value 512 — embeddings narrower"),
    ("opt-125m", {"activation_function": "silu"}, "field `activation_function`: value 'silu' — gbmw costs a dense "
                                                  "MLP with gelu or relu"),
    ("opt-125m", {"layerdrop": 0.1}, "field `layerdrop`: value 0.1 — gbmw does not model"),
    ("opt-125m", {"dropout": 1.5}, "field `dropout`: value 1.5 — a dropout probability"),
    ("opt-125m", {"_remove_final_layer_norm": True}, "field `_remove_final_layer_norm`: value True"),
    ("opt-125m", {"enable_bias": "yes"}, "field `enable_bias`: value 'yes' — must be true or false"),
    ("opt-125m", {"ffn_dim": None}, "field `ffn_dim` is required for model_type 'opt'"),
    ("bloom-560m", {"apply_residual_connection_post_layernorm": True},
     "field `apply_residual_connection_post_layernorm`: value True"),
    ("bloom-560m", {"n_inner": 8192}, "field `n_inner`: value 8192 — transformers' BLOOM builds an MLP of 4 × "),
    ("bloom-560m", {"num_attention_heads": 32}, "fields `n_head` 16 and `num_attention_heads` 32 — two names of one "
                                                "setting"),
    ("bloom-560m", {"n_layer": 0}, "field `n_layer`: value 0 — must be at least 1"),
    ("falcon-40b-instruct", {"parallel_attn": False}, "field `parallel_attn`: value False — with "
                                                      "new_decoder_architecture"),
    ("falcon-40b-instruct", {"num_ln_in_parallel_attn": 3}, "field `num_ln_in_parallel_attn`: value 3"),
    ("falcon-7b-instruct", {"num_ln_in_parallel_attn": 2}, "field `num_ln_in_parallel_attn`: value 2 — without "
                                                           "new_decoder_architecture"),
    ("falcon-7b-instruct", {"multi_query": False, "num_kv_heads": 1}, "field `num_kv_heads`: value 1 — grouped "
                                                                      "key/value heads need new_decoder_architecture"),
    ("falcon-7b-instruct", {"alibi": "yes"}, "field `alibi`: value 'yes' — must be true or false"),
    ("falcon-7b-instruct", {"activation": "gelu_new"}, "field `activation`: value 'gelu_new'"),
    ("falcon-7b", {"multi_query": None}, "field `multi_query` is required for model_type 'RefinedWebModel'"),
    ("falcon-7b", {"n_head": 70}, "hidden size 4544 is not divisible by 70 attention heads"),
])
def test_what_gbmw_cannot_cost_as_the_file_says_is_refused_in_one_line(tmp_path, base, changes, expected):
    assert expected in _refusal(tmp_path, base, changes)


def test_opt_350m_is_refused_for_its_narrower_embeddings():
    with pytest.raises(SpecError, match=r"opt-350m.json: field `word_embed_proj_dim`: value 512 — embeddings "
                                        r"narrower than hidden_size 1024 \(OPT-350m's project_in/project_out\)"):
        import_hf_config(CONFIGS / "opt-350m.json", 2048)


@pytest.mark.parametrize("name, field", [("bloom-560m", "`position_embedding: alibi`"),
                                         ("opt-125m", "`position_offset: 2`"),
                                         ("falcon-7b", "`parallel_attention_norms: 1`")])
def test_gbmw_runtime_and_megatron_refuse_the_layouts_they_do_not_build(tmp_path, name, field):
    arch = import_hf_config(CONFIGS / f"{name}.json", 1024)
    assert field in runtime_refusal(arch, "bf16") and "--target deepspeed" in runtime_refusal(arch, "bf16")
    for update in ({"position_embedding": "rotary"}, {"embedding_norm": True}, {"mlp_activation": "relu"},
                   {"parallel_attention_norms": 2}, {"attention_dropout": True}):
        llama = import_hf_config(CONFIGS / "Llama-2-7b-hf.json", 1024)
        assert (runtime_refusal(llama.model_copy(update=update), "bf16") is None) == (update == {
            "position_embedding": "rotary"})


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gbmw.cli.main", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", ["bloom-560m", "opt-125m", "falcon-7b"])
def test_gbmw_plan_plans_each_for_deepspeed_and_warns_for_the_runtime(tmp_path, name):
    shutil.copy(CONFIGS / f"{name}.json", tmp_path / "config.json")
    job = tmp_path / "job.yaml"
    job.write_text("model: config.json\ncluster: a100-80g-x32\nprecision: bf16\nglobal_batch: 256\nseq_length: 1024\n")
    result = run("plan", str(job), "--target", "deepspeed", "--approximate")
    assert result.returncode == 0, result.stderr
    assert "samples/s" in result.stdout and "Traceback" not in result.stderr
    result = run("plan", str(job), "--approximate")
    assert result.returncode == 0, result.stderr
    assert "warning: `gbmw train` cannot run this plan" in result.stderr


def test_megatron_arguments_refuse_bloom(tmp_path):
    from gbmw import uniform_plan
    from gbmw.adapters.megatron import plan_to_megatron_args
    from gbmw.specs.jobs import load_job

    shutil.copy(CONFIGS / "bloom-560m.json", tmp_path / "config.json")
    (tmp_path / "job.yaml").write_text("model: config.json\ncluster: a100-80g-x32\nprecision: bf16\nseq_length: 2048\n")
    job = load_job(tmp_path / "job.yaml")
    plan = uniform_plan(job, "tp=1,pp=1,zero=1,ckpt=full,micro=1,batch=256")
    for target in ("megatron-core", "megatron-deepspeed"):
        with pytest.raises(GbmwError, match=r"cannot express `position_embedding: alibi` \(BLOOM, OPT and Falcon"):
            plan_to_megatron_args(plan, job, target)


def test_the_first_falcon_40b_format_reads_as_the_new_one(tmp_path):
    """Falcon-40B's first config (model_type RefinedWeb: `n_layer`, `n_head`, `n_head_kv`, the new decoder
    architecture implied) — here falcon-40b-instruct.json renamed so, no verbatim copy having been found — builds the
    same blocks as the model_type falcon file; without `n_head_kv` it is refused."""
    config = json.loads((CONFIGS / "falcon-40b-instruct.json").read_text())
    for key in ("new_decoder_architecture", "multi_query", "num_kv_heads"):
        config.pop(key)
    config.update(model_type="RefinedWeb", n_layer=config.pop("num_hidden_layers"),
                  n_head=config.pop("num_attention_heads"), n_head_kv=8)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model(tmp_path / "config.json", "bf16", 2048).layers == \
        load_model(CONFIGS / "falcon-40b-instruct.json", "bf16", 2048).layers
    assert "field `n_head_kv` is required for model_type 'RefinedWeb'" in _refusal(tmp_path, "falcon-40b-instruct", {
        "model_type": "RefinedWeb", "n_layer": 60, "n_head": 128})


@pytest.mark.parametrize("changes, expected", [
    ({"mlp_activation": "relu", "gated_mlp": True}, "mlp_activation 'relu' with gated_mlp"),
    ({"position_offset": 2, "position_embedding": "alibi"}, "position_offset 2 without a learned position table"),
    ({"parallel_attention_norms": 1, "moe": {"num_experts": 4, "top_k": 1, "expert_ffn_hidden_size": 32}},
     "parallel_attention_norms 1 with moe or latent_attention"),
    ({"parallel_attention_norms": 3}, "field `parallel_attention_norms`: value 3"),
])
def test_a_model_recipe_with_a_layout_gbmw_cannot_cost_is_one_line(changes, expected):
    from gbmw.specs.architectures import parse_architecture

    recipe = dict(family="gpt", name="tiny", num_layers=2, hidden_size=64, num_heads=4, seq_length=16,
                  vocab_size=100, **changes)
    with pytest.raises(SpecError) as raised:
        parse_architecture(recipe, "tiny.yaml")
    assert expected in str(raised.value) and "\n" not in str(raised.value)
