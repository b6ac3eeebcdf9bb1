"""GPT-OSS (model_type gpt_oss, issue 26): its config.json read into gbmw's architecture — exact parameter counts
against the published ones, each block's own attended keys (windowed and full blocks alternate), attention sinks and
biases counted by exact arithmetic, and the keys and targets that refuse what gbmw does not model, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gbmw.errors import GbmwError, SpecError
from gbmw.specs.hf_import import import_hf_config
from gbmw.specs.models import build_model, load_model
from test_hf_import import _refusal as refusal_of

CONFIGS = Path(__file__).parent / "hf_configs"

EXACT = {
    # name: (total, active per token in gbmw's count: the whole embedding table, attention with its biases and
    # sinks, norms, the router with its bias, 4 of the experts with theirs, the untied head), counted module by module
    # from transformers' modeling_gpt_oss.py: per block q/k/v/o (2880·4096·2 + 2880·512·2 weights, 4096 + 512·2 + 2880
    # biases), 64 sinks, 2 RMSNorms of 2880, a router of 2880·E + E, E experts of 2880·5760 + 5760 (gate_up with bias)
    # and 2880·2880 + 2880 (down with bias); embedding and head 201088·2880 each; a final norm of 2880.
    "gpt-oss-20b": (20_914_757_184, 4_187_440_704),
    "gpt-oss-120b": (116_829_156_672, 5_711_982_912),
}
PUBLISHED = [
    # OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv 2508.10925): "two MoE reasoning models (116.8B and
    # 20.9B)"; the Hugging Face model cards: "gpt-oss-120b ... (117B parameters with 5.1B active parameters)",
    # "gpt-oss-20b ... (21B parameters with 3.6B active parameters)". OpenAI's active count leaves out the embedding
    # table (a token reads one row of it), which gbmw's active count includes.
    ("gpt-oss-120b", 116.8, 5.1),
    ("gpt-oss-20b", 20.9, 3.6),
]
EMBEDDING = 201_088 * 2_880


@pytest.mark.parametrize("name", sorted(EXACT))
def test_parameter_counts_are_exact(name):
    model = load_model(CONFIGS / f"{name}.json", "bf16", 4096, True)
    assert (model.parameter_count, model.active_parameter_count) == EXACT[name]


@pytest.mark.parametrize("name, total, active", PUBLISHED)
def test_parameter_counts_are_the_published_ones(name, total, active):
    model = load_model(CONFIGS / f"{name}.json", "bf16", 4096, True)
    assert round(model.parameter_count / 1e9, 1) == total
    assert round((model.active_parameter_count - EMBEDDING) / 1e9, 1) == active


def test_windowed_and_full_blocks_alternate_each_with_its_own_keys():
    """Even blocks attend through the 128-token window, odd ones to the whole sequence (`layer_types`); with flash
    attention a windowed block computes 4·s·128·(heads·head_dim) score FLOPs instead of 4·s·s·(heads·head_dim)."""
    arch = import_hf_config(CONFIGS / "gpt-oss-120b.json", 4096, True)
    assert arch.sliding_window == 128 and arch.full_attention_blocks == tuple(range(1, 36, 2))
    assert arch.attention_sinks and arch.moe.router_bias and arch.bias and arch.attention_head_dim == 64
    blocks = build_model(arch, "bf16").layers[1:-1]
    windowed, full = blocks[0], blocks[1]
    assert full.forward_flops_per_sample - windowed.forward_flops_per_sample == 4 * 4096 * (4096 - 128) * 64 * 64
    assert full.attention_core_flops_per_sample == 4 * 4096 * 4096 * 4096
    assert windowed.attention_core_flops_per_sample == 4 * 4096 * 128 * 4096
    assert all(block.parameter_count == windowed.parameter_count for block in blocks)
    # standard attention computes every score and masks those outside the window: every block alike
    unfused = build_model(import_hf_config(CONFIGS / "gpt-oss-120b.json", 4096, False), "bf16").layers[1:-1]
    assert len({block.forward_flops_per_sample for block in unfused}) == 1


def test_sinks_and_router_bias_are_one_parameter_per_head_and_per_expert():
    arch = import_hf_config(CONFIGS / "gpt-oss-20b.json", 4096, True)
    block = build_model(arch, "bf16").layers[1]
    plain = build_model(arch.model_copy(update={"attention_sinks": False, "moe": arch.moe.model_copy(
        update={"router_bias": False})}), "bf16").layers[1]
    assert block.parameter_count - plain.parameter_count == 64 + 32
    # the sinks split with the heads under TP; the router (and its bias) stays whole on every TP rank
    assert block.tp_split_parameter_count - plain.tp_split_parameter_count == 64
    assert block.forward_flops_per_sample == plain.forward_flops_per_sample


def _refusal(tmp_path: Path, changes: dict) -> str:
    """The one-line refusal of gpt-oss-20b's config with `changes` (test_hf_import's check)."""
    return refusal_of(tmp_path, "gpt-oss-20b", changes)


@pytest.mark.parametrize("changes, expected", [
    ({"moe_layer_freq": 2}, "field `moe_layer_freq`: value 2 — a mixture-of-experts setting gbmw does not model for "
                            "model_type 'gpt_oss'"),
    ({"attn_logit_softcapping": 50.0}, "field `attn_logit_softcapping`: value 50.0 — not a key of the published "
                                       "GPT-OSS configs"),
    ({"experts_per_token": 2}, "field `experts_per_token`: value 2 — GPT-OSS routes each token to "
                               "`num_experts_per_tok` (4) experts"),
    ({"hidden_act": "gelu"}, "field `hidden_act`: value 'gelu' — GPT-OSS's experts are gated SiLU"),
    ({"attention_bias": False}, "field `attention_bias`: value False — GPT-OSS's experts always have biases"),
    ({"attention_dropout": 0.1}, "field `attention_dropout`: value 0.1 — gbmw costs GPT-OSS without dropout"),
    ({"layer_types": ["sliding_attention"] * 3}, "— must list one of sliding_attention, full_attention for each of "
                                                 "the 24 blocks"),
    ({"num_experts_per_tok": 33, "experts_per_token": 33}, "field `num_experts_per_tok`: value 33 — more experts per "
                                                           "token than the 32 of `num_local_experts`"),
])
def test_what_gbmw_does_not_model_is_refused_by_name(tmp_path, changes, expected):
    assert expected in _refusal(tmp_path, changes)


def test_megatron_and_the_runtime_refuse_what_they_do_not_run(tmp_path):
    """Megatron's arguments set no window and no learnable softmax: sinks are refused even within the window; gbmw's
    runtime builds neither sinks nor a router bias."""
    from gbmw.adapters.megatron.layout import gpt_architecture
    from gbmw.space.runtime_support import runtime_refusal
    from gbmw.specs.jobs import load_job

    arch = import_hf_config(CONFIGS / "gpt-oss-20b.json", 128, True)
    assert "`attention_sinks: true`" in runtime_refusal(arch, "bf16")
    assert "`moe.router_bias: true`" in runtime_refusal(arch.model_copy(update={"attention_sinks": False}), "bf16")
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {CONFIGS / 'gpt-oss-20b.json'}\ncluster: h100-80g-x64\nprecision: bf16\nglobal_batch: 64\n"
                   "seq_length: 128\nflash_attention: true\n")
    with pytest.raises(GbmwError, match=r"attention sinks \(a learned softmax logit per head, GPT-OSS\): gbmw's "
                                        r"Megatron arguments do not set megatron-core's --softmax-type learnable"):
        gpt_architecture(load_job(job))
    job.write_text(job.read_text().replace("seq_length: 128", "seq_length: 4096"))
    with pytest.raises(GbmwError, match=r"sliding-window attention \(128 tokens\) at a sequence of 4096"):
        gpt_architecture(load_job(job))


@pytest.mark.parametrize("changes, expected", [
    ({"sliding_window": 128, "full_attention_blocks": [1, 4]},
     "full_attention_blocks [1, 4] names a block past the last of 4 (blocks count from 0)"),
    ({"full_attention_blocks": [1]}, "full_attention_blocks [1] without a sliding_window"),
])
def test_a_model_recipe_with_bad_full_attention_blocks_is_one_line(changes, expected):
    from gbmw.specs.architectures import parse_architecture

    recipe = dict(family="gpt", name="tiny", num_layers=4, hidden_size=64, num_heads=4, seq_length=256,
                  vocab_size=100, **changes)
    with pytest.raises(SpecError) as raised:
        parse_architecture(recipe, "tiny.yaml")
    assert expected in str(raised.value) and "\n" not in str(raised.value)
