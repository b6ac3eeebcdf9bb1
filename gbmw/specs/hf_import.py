"""A Hugging Face config.json (GPT-2, LLaMA/Mistral/Qwen2, BERT/RoBERTa, T5/mT5, ViT; the mixtures of experts
Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DBRX, DeepSeek-V2/V3) read into gbmw's architecture types, from the file alone
(no transformers import, nothing downloaded or executed).

What the file does not say is asked of the user: the training sequence length (a config states only the longest
the model takes, `max_position_embeddings`; used, with a note, when none is given) and whether attention is fused
(flash attention stores no score matrix; standard attention is assumed, with a note, when not said).

Facts of the architectures that the config leaves implicit (from each model's Hugging Face modeling code):
LLaMA has biases on q/k/v/o only with `attention_bias` and on the MLP only with `mlp_bias`; Mistral has none;
Qwen2 always has q/k/v biases and no others. `head_dim`, where given, sets the attention width
(heads × head_dim, which need not equal hidden_size).

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
`qk_rope_head_dim`, `v_head_dim`; gbmw.specs.architectures.MultiLatentAttention); `num_key_value_heads` builds
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
from pathlib import Path
from typing import Any

from gbmw.errors import SpecError
from gbmw.specs.architectures import apply_training_settings, parse_architecture
from gbmw.specs.files import read_json, shown

_MOE_DECODERS = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
"""LLaMA-style mixtures of experts read like `_LLAMA_LIKE`, plus their experts; `dbrx` is read apart."""
_MOE_KEYS_READ = {
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    "qwen2_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                  "decoder_sparse_step", "mlp_only_layers"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                  "mlp_only_layers"),
    "olmoe": ("num_experts", "num_experts_per_tok"),
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
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")
_MOE_TYPES = ("jamba", "granitemoe", "granitemoeshared", "phimoe", "qwen3_next",
              "switch_transformers", "nllb_moe", "gpt_oss", "llama4", "glm4_moe", "ernie4_5_moe", "minimax")
"""Mixture-of-experts model_types gbmw does not import."""
_DBRX_KEYS = {"attn_config": ("attn_pdrop", "clip_qkv", "kv_n_heads", "rope_theta", "model_type"),
              "ffn_config": ("ffn_act_fn", "ffn_hidden_size", "moe_num_experts", "moe_top_k", "moe_jitter_eps",
                             "moe_loss_weight", "moe_normalize_expert_weights", "model_type")}
"""The keys transformers' DbrxAttentionConfig / DbrxFFNConfig take (they refuse any other)."""
_LLAMA_LIKE = ("llama", "mistral", "qwen2")
_HF_KEYS_OF_LLAMA_BERT_VIT = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                              "num_kv_heads": "num_key_value_heads", "ffn_hidden_size": "intermediate_size"}
_HF_KEYS = {"gpt2": {"num_layers": "n_layer", "hidden_size": "n_embd", "num_heads": "n_head", "ffn_hidden_size": "n_inner",
                     "max_position_embeddings": "n_positions"},
            "t5": {"num_encoder_layers": "num_layers", "hidden_size": "d_model", "head_dim": "d_kv",
                   "ffn_hidden_size": "d_ff"},
            **{kind: _HF_KEYS_OF_LLAMA_BERT_VIT for kind in (*_LLAMA_LIKE, "bert", "roberta", "vit")}}
_HF_KEYS["mt5"] = _HF_KEYS["t5"]
_HF_KEYS["mixtral"] = {**_HF_KEYS_OF_LLAMA_BERT_VIT, "moe.num_experts": "num_local_experts",
                       "moe.top_k": "num_experts_per_tok", "moe.expert_ffn_hidden_size": "intermediate_size"}
_HF_KEYS["olmoe"] = {**_HF_KEYS_OF_LLAMA_BERT_VIT, "moe.num_experts": "num_experts", "moe.top_k": "num_experts_per_tok",
                     "moe.expert_ffn_hidden_size": "intermediate_size"}
_HF_KEYS["qwen3_moe"] = {**_HF_KEYS["olmoe"], "moe.expert_ffn_hidden_size": "moe_intermediate_size"}
_HF_KEYS["qwen2_moe"] = {**_HF_KEYS["qwen3_moe"],
                         "moe.shared_expert_ffn_hidden_size": "shared_expert_intermediate_size"}
_HF_KEYS["deepseek_v2"] = _HF_KEYS["deepseek_v3"] = {
    **_HF_KEYS_OF_LLAMA_BERT_VIT, "moe.num_experts": "n_routed_experts", "moe.top_k": "num_experts_per_tok",
    "moe.expert_ffn_hidden_size": "moe_intermediate_size", "moe.shared_experts": "n_shared_experts",
    **{f"latent_attention.{key}": key
       for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}}
_HF_KEYS["dbrx"] = {"num_layers": "n_layers", "hidden_size": "d_model", "num_heads": "n_heads",
                    "num_kv_heads": "attn_config.kv_n_heads", "ffn_hidden_size": "ffn_config.ffn_hidden_size",
                    "max_position_embeddings": "max_seq_len", "moe.num_experts": "ffn_config.moe_num_experts",
                    "moe.top_k": "ffn_config.moe_top_k", "moe.expert_ffn_hidden_size": "ffn_config.ffn_hidden_size"}
"""gbmw's architecture field → the config.json key it is read from, where the names differ: an error about a field
names the key the user wrote."""


def import_hf_config(path: str | Path, seq_length: int | None = None, flash_attention: bool | None = None,
                     notes: list[str] | None = None) -> Any:
    """An architecture from a Hugging Face config.json (GPT-2, LLaMA-style, BERT/RoBERTa, T5, ViT, the mixtures of
    experts of the module's docstring), trained at
    `seq_length` tokens per sample (None: the model's maximum) with flash attention or not (None: standard).
    Lines worth telling the user (defaults taken) are appended to `notes`."""
    path = Path(path)
    notes = [] if notes is None else notes
    config = read_json(path, "Hugging Face config.json")
    if not isinstance(config, dict):
        raise SpecError(f"{path}: expected a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    name = config.get("_name_or_path") or path.parent.name or path.stem
    where = str(path)
    _refuse_mixture_of_experts_gbmw_cannot_read(config, where)

    def need(*keys: str) -> Any:
        return _required(config, where, model_type, *keys)

    if model_type == "gpt2":
        positions_field = "n_positions" if "n_positions" in config else "n_ctx"
        data = dict(
            family="gpt", num_layers=need("n_layer"), hidden_size=need("n_embd"), num_heads=need("n_head"),
            ffn_hidden_size=config.get("n_inner"), max_position_embeddings=need("n_positions", "n_ctx"),
            vocab_size=need("vocab_size"), tie_embeddings=config.get("tie_word_embeddings", True),
        )
    elif model_type in _LLAMA_LIKE or model_type in _MOE_DECODERS:
        positions_field = "max_position_embeddings"
        data = dict(
            family="gpt", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), num_kv_heads=config.get("num_key_value_heads"),
            head_dim=config.get("head_dim"), ffn_hidden_size=need("intermediate_size"),
            max_position_embeddings=need("max_position_embeddings"), vocab_size=need("vocab_size"),
            gated_mlp=True, norm="rms", position_embedding="rotary",
            tie_embeddings=config.get("tie_word_embeddings", False), dropout=False,
            rope_theta=config.get("rope_theta", 10000.0), **_llama_biases(config, model_type, where),
            sliding_window=_sliding_window(config, model_type, where),
            qk_norm={"qwen3_moe": "head", "olmoe": "full"}.get(model_type),
            moe=_experts(config, model_type, where) if model_type in _MOE_DECODERS else None,
        )
    elif model_type in _DEEPSEEK:
        positions_field = "max_position_embeddings"
        data = dict(
            family="gpt", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), ffn_hidden_size=need("intermediate_size"),
            max_position_embeddings=need("max_position_embeddings"), vocab_size=need("vocab_size"),
            gated_mlp=True, norm="rms", bias=False, position_embedding="rotary",
            tie_embeddings=config.get("tie_word_embeddings", False), dropout=bool(config.get("attention_dropout")),
            rope_theta=config.get("rope_theta", 10000.0), latent_attention=_latent_attention(config, where),
            moe=_deepseek_experts(config, model_type, where),
        )
        if config.get("num_nextn_predict_layers"):
            notes.append(f"{where}: `num_nextn_predict_layers` {config['num_nextn_predict_layers']}: the multi-token "
                         "prediction module is not costed (gbmw plans the main model, as its published parameter "
                         "count does)")
    elif model_type == "dbrx":
        positions_field = "max_seq_len"
        attn, ffn = _dbrx_section(config, "attn_config", where), _dbrx_section(config, "ffn_config", where)
        data = dict(
            family="gpt", num_layers=need("n_layers"), hidden_size=need("d_model"), num_heads=need("n_heads"),
            num_kv_heads=_required(attn, where, model_type, "kv_n_heads", prefix="attn_config."),
            ffn_hidden_size=_required(ffn, where, model_type, "ffn_hidden_size", prefix="ffn_config."),
            max_position_embeddings=need("max_seq_len"), vocab_size=need("vocab_size"), gated_mlp=True,
            norm="layer", norm_bias=False, bias=False, position_embedding="rotary",
            tie_embeddings=config.get("tie_word_embeddings", False), rope_theta=attn.get("rope_theta", 10000.0),
            dropout=any(bool(value) for value in (config.get("emb_pdrop"), config.get("resid_pdrop"),
                                                   attn.get("attn_pdrop"))),
            moe=dict(num_experts=_required(ffn, where, model_type, "moe_num_experts", prefix="ffn_config."),
                     top_k=_required(ffn, where, model_type, "moe_top_k", prefix="ffn_config."),
                     expert_ffn_hidden_size=ffn["ffn_hidden_size"]),
        )
    elif model_type in ("bert", "roberta"):
        positions_field = "max_position_embeddings"
        data = dict(
            family="bert", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), ffn_hidden_size=need("intermediate_size"),
            max_position_embeddings=need("max_position_embeddings"),
            vocab_size=need("vocab_size"), type_vocab_size=config.get("type_vocab_size", 2),
        )
    elif model_type in ("t5", "mt5"):
        positions_field = "n_positions"
        data = dict(
            family="t5", num_encoder_layers=need("num_layers"),
            num_decoder_layers=config.get("num_decoder_layers") or need("num_layers"),
            hidden_size=need("d_model"), num_heads=need("num_heads"), head_dim=need("d_kv"),
            ffn_hidden_size=need("d_ff"), vocab_size=need("vocab_size"),
            gated_mlp=str(config.get("feed_forward_proj", "relu")).startswith("gated"),
            tie_embeddings=config.get("tie_word_embeddings", True),
        )
    elif model_type == "vit":
        positions_field = ""
        data = dict(
            family="vit", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), ffn_hidden_size=need("intermediate_size"),
            image_size=need("image_size"), patch_size=need("patch_size"),
            num_channels=config.get("num_channels", 3),
            num_classes=len(config["id2label"]) if isinstance(config.get("id2label"), dict) else 1000,
        )
    else:
        raise SpecError(
            f"{where}: field `model_type`: value {shown(model_type)} — supported: gpt2, llama, mistral, qwen2, "
            "mixtral, qwen2_moe, qwen3_moe, olmoe, dbrx, deepseek_v2, deepseek_v3, bert, roberta, t5, mt5, vit; or "
            "write a model recipe YAML "
            "(see recipes/models/)"
        )
    if isinstance(data.get("rope_theta"), int) and not isinstance(data["rope_theta"], bool):
        data["rope_theta"] = float(data["rope_theta"])
    if isinstance(data.get("moe"), dict):
        _check_top_k(data["moe"], model_type, where)
    data = {key: value for key, value in data.items() if value is not None}
    if seq_length is None and positions_field:
        # T5's relative positions have no maximum; its configs' n_positions (512) is the length it was trained at.
        seq_length = config.get(positions_field, 512) if model_type in ("t5", "mt5") else data.get(
            "max_position_embeddings")
        notes.append(f"{where}: trained at {seq_length} tokens per sample, the config's `{positions_field}` (no "
                     "sequence length given); set yours with --seq-length or the job's `seq_length`")
    elif seq_length is not None and seq_length > data.get("max_position_embeddings", seq_length):
        raise SpecError(
            f"{where}: field `{positions_field}`: value {data['max_position_embeddings']} — the model takes at most "
            f"{data['max_position_embeddings']} tokens per sample, but a sequence length of {seq_length} was asked "
            f"for (--seq-length or the job's `seq_length`); give at most {data['max_position_embeddings']}"
        )
    if flash_attention is None and model_type != "vit":
        notes.append(f"{where}: attention costed as standard, every head's score matrix stored (the default; the "
                     "runtime target fuses it anyway); give --flash-attention or the job's `flash_attention: true` if "
                     "your training uses FlashAttention")
    try:
        architecture = apply_training_settings({"name": str(name), "source": f"Hugging Face config {path}", **data},
                                               seq_length, flash_attention, where)
    except SpecError as error:
        message = str(error)
        for field, key in _HF_KEYS.get(model_type, {}).items():
            message = message.replace(f"field `{field}`", f"field `{key}`")
        raise SpecError(message) from None
    if architecture.family == "gpt" and architecture.sliding_window is not None \
            and architecture.seq_length > architecture.sliding_window:
        notes.append(f"{where}: sliding window {architecture.sliding_window} < {architecture.seq_length} tokens: "
                     + ("flash attention computes only the window's scores" if architecture.attention == "flash"
                        else "standard attention computes every score and masks those outside the window (with "
                             "--flash-attention only the window is computed)"))
    return architecture


def _required(config: dict[str, Any], where: str, model_type: Any, *keys: str, prefix: str = "") -> Any:
    """The first of `keys` the config sets (not null), or an error naming the first (`prefix`: its section)."""
    for key in keys:
        if key in config and config[key] is not None:
            return config[key]
    raise SpecError(f"{where}: field `{prefix}{keys[0]}` is required for model_type {shown(model_type)}")


def _refuse_mixture_of_experts_gbmw_cannot_read(config: dict[str, Any], where: str) -> None:
    """One error naming the key that makes the model one gbmw cannot cost as the file says: latent attention outside
    DeepSeek's model_types, a mixture-of-experts model_type gbmw does not import, a mixture-of-experts key
    gbmw does not read for this model_type, or experts under a model_type whose code builds a dense model."""
    model_type = config.get("model_type")
    if model_type not in _DEEPSEEK and config.get("kv_lora_rank") is not None:
        raise SpecError(
            f"{where}: field `kv_lora_rank`: value {shown(config['kv_lora_rank'])} — multi-head latent attention under "
            f"model_type {shown(model_type)}, whose transformers code builds standard attention; gbmw imports latent "
            f"attention for {', '.join(_DEEPSEEK)}, or write a model recipe YAML with `latent_attention:`"
        )
    if model_type in _MOE_TYPES:
        raise SpecError(
            f"{where}: field `model_type`: value {shown(model_type)} — a mixture-of-experts architecture gbmw does "
            f"not import (it imports {', '.join(_MOE_KEYS_READ)}); write a model recipe YAML with `moe:` (see "
            "recipes/models/mixtral-8x7b.yaml)"
        )
    read = _MOE_KEYS_READ.get(model_type, ())
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
            f"the model_type whose code routes the experts ({', '.join(_MOE_KEYS_READ)}), or write a model recipe "
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


def _experts(config: dict[str, Any], model_type: str, where: str) -> dict[str, Any] | None:
    """The `moe` mapping of a LLaMA-style mixture of experts (None where no block routes to experts)."""
    if model_type == "mixtral":
        return dict(num_experts=_required(config, where, model_type, "num_local_experts"),
                    top_k=_required(config, where, model_type, "num_experts_per_tok"),
                    expert_ffn_hidden_size=_required(config, where, model_type, "intermediate_size"))
    if model_type == "olmoe":
        return dict(num_experts=_required(config, where, model_type, "num_experts"),
                    top_k=_required(config, where, model_type, "num_experts_per_tok"),
                    expert_ffn_hidden_size=_required(config, where, model_type, "intermediate_size"))
    experts = _required(config, where, model_type, "num_experts")
    moe = dict(num_experts=experts, top_k=_required(config, where, model_type, "num_experts_per_tok"),
               expert_ffn_hidden_size=_required(config, where, model_type, "moe_intermediate_size"))
    if model_type == "qwen2_moe":
        moe.update(shared_experts=1, shared_expert_gate=True,
                   shared_expert_ffn_hidden_size=_required(config, where, model_type,
                                                           "shared_expert_intermediate_size"))
    layers, step = config.get("num_hidden_layers"), config.get("decoder_sparse_step", 1)
    dense_only = config.get("mlp_only_layers") or []
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise SpecError(f"{where}: field `decoder_sparse_step`: value {shown(step)} — must be a whole number from 1 "
                        "(1: every block routes to experts; k: every k-th block)")
    if not isinstance(layers, int) or isinstance(layers, bool):
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


def _latent_attention(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The `latent_attention` mapping of a DeepSeek-V2/V3 config (its values are checked by the architecture)."""
    if config.get("attention_bias", False) is not False:
        raise SpecError(f"{where}: field `attention_bias`: value {shown(config.get('attention_bias'))} — gbmw models "
                        "DeepSeek's latent attention without biases (DeepSeek-V2 and V3 have none); give false")
    model_type = config.get("model_type")
    return dict(q_lora_rank=config.get("q_lora_rank"),
                **{key: _required(config, where, model_type, key)
                   for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")})


def _deepseek_experts(config: dict[str, Any], model_type: str, where: str) -> dict[str, Any] | None:
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
    layers = config.get("num_hidden_layers")
    if not experts or not isinstance(layers, int) or first_dense >= layers:
        return None  # every block dense: costed as a dense model (a bad num_hidden_layers is the architecture's)
    return dict(num_experts=experts, top_k=_required(config, where, model_type, "num_experts_per_tok"),
                expert_ffn_hidden_size=_required(config, where, model_type, "moe_intermediate_size"),
                shared_experts=config.get("n_shared_experts") or 0, dense_blocks=list(range(first_dense)),
                expert_score_bias=model_type == "deepseek_v3" and config.get("topk_method") == "noaux_tc")


def _check_top_k(moe: dict[str, Any], model_type: str, where: str) -> None:
    """A token goes to at most every expert: the error names the config's keys (MixtureOfExperts names its own)."""
    keys = _HF_KEYS[model_type]
    experts, top_k = moe["num_experts"], moe["top_k"]
    if all(isinstance(n, int) and not isinstance(n, bool) for n in (experts, top_k)) and top_k > experts >= 1:
        raise SpecError(f"{where}: field `{keys['moe.top_k']}`: value {top_k} — more experts per token than the "
                        f"{experts} of `{keys['moe.num_experts']}`; give from 1 to {experts}")


def _dbrx_section(config: dict[str, Any], section: str, where: str) -> dict[str, Any]:
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


def _llama_biases(config: dict[str, Any], model_type: str, where: str) -> dict[str, bool]:
    """`bias` (every linear layer) and `qkv_bias` of a LLaMA-style model, as its modeling code builds them."""
    if model_type in ("qwen2", "qwen2_moe"):
        return {"bias": False, "qkv_bias": True}
    if model_type in ("mistral", "mixtral"):
        return {"bias": False}
    attention, mlp = config.get("attention_bias", False), config.get("mlp_bias", False)
    for field, value in (("attention_bias", attention), ("mlp_bias", mlp)):
        if not isinstance(value, bool):
            raise SpecError(f"{where}: field `{field}`: value {shown(value)} — must be true or false")
    if attention != mlp:
        raise SpecError(
            f"{where}: fields `attention_bias` {str(attention).lower()} and `mlp_bias` {str(mlp).lower()} — gbmw "
            "models biases on every linear layer or on none (or on q/k/v only, as Qwen2); write a model recipe YAML "
            "with `bias` and `qkv_bias` for the nearest layout"
        )
    return {"bias": attention}


_QWEN = ("qwen2", "qwen2_moe", "qwen3_moe")
"""Qwen windows attention only with `use_sliding_window`, from block `max_window_layers` on."""


def _sliding_window(config: dict[str, Any], model_type: str, where: str) -> int | None:
    """The attention window of every block, or None where no block has one. Qwen2 windows only with
    `use_sliding_window`, and then only the blocks from `max_window_layers` on; a config's `layer_types` names each
    block's attention. A model whose blocks differ is refused: gbmw gives every block the same attention."""
    window = config.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    if model_type in _QWEN and not config.get("use_sliding_window", False):
        return None
    layers = config.get("num_hidden_layers")
    types = config.get("layer_types")
    if isinstance(types, list):
        windowed = sum(kind == "sliding_attention" for kind in types)
    elif model_type in _QWEN and isinstance(layers, int):
        windowed = max(0, layers - int(config.get("max_window_layers", 28)))
    else:
        windowed = layers
    if windowed == 0:
        return None
    if windowed != layers:
        raise SpecError(f"{where}: field `sliding_window`: value {window} — {windowed} of {layers} blocks attend "
                        "through the window and the others to the whole sequence; gbmw gives every block the same "
                        "attention, so this model cannot be costed as it is")
    return window
