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
from gbmw.specs.models import build_model, load_model

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


MOE_PARAMETERS = {
    # name: (total, active per token) — exact, as transformers' modeling code builds each checkpoint (counted
    # module by module from config.json; the active count is every parameter a token passes through: the whole
    # embedding table, attention, norms, router, shared experts, dense blocks, its top-k routed experts, the head).
    "Mixtral-8x7B-v0.1": (46_702_792_704, 12_879_925_248),
    "Mixtral-8x22B-v0.1": (140_620_634_112, 39_152_031_744),
    "Qwen2-57B-A14B": (57_408_658_944, 14_249_270_784),  # shared expert behind a sigmoid gate, q/k/v biases
    "Qwen1.5-MoE-A2.7B": (14_315_784_192, 2_689_173_504),  # 60 experts of 1408, a shared one of 5632
    "Qwen3-30B-A3B": (30_532_122_624, 3_353_032_704),  # head_dim 128 ≠ 2048 / 32; q/k norms over head_dim
    "OLMoE-1B-7B-0924": (6_919_161_856, 1_282_017_280),  # q norm over 2048, k norm over 16 × 128
    "dbrx-base": (131_596_523_520, 36_469_708_800),  # LayerNorms without a shift
    # multi-head latent attention; 1 dense block, 2 shared experts; no query latent
    "DeepSeek-V2-Lite": (15_706_484_224, 2_661_150_208),
    # 3 dense blocks, a query latent, a routing bias per expert; the main model without the MTP module
    "DeepSeek-V3": (671_026_419_200, 37_552_297_472),
}
PUBLISHED_MOE = [
    # (name, total, active, how the publisher rounds) in billions, with where each figure is published.
    # Mistral, "Mixtral of experts" (mistral.ai/news/mixtral-of-experts): 46.7B total, 12.9B per token.
    ("Mixtral-8x7B-v0.1", 46.7, 12.9, "round"),
    # Mistral's Mixtral 8x22B announcement: "uses only 39B active parameters out of 141B".
    ("Mixtral-8x22B-v0.1", 141, 39, "round"),
    # Open LLM Leaderboard request for Qwen/Qwen2-57B-A14B: "params": 57.409 (the safetensors' count); active:
    # the name, A14B.
    ("Qwen2-57B-A14B", 57.409, 14, "round"),
    # NVIDIA NeMo AutoModel docs: "Qwen1.5-MoE-A2.7B: 14.3B total parameters, 2.7B activated per token".
    ("Qwen1.5-MoE-A2.7B", 14.3, 2.7, "round"),
    # Qwen3-30B-A3B model card (restated in vLLM-Ascend's tutorial): "30.5B total parameters with 3.3B activated";
    # Qwen cuts the active count (3.353B) to one decimal rather than rounding it.
    ("Qwen3-30B-A3B", 30.5, 3.3, "cut"),
    # OLMoE-1B-7B model card (an earlier revision): "1.2B active and 6.9B total parameters" — 1.28B cut; NeMo
    # Megatron-Bridge's docs round it: "1.3B activated".
    ("OLMoE-1B-7B-0924", 6.9, 1.2, "cut"),
    # databricks/dbrx-base model card: "132B total parameters of which 36B parameters are active"; the Open LLM
    # Leaderboard request for databricks/dbrx-base: "params": 131.597.
    ("dbrx-base", 132, 36, "round"),
    ("dbrx-base", 131.597, 36, "round"),
]


@pytest.mark.parametrize("name", sorted(MOE_PARAMETERS))
def test_mixture_of_experts_parameter_counts_are_exact(name):
    total, active = MOE_PARAMETERS[name]
    model = load_model(CONFIGS / f"{name}.json", "bf16", 4096)
    assert model.is_mixture_of_experts
    assert (model.parameter_count, model.active_parameter_count) == (total, active)


@pytest.mark.parametrize("name, total, active, rounding", PUBLISHED_MOE,
                         ids=[f"{row[0]}-{row[1]}" for row in PUBLISHED_MOE])
def test_mixture_of_experts_parameter_counts_are_the_published_ones_at_their_rounding(name, total, active, rounding):
    model = load_model(CONFIGS / f"{name}.json", "bf16", 4096)

    def published(count: float, like: float) -> float:
        digits = len(repr(float(like)).split(".")[1].rstrip("0")) if like != int(like) else 0
        billions = count / 1e9
        return round(billions, digits) if rounding == "round" else int(billions * 10**digits) / 10**digits

    assert published(model.parameter_count, total) == total
    assert published(model.active_parameter_count, active) == active


@pytest.mark.parametrize("recipe, config", [("mixtral-8x7b", "Mixtral-8x7B-v0.1"),
                                            ("mixtral-8x22b", "Mixtral-8x22B-v0.1")])
def test_mixtral_recipes_are_the_models_of_their_config_json(recipe, config):
    """recipes/models/ (of this checkout, not the installed package's) holds the same Mixtral as its config.json."""
    from gbmw.specs.models import build_model

    model = load_model(Path(__file__).parent.parent / "recipes" / "models" / f"{recipe}.yaml", "bf16")
    imported = build_model(import_hf_config(CONFIGS / f"{config}.json", model.sequence_length), "bf16")
    assert (model.parameter_count, model.active_parameter_count) == MOE_PARAMETERS[config]
    assert model.layers == imported.layers


def test_qwen_moe_dense_blocks_follow_the_sparse_step_and_mlp_only_layers(tmp_path):
    config = json.loads((CONFIGS / "Qwen3-30B-A3B.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "decoder_sparse_step": 2, "mlp_only_layers": [3, 4]}))
    arch = import_hf_config(path, 4096)
    # block i routes iff i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    assert [i for i in range(48) if arch.is_moe_block(i)] == [1] + list(range(5, 48, 2))
    blocks = load_model(path, "bf16", 4096).layers[1:-1]
    assert blocks[0].num_experts == 0 and blocks[1].num_experts == 128
    h, attention_and_norms = 2048, 2048 * 4096 * 2 + 2048 * 512 * 2 + 2 * 128 + 2 * 2048
    assert blocks[0].parameter_count == attention_and_norms + 3 * h * 6144  # the dense MLP: intermediate_size
    path.write_text(json.dumps({**config, "num_experts": 0}))
    assert import_hf_config(path, 4096).moe is None  # transformers builds every block dense


def test_qk_norms_per_head_are_whole_on_every_rank_and_full_width_ones_split():
    from gbmw.specs.models import build_model

    for name, params in (("Qwen3-30B-A3B", 2 * 128), ("OLMoE-1B-7B-0924", 2048 + 16 * 128)):
        arch = import_hf_config(CONFIGS / f"{name}.json", 4096)
        with_norms = build_model(arch, "bf16").layers[1]
        without = build_model(arch.model_copy(update={"qk_norm": "none"}), "bf16").layers[1]
        assert with_norms.parameter_count - without.parameter_count == params
        split = with_norms.tp_split_parameter_count - without.tp_split_parameter_count
        assert split == (0 if arch.qk_norm == "head" else params)
        # the norms' inputs, Q and K, are kept for their backward
        assert (with_norms.intermediate_tp_split_activation_bytes_per_sample
                > without.intermediate_tp_split_activation_bytes_per_sample)
    assert import_hf_config(CONFIGS / "Qwen3-30B-A3B.json", 4096).qk_norm == "head"
    assert import_hf_config(CONFIGS / "OLMoE-1B-7B-0924.json", 4096).qk_norm == "full"


def test_dbrx_reads_its_nested_sections():
    arch = import_hf_config(CONFIGS / "dbrx-base.json", 4096)
    assert (arch.num_layers, arch.hidden_size, arch.num_heads, arch.num_kv_heads) == (40, 6144, 48, 8)
    assert (arch.moe.num_experts, arch.moe.top_k, arch.moe.expert_ffn_hidden_size) == (16, 4, 10752)
    assert (arch.norm, arch.norm_bias, arch.bias, arch.rope_theta, arch.max_position_embeddings) == (
        "layer", False, False, 500000.0, 32768)
    block = load_model(CONFIGS / "dbrx-base.json", "bf16", 4096).layers[1]
    d = 6144
    assert block.parameter_count == d * (d + 2 * 8 * 128) + d * d + 2 * d + d * 16 + 16 * 3 * 10752 * d


def _refusal(tmp_path: Path, base: str, changes: dict) -> str:
    config = {**json.loads((CONFIGS / f"{base}.json").read_text()), **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({key: value for key, value in config.items() if value is not None}))
    with pytest.raises(SpecError) as raised:
        import_hf_config(path, 4096)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


@pytest.mark.parametrize("name, total, active", [
    # DeepSeek counts active parameters without the input embedding table (exact counts less vocab × hidden):
    # DeepSeek-V2-Lite model card: "15.7B total parameters, of which 2.4B are activated for each token" (2.45B cut);
    # DeepSeek-V3 README_WEIGHTS.md: "Total parameters: 671B", "Activation parameters: 36.6B (including 0.9B for the
    # output Head)".
    ("DeepSeek-V2-Lite", 15.7, 2.4),
    ("DeepSeek-V3", 671, 36.6),
])
def test_deepseek_counts_are_the_published_ones_without_the_input_embedding(name, total, active):
    model = load_model(CONFIGS / f"{name}.json", "bf16", 4096)
    embedding = model.layers[0].parameter_count
    assert round(model.parameter_count / 1e9, 1 if total % 1 else 0) == total
    assert int((model.active_parameter_count - embedding) / 1e8) / 10 == active


def test_deepseek_blocks_latents_and_routing_as_the_configs_say():
    notes: list[str] = []
    v3 = import_hf_config(CONFIGS / "DeepSeek-V3.json", 4096, notes=notes)
    lite = import_hf_config(CONFIGS / "DeepSeek-V2-Lite.json", 4096)
    assert (v3.latent_attention.q_lora_rank, lite.latent_attention.q_lora_rank) == (1536, None)
    assert (v3.moe.dense_blocks, lite.moe.dense_blocks) == ((0, 1, 2), (0,))
    assert (v3.moe.expert_score_bias, lite.moe.expert_score_bias) == (True, False)  # noaux_tc's e_score_correction_bias
    assert (v3.moe.shared_experts * v3.moe.shared_ffn_hidden_size, lite.moe.shared_experts
            * lite.moe.shared_ffn_hidden_size) == (2048, 2 * 1408)
    assert any("`num_nextn_predict_layers` 1: the multi-token prediction module is not costed" in note
               for note in notes)
    block = build_model(v3, "bf16").layers[4]  # an MoE block: 256 × 3 × 7168 × 2048 experts, router and bias
    h, heads = 7168, 128
    attention = (h * 1536 + 1536 + 1536 * heads * 192 + h * (512 + 64) + 512 + 512 * heads * 256 + heads * 128 * h + h)
    assert block.parameter_count == attention + 256 * 3 * h * 2048 + 3 * h * 2048 + h * 256 + 256 + h


@pytest.mark.parametrize("base, changes, expected", [
    ("Llama-2-7b-hf", {"kv_lora_rank": 512}, "field `kv_lora_rank`: value 512 — multi-head latent attention under "
                                             "model_type 'llama', whose transformers code builds standard attention"),
    ("DeepSeek-V2-Lite", {"moe_layer_freq": 2}, "field `moe_layer_freq`: value 2 — gbmw makes every block from "
                                                "`first_k_dense_replace` on an MoE block"),
    ("DeepSeek-V2-Lite", {"first_k_dense_replace": -1}, "field `first_k_dense_replace`: value -1 — must be a whole"),
    ("DeepSeek-V3", {"attention_bias": True}, "field `attention_bias`: value True — gbmw models DeepSeek's latent "
                                              "attention without biases"),
    ("DeepSeek-V3", {"kv_lora_rank": 0}, "field `kv_lora_rank`: value 0 — must be at least 1"),
    ("DeepSeek-V3", {"q_lora_rank": 0}, "field `q_lora_rank`: value 0 — must be at least 1"),
    ("DeepSeek-V3", {"v_head_dim": None}, "field `v_head_dim` is required for model_type 'deepseek_v3'"),
])
def test_bad_latent_attention_settings_end_in_one_line_naming_the_key(tmp_path, base, changes, expected):
    assert expected in _refusal(tmp_path, base, changes)


def test_deepseek_routing_keys_that_change_no_cost_are_accepted(tmp_path):
    lite = load_model(CONFIGS / "DeepSeek-V2-Lite.json", "bf16", 4096)
    changed = {**json.loads((CONFIGS / "DeepSeek-V2-Lite.json").read_text()), "scoring_func": "sigmoid",
               "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3, "routed_scaling_factor": 16.0,
               "norm_topk_prob": True}
    (tmp_path / "config.json").write_text(json.dumps(changed))
    assert load_model(tmp_path / "config.json", "bf16", 4096).layers == lite.layers


@pytest.mark.parametrize("base, changes, expected", [
    ("Qwen2-57B-A14B", {"moe_layer_freq": 2}, "field `moe_layer_freq`: value 2 — a mixture-of-experts setting gbmw "
                                              "does not model for model_type 'qwen2_moe'"),
    ("Mixtral-8x7B-v0.1", {"capacity_factor": 1.25}, "field `capacity_factor`: value 1.25 — a mixture-of-experts "
                                                     "setting gbmw does not model for model_type 'mixtral'"),
    ("Qwen3-30B-A3B", {"shared_expert_intermediate_size": 768}, "field `shared_expert_intermediate_size`: value 768"),
    ("dbrx-base", {"ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4,
                                  "moe_num_shared_experts": 1}},
     "field `ffn_config.moe_num_shared_experts`: value 1 — a mixture-of-experts setting gbmw does not model"),
    ("dbrx-base", {"ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4, "ffn_type": "x"}},
     "field `ffn_config.ffn_type`: value 'x' — not a key of DBRX's ffn_config"),
])
def test_a_mixture_of_experts_key_gbmw_does_not_read_is_refused_by_name(tmp_path, base, changes, expected):
    assert expected in _refusal(tmp_path, base, changes)


@pytest.mark.parametrize("base, changes, expected", [
    ("Llama-2-7b-hf", {"num_experts": 8}, "field `num_experts`: value 8"),
    ("Llama-2-7b-hf", {"ffn_config": {"moe_num_experts": 16}}, "field `ffn_config.moe_num_experts`: value 16"),
    ("Qwen2-7B", {"n_routed_experts": 64}, "field `n_routed_experts`: value 64"),
])
def test_experts_under_a_dense_model_type_are_refused_never_costed_as_dense(tmp_path, base, changes, expected):
    message = _refusal(tmp_path, base, changes)
    assert f"{expected} — a mixture-of-experts setting under model_type" in message
    assert "gbmw will not cost it as dense" in message


def test_mixtral_7b_8expert_is_refused_for_its_dense_model_type():
    """DiscoResearch's port names its experts under model_type mistral: transformers' Mistral builds a dense 7B
    from it, only the repository's own code (auto_map) routes experts. Which one trains is not in the file."""
    with pytest.raises(SpecError, match=r"field `num_experts`: value 8 — a mixture-of-experts setting under "
                                        r"model_type 'mistral', whose transformers code builds a dense model"):
        import_hf_config(CONFIGS / "mixtral-7b-8expert.json", 4096)


@pytest.mark.parametrize("base, changes", [
    ("Llama-2-7b-hf", {"num_experts": 1, "moe_layer_freq": 1, "router_aux_loss_coef": 0.01, "moe_capacity": None}),
    ("Mixtral-8x7B-v0.1", {"router_jitter_noise": 0.1, "norm_topk_prob": True, "moe_layer_freq": 1}),
])
def test_keys_that_say_no_experts_or_change_no_cost_are_accepted(tmp_path, base, changes):
    config = json.loads((CONFIGS / f"{base}.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **changes}))
    assert (load_model(tmp_path / "config.json", "bf16", 4096).parameter_count
            == load_model(CONFIGS / f"{base}.json", "bf16", 4096).parameter_count)


@pytest.mark.parametrize("base, changes, expected", [
    ("Mixtral-8x7B-v0.1", {"num_experts_per_tok": 9}, "field `num_experts_per_tok`: value 9 — more experts per token "
                                                      "than the 8 of `num_local_experts`; give from 1 to 8"),
    ("dbrx-base", {"ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 17}},
     "field `ffn_config.moe_top_k`: value 17 — more experts per token than the 16 of `ffn_config.moe_num_experts`"),
    ("Qwen2-57B-A14B", {"num_experts": 1, "num_experts_per_tok": 1},
     "field `num_experts`: value 1 — must be at least 2"),
    ("Mixtral-8x7B-v0.1", {"num_local_experts": 1, "num_experts_per_tok": 1},
     "field `num_local_experts`: value 1 — must be at least 2"),
    ("Qwen3-30B-A3B", {"mlp_only_layers": [0, 48]},
     "field `mlp_only_layers`: value [0, 48] — must list block indices from 0 to 47"),
    ("Qwen3-30B-A3B", {"decoder_sparse_step": 0},
     "field `decoder_sparse_step`: value 0 — must be a whole number from 1"),
    ("Qwen2-57B-A14B", {"shared_expert_intermediate_size": 0},
     "field `shared_expert_intermediate_size`: value 0 — must be at least 1"),
    ("Mixtral-8x7B-v0.1", {"num_local_experts": None},
     "field `num_local_experts` is required for model_type 'mixtral'"),
])
def test_bad_expert_settings_end_in_one_line_naming_the_key(tmp_path, base, changes, expected):
    assert expected in _refusal(tmp_path, base, changes)


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
    arch = import_hf_config(path, 4096)  # blocks 20-27 windowed, the first 20 attend to the whole sequence
    assert (arch.sliding_window, arch.full_attention_blocks) == (131072, tuple(range(20)))


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


@pytest.mark.parametrize("base, changes, expected", [
    ("Meta-Llama-3-8B", {"rope_scaling": "junk"}, "field `rope_scaling`: value 'junk' — a mapping whose `rope_type`"),
    ("Meta-Llama-3-8B", {"rope_scaling": {"factor": 8.0}}, "field `rope_scaling`: value {…} — a mapping whose `rope_type`"),
    ("Mistral-7B-v0.1", {"sliding_window": "4096"}, "field `sliding_window`: value '4096' — a positive number"),
    ("Mistral-7B-v0.1", {"sliding_window": -1}, "field `sliding_window`: value -1"),
    ("Mistral-7B-v0.1", {"sliding_window": True}, "field `sliding_window`: value True"),
])
def test_rotary_scaling_and_windows_that_are_not_what_they_claim_are_refused_by_name(tmp_path, base, changes,
                                                                                   expected):
    """issue 31: junk rope_scaling and a string or negative sliding_window were planned without a word."""
    assert expected in _refusal(tmp_path, base, changes)


def test_a_real_rope_scaling_is_costed_as_plain_rotary_and_refused_by_the_runtime(tmp_path):
    """Llama 3.1's `rope_scaling` (rope_type llama3) changes no cost: the import keeps its type, costs the blocks as
    plain rotary (parameters equal Llama 3's), and gbmw's runtime refuses to train it rather than train another
    model. Catches: the scaling dropped silently, or costed differently."""
    from gbmw.space.runtime_support import runtime_refusal
    config = json.loads((CONFIGS / "Meta-Llama-3-8B.json").read_text())
    config["rope_scaling"] = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    scaled, plain = import_hf_config(path, 4096), import_hf_config(CONFIGS / "Meta-Llama-3-8B.json", 4096)
    assert scaled.rope_scaling == "llama3" and plain.rope_scaling is None
    assert scaled.model_copy(update={"rope_scaling": None, "source": plain.source, "name": plain.name}) == plain
    assert "`rope_scaling: llama3`" in runtime_refusal(scaled, "bf16") and runtime_refusal(plain, "bf16") is None


def test_an_error_in_tie_word_embeddings_names_the_config_key(tmp_path):
    """issue 31: `tie_word_embeddings: "no"` was reported under gbmw's own field name (`tie_embeddings`)."""
    message = _refusal(tmp_path, "Meta-Llama-3-8B", {"tie_word_embeddings": "no"})
    assert "field `tie_word_embeddings`: value 'no'" in message and "`tie_embeddings`" not in message


def test_a_repeated_key_with_one_value_is_read_once_and_a_config_file_names_its_model(tmp_path):
    """issue 30: the real Meta-Llama-3-8B-Instruct config.json has `_name_or_path` twice (transformers reads it);
    the same value twice is read once, two values are still refused. A config file not named config.json names
    the model by its own name, not its folder's. Catches: refusing a real config, or costing "hf_configs"."""
    text = (CONFIGS / "Meta-Llama-3-8B.json").read_text().rstrip().rstrip("}")
    (tmp_path / "config.json").write_text(text + ', "vocab_size": 128256}')
    assert import_hf_config(tmp_path / "config.json", 4096).vocab_size == 128256
    (tmp_path / "twice.json").write_text(text + ', "vocab_size": 32000}')
    with pytest.raises(SpecError, match="appears twice in one object with different values"):
        import_hf_config(tmp_path / "twice.json", 4096)
    assert import_hf_config(CONFIGS / "Meta-Llama-3-8B.json", 4096).name == "Meta-Llama-3-8B"
