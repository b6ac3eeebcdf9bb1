"""The mixture-of-experts part of a Hugging Face config.json (gbmw.specs.hf_import reads the rest): which experts
and latent attention it describes, and the one-line refusal of what gbmw cannot cost as the file says.

Mixtures of experts (gbmw.specs.architectures.MixtureOfExperts), as transformers' modeling code builds them:
Mixtral routes every block to `num_experts_per_tok` of `num_local_experts` SwiGLU experts of `intermediate_size`.
Qwen2-MoE and Qwen3-MoE make block i an MoE block iff i is not in `mlp_only_layers` and (i + 1) is a multiple of
`decoder_sparse_step` (the others keep a dense MLP of `intermediate_size`); their experts are
`moe_intermediate_size` wide; Qwen2-MoE adds one shared expert of `shared_expert_intermediate_size` behind a
sigmoid gate and has q/k/v biases; Qwen3-MoE norms Q and K per head (RMSNorm over `head_dim`). OLMoE routes every
block to 8 of 64 experts of `intermediate_size` and norms the whole Q and K projections. DBRX nests its sizes in
`attn_config` and `ffn_config`, fuses Wqkv, has no linear biases and LayerNorms without a shift. Keys that change
routing's numbers but no cost are accepted (`norm_topk_prob`, `router_aux_loss_coef`, `output_router_logits`,
router jitter, `clip_qkv`, DBRX's `moe_loss_weight` and `moe_normalize_expert_weights`). Any other
mixture-of-experts key is refused by name, and so is one under a dense `model_type` (a model is never costed as
dense when its config says experts), as are the other mixture-of-experts types.

DeepSeek-V2 and V3 (transformers' modeling_deepseek_v2/v3, the checkpoints' modeling_deepseek.py) attend through
multi-head latent attention (`q_lora_rank` — null: no query latent —, `kv_lora_rank`, `qk_nope_head_dim`,
`qk_rope_head_dim`, `v_head_dim`; gbmw.specs.latent_attention_spec.MultiLatentAttention); `num_key_value_heads` builds
nothing there and is not read. Blocks below `first_k_dense_replace` keep a dense SwiGLU MLP of `intermediate_size`;
the others route to `num_experts_per_tok` of `n_routed_experts` experts of `moe_intermediate_size` beside one shared
MLP of `n_shared_experts` × that width (`moe_layer_freq` other than 1 — every k-th block, in the checkpoints' own
code; ignored by transformers — is refused). DeepSeek-V3 with `topk_method: noaux_tc` adds a routing bias per expert
(`e_score_correction_bias`, stored in the checkpoint, counted). Accepted because they change no parameter and no FLOP:
`norm_topk_prob` and `routed_scaling_factor` (rescale the top-k weights), `scoring_func` (softmax or sigmoid over
the same router logits, one op per token and expert), `topk_method` and `n_group` / `topk_group` (which experts win:
group-limited routing sends a token to experts of at most `topk_group` of `n_group` groups — devices or nodes —,
which bounds the nodes its copies travel to; gbmw's all-to-all (gbmw.cost.expert_parallel) does not use that bound,
it spreads every token's copies over the EP group), `aux_loss_alpha` / `seq_aux` (balancing losses), `ep_size` (an
inference setting), `rope_scaling` (YaRN rescales rotary frequencies and the softmax scale: no parameters) and
`quantization_config` (how the published weights are stored, not how gbmw's job trains). DeepSeek-V3's multi-token
prediction module (`num_nextn_predict_layers`: one more MoE block, two norms and a 2h → h projection, with the
embedding and head shared) is not costed — the 671B the model card counts excludes it, and so does gbmw, with a
note; `attention_bias: true` is refused (both published models have none).
"""

from __future__ import annotations

import re
from typing import Any

from gbmw.errors import SpecError
from gbmw.specs.files import shown
from gbmw.specs.schema import MAX_LAYERS


def layer_count(config: dict[str, Any]) -> int | None:
    """`num_hidden_layers` when it is a block count gbmw can build (1 to MAX_LAYERS), else None: the readers that list
    blocks one by one stop there and leave the architecture's check to name the field (issue 31: a count of 2**63
    listed blocks for minutes before any check)."""
    layers = config.get("num_hidden_layers")
    valid = isinstance(layers, int) and not isinstance(layers, bool) and 1 <= layers <= MAX_LAYERS
    return layers if valid else None

MOE_KEYS_READ = {
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    "qwen2_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                  "decoder_sparse_step", "mlp_only_layers"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                  "mlp_only_layers"),
    "olmoe": ("num_experts", "num_experts_per_tok"),
    "gpt_oss": ("num_local_experts", "num_experts_per_tok", "experts_per_token"),
    **{kind: ("n_routed_experts", "n_shared_experts", "moe_intermediate_size", "num_experts_per_tok",
              "first_k_dense_replace", "moe_layer_freq", "routed_scaling_factor")
       for kind in ("deepseek_v2", "deepseek_v3")},
    "dbrx": ("ffn_config.moe_num_experts", "ffn_config.moe_top_k", "ffn_config.moe_jitter_eps",
             "ffn_config.moe_loss_weight", "ffn_config.moe_normalize_expert_weights"),
}
"""The mixture-of-experts keys gbmw reads (or knows to change no cost) for each model_type it imports experts of."""
_MOE_KEYS_WITHOUT_COST = ("norm_topk_prob", "router_aux_loss_coef", "output_router_logits", "router_jitter_noise")
"""Keys that change routing's numbers (renormalised top-k weights, the balancing loss, jitter) but no cost."""
_MOE_KEY = re.compile(r"expert|moe|router|routed|capacity_factor|sparse_step|mlp_only_layers|dense_replace")
"""What a key that configures experts looks like (`num_experts`, `moe_layer_freq`, `ffn_config.moe_num_experts`,
`first_k_dense_replace`, ...); generation keys such as `top_k` do not."""
_SAYS_NO_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok",
                    "num_experts_per_token", "moe_layer_freq", "expert_interval")
"""Keys for which 1 means a dense model (one expert, every block alike) — as 0, false or null do for any key."""
DEEPSEEK = ("deepseek_v2", "deepseek_v3")
_MOE_TYPES = ("jamba", "granitemoe", "granitemoeshared", "phimoe", "qwen3_next",
              "switch_transformers", "nllb_moe", "llama4", "glm4_moe", "ernie4_5_moe", "minimax")
"""Mixture-of-experts model_types gbmw does not import."""
GPT_OSS_KEYS = ("architectures", "attention_bias", "attention_dropout", "bos_token_id", "dtype", "eos_token_id",
                 "experts_per_token", "head_dim", "hidden_act", "hidden_size", "initial_context_length",
                 "initializer_range", "intermediate_size", "layer_types", "max_position_embeddings", "model_type",
                 "num_attention_heads", "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads",
                 "num_local_experts", "output_router_logits", "pad_token_id", "quantization_config", "rms_norm_eps",
                 "rope_scaling", "rope_theta", "router_aux_loss_coef", "sliding_window", "swiglu_limit",
                 "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache", "vocab_size", "_name_or_path")
"""The keys of a gpt_oss config.json gbmw reads or knows to change no training cost (token ids, initialisation, the
RoPE scaling and clamp constants, the released checkpoint's MXFP4 storage `quantization_config` — training runs in
the job's precision); any other is refused by name."""
_DBRX_KEYS = {"attn_config": ("attn_pdrop", "clip_qkv", "kv_n_heads", "rope_theta", "model_type"),
              "ffn_config": ("ffn_act_fn", "ffn_hidden_size", "moe_num_experts", "moe_top_k", "moe_jitter_eps",
                             "moe_loss_weight", "moe_normalize_expert_weights", "model_type")}
"""The keys transformers' DbrxAttentionConfig / DbrxFFNConfig take (they refuse any other)."""


def required(config: dict[str, Any], where: str, model_type: Any, *keys: str, prefix: str = "") -> Any:
    """The first of `keys` the config sets (not null), or an error naming the first (`prefix`: its section)."""
    for key in keys:
        if key in config and config[key] is not None:
            return config[key]
    raise SpecError(f"{where}: field `{prefix}{keys[0]}` is required for model_type {shown(model_type)}")


def refuse_experts_gbmw_cannot_read(config: dict[str, Any], where: str) -> None:
    """One error naming the key that makes the model one gbmw cannot cost as the file says: latent attention outside
    DeepSeek's model_types, a mixture-of-experts model_type gbmw does not import, a mixture-of-experts key
    gbmw does not read for this model_type, or experts under a model_type whose code builds a dense model."""
    model_type = config.get("model_type")
    if model_type not in DEEPSEEK and config.get("kv_lora_rank") is not None:
        raise SpecError(
            f"{where}: field `kv_lora_rank`: value {shown(config['kv_lora_rank'])} — multi-head latent attention under "
            f"model_type {shown(model_type)}, whose transformers code builds standard attention; gbmw imports latent "
            f"attention for {', '.join(DEEPSEEK)}, or write a model recipe YAML with `latent_attention:`"
        )
    if model_type in _MOE_TYPES:
        raise SpecError(
            f"{where}: field `model_type`: value {shown(model_type)} — a mixture-of-experts architecture gbmw does "
            f"not import (it imports {', '.join(MOE_KEYS_READ)}); write a model recipe YAML with `moe:` (see "
            "recipes/models/mixtral-8x7b.yaml)"
        )
    read = MOE_KEYS_READ.get(model_type, ())
    for key, value in _keys_of(config):
        if not _MOE_KEY.search(key.rsplit(".", 1)[-1]) or key in read or key in _MOE_KEYS_WITHOUT_COST:
            continue
        if value is None or value is False or value == 0 or value == [] \
                or (value == 1 and key.rsplit(".", 1)[-1] in _SAYS_NO_EXPERTS):
            continue  # says "no experts" (or "every block alike"): nothing to cost
        if read:
            raise SpecError(
                f"{where}: field `{key}`: value {shown(value)} — a mixture-of-experts setting gbmw does not model "
                f"for model_type {shown(model_type)} (it reads {', '.join(read)}); remove it if it does not change the "
                "model, or write a model recipe YAML with `moe:`"
            )
        raise SpecError(
            f"{where}: field `{key}`: value {shown(value)} — a mixture-of-experts setting under model_type "
            f"{shown(model_type)}, whose transformers code builds a dense model; gbmw will not cost it as dense: give "
            f"the model_type whose code routes the experts ({', '.join(MOE_KEYS_READ)}), or write a model recipe "
            "YAML with `moe:`"
        )


def _keys_of(config: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Every key of the config and of the objects nested in it, as `section.key`, in the file's order."""
    keys = []
    for key, value in config.items():
        keys.append((prefix + str(key), value))
        if isinstance(value, dict):
            keys += _keys_of(value, f"{prefix}{key}.")
    return keys


def llama_style_experts(config: dict[str, Any], model_type: str, where: str) -> dict[str, Any] | None:
    """The `moe` mapping of a LLaMA-style mixture of experts (None where no block routes to experts)."""
    if model_type == "mixtral":
        return dict(num_experts=required(config, where, model_type, "num_local_experts"),
                    top_k=required(config, where, model_type, "num_experts_per_tok"),
                    expert_ffn_hidden_size=required(config, where, model_type, "intermediate_size"))
    if model_type == "gpt_oss":
        return dict(num_experts=required(config, where, model_type, "num_local_experts"),
                    top_k=required(config, where, model_type, "num_experts_per_tok"),
                    expert_ffn_hidden_size=required(config, where, model_type, "intermediate_size"),
                    router_bias=True)
    if model_type == "olmoe":
        return dict(num_experts=required(config, where, model_type, "num_experts"),
                    top_k=required(config, where, model_type, "num_experts_per_tok"),
                    expert_ffn_hidden_size=required(config, where, model_type, "intermediate_size"))
    experts = required(config, where, model_type, "num_experts")
    moe = dict(num_experts=experts, top_k=required(config, where, model_type, "num_experts_per_tok"),
               expert_ffn_hidden_size=required(config, where, model_type, "moe_intermediate_size"))
    if model_type == "qwen2_moe":
        moe.update(shared_experts=1, shared_expert_gate=True,
                   shared_expert_ffn_hidden_size=required(config, where, model_type,
                                                           "shared_expert_intermediate_size"))
    layers, step = layer_count(config), config.get("decoder_sparse_step", 1)
    dense_only = config.get("mlp_only_layers") or []
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise SpecError(f"{where}: field `decoder_sparse_step`: value {shown(step)} — must be a whole number from 1 "
                        "(1: every block routes to experts; k: every k-th block)")
    if layers is None:
        return moe  # the architecture's check of num_hidden_layers says what is wrong
    if not isinstance(dense_only, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers
                                                   for i in dense_only):
        raise SpecError(f"{where}: field `mlp_only_layers`: value {shown(dense_only)} — must list block indices "
                        f"from 0 to {layers - 1} (the blocks whose MLP stays dense)")
    dense = [i for i in range(layers) if i in dense_only or (i + 1) % step != 0]
    if experts == 0 or len(dense) == layers:
        return None  # transformers builds every block dense: a dense model, costed as one
    moe["dense_blocks"] = dense
    return moe


def deepseek_latent_attention(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The `latent_attention` mapping of a DeepSeek-V2/V3 config (its values are checked by the architecture)."""
    if config.get("attention_bias", False) is not False:
        raise SpecError(f"{where}: field `attention_bias`: value {shown(config.get('attention_bias'))} — gbmw models "
                        "DeepSeek's latent attention without biases (DeepSeek-V2 and V3 have none); give false")
    model_type = config.get("model_type")
    return dict(q_lora_rank=config.get("q_lora_rank"),
                **{key: required(config, where, model_type, key)
                   for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")})


def deepseek_experts(config: dict[str, Any], model_type: str, where: str) -> dict[str, Any] | None:
    """The `moe` mapping of a DeepSeek-V2/V3 config (the module docstring); None where no block routes to experts."""
    experts = config.get("n_routed_experts")
    frequency, first_dense = config.get("moe_layer_freq", 1), config.get("first_k_dense_replace", 0)
    if frequency != 1:
        raise SpecError(f"{where}: field `moe_layer_freq`: value {shown(frequency)} — gbmw makes every block from "
                        "`first_k_dense_replace` on an MoE block (moe_layer_freq 1, as transformers builds DeepSeek); "
                        "give 1, or write a model recipe YAML with `moe.dense_blocks`")
    if not isinstance(first_dense, int) or isinstance(first_dense, bool) or first_dense < 0:
        raise SpecError(f"{where}: field `first_k_dense_replace`: value {shown(first_dense)} — must be a whole number "
                        "from 0 (the blocks, from the first, whose MLP stays dense)")
    layers = layer_count(config)
    if not experts or layers is None or first_dense >= layers:
        return None  # every block dense: costed as a dense model (a bad num_hidden_layers is the architecture's)
    return dict(num_experts=experts, top_k=required(config, where, model_type, "num_experts_per_tok"),
                expert_ffn_hidden_size=required(config, where, model_type, "moe_intermediate_size"),
                shared_experts=config.get("n_shared_experts") or 0, dense_blocks=list(range(first_dense)),
                expert_score_bias=model_type == "deepseek_v3" and config.get("topk_method") == "noaux_tc")


def check_top_k(moe: dict[str, Any], keys: dict[str, str], where: str) -> None:
    """A token goes to at most every expert: the error names the config's keys (MixtureOfExperts names its own)."""
    experts, top_k = moe["num_experts"], moe["top_k"]
    if all(isinstance(n, int) and not isinstance(n, bool) for n in (experts, top_k)) and top_k > experts >= 1:
        raise SpecError(f"{where}: field `{keys['moe.top_k']}`: value {top_k} — more experts per token than the "
                        f"{experts} of `{keys['moe.num_experts']}`; give from 1 to {experts}")


def check_gpt_oss_keys(config: dict[str, Any], where: str) -> None:
    """A gpt_oss config.json has only the keys gbmw reads or knows to cost nothing (`GPT_OSS_KEYS`), its two top-k
    keys agree, its activation is the SwiGLU gbmw costs, and it trains without attention dropout."""
    for key, value in config.items():
        if key not in GPT_OSS_KEYS:
            raise SpecError(f"{where}: field `{key}`: value {shown(value)} — not a key of the published GPT-OSS "
                            "configs, so gbmw cannot say what it costs; remove it if it changes nothing, or write a "
                            "model recipe YAML with `moe:`")
    if "experts_per_token" in config and config["experts_per_token"] != config.get("num_experts_per_tok"):
        raise SpecError(f"{where}: field `experts_per_token`: value {shown(config['experts_per_token'])} — GPT-OSS "
                        f"routes each token to `num_experts_per_tok` ({shown(config.get('num_experts_per_tok'))}) "
                        "experts; the two must agree")
    if config.get("hidden_act", "silu") != "silu":
        raise SpecError(f"{where}: field `hidden_act`: value {shown(config['hidden_act'])} — GPT-OSS's experts are "
                        "gated SiLU (SwiGLU) MLPs, which gbmw costs; give \"silu\"")
    if config.get("attention_dropout", 0.0) not in (0, 0.0):
        raise SpecError(f"{where}: field `attention_dropout`: value {shown(config['attention_dropout'])} — gbmw costs "
                        "GPT-OSS without dropout (the published configs have 0.0); give 0.0")


def dbrx_section(config: dict[str, Any], section: str, where: str) -> dict[str, Any]:
    """DBRX's `attn_config` or `ffn_config`, with only the keys transformers' DBRX takes."""
    value = config.get(section)
    if not isinstance(value, dict):
        raise SpecError(f"{where}: field `{section}`: value {shown(value)} — DBRX's sizes are in an object "
                        f"`{section}` (keys {', '.join(_DBRX_KEYS[section])})")
    for key in value:
        if key not in _DBRX_KEYS[section]:
            raise SpecError(f"{where}: field `{section}.{key}`: value {shown(value[key])} — not a key of DBRX's "
                            f"{section} (transformers refuses it too); it takes {', '.join(_DBRX_KEYS[section])}")
    return value
