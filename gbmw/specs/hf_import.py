"""A Hugging Face config.json (GPT-2, LLaMA/Mistral/Qwen2, Qwen3, Gemma, Phi-3, BLOOM, OPT, Falcon, BERT/RoBERTa,
T5/mT5, ViT; the mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GPT-OSS, DBRX, DeepSeek-V2/V3) read into
gbmw's architecture types, from the file alone (no transformers import, nothing downloaded or executed).

What the file does not say is asked of the user: the training sequence length (a config states only the longest
the model takes, `max_position_embeddings`; used, with a note, when none is given) and whether attention is fused
(flash attention stores no score matrix; standard attention is assumed, with a note, when not said).

Facts of the architectures that the config leaves implicit (from each model's Hugging Face modeling code):
LLaMA has biases on q/k/v/o only with `attention_bias` and on the MLP only with `mlp_bias`; Mistral has none;
Qwen2 always has q/k/v biases and no others. `head_dim`, where given, sets the attention width
(heads × head_dim, which need not equal hidden_size).

GPT-OSS (transformers' modeling_gpt_oss.py) has biases on q/k/v/o (`attention_bias`) and on its experts,
`head_dim` 64 whatever the hidden size, a learned sink logit per head in every softmax, and alternates windowed and
full attention by `layer_types` (each block costed with its own keys per query).

Mixtures of experts and DeepSeek's latent attention are read by gbmw.specs.hf_experts; BLOOM, OPT and Falcon by
gbmw.specs.hf_dense_decoders; what Qwen3, Gemma and Phi-3 do otherwise than LLaMA by gbmw.specs.hf_llama_variants,
which also refuses Gemma 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gbmw.errors import SpecError
from gbmw.specs.architectures import apply_training_settings, parse_architecture
from gbmw.specs.files import read_json, shown
from gbmw.specs.hf_dense_decoders import DENSE_DECODERS, dense_decoder
from gbmw.specs.hf_experts import (DEEPSEEK, MOE_KEYS_READ, check_gpt_oss_keys, check_top_k, dbrx_section,
                                   deepseek_experts, deepseek_latent_attention, layer_count, llama_style_experts,
                                   refuse_experts_gbmw_cannot_read, required)
from gbmw.specs.hf_llama_variants import (LLAMA_VARIANTS, UNWINDOWED, llama_variant,
                                          refuse_decoders_gbmw_cannot_cost)

_MOE_DECODERS = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")
"""LLaMA-style mixtures of experts read like `_LLAMA_LIKE`, plus their experts; `dbrx` is read apart."""
_LLAMA_LIKE = ("llama", "mistral", "qwen2")
_HF_KEYS_OF_LLAMA_BERT_VIT = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                              "num_kv_heads": "num_key_value_heads", "ffn_hidden_size": "intermediate_size"}
_HF_KEYS = {"gpt2": {"num_layers": "n_layer", "hidden_size": "n_embd", "num_heads": "n_head", "ffn_hidden_size": "n_inner",
                     "max_position_embeddings": "n_positions"},
            "t5": {"num_encoder_layers": "num_layers", "hidden_size": "d_model", "head_dim": "d_kv",
                   "ffn_hidden_size": "d_ff"},
            **{kind: _HF_KEYS_OF_LLAMA_BERT_VIT
               for kind in (*_LLAMA_LIKE, *LLAMA_VARIANTS, "bert", "roberta", "vit")}}
_HF_KEYS["mt5"] = _HF_KEYS["t5"]
_HF_KEYS["mixtral"] = {**_HF_KEYS_OF_LLAMA_BERT_VIT, "moe.num_experts": "num_local_experts",
                       "moe.top_k": "num_experts_per_tok", "moe.expert_ffn_hidden_size": "intermediate_size"}
_HF_KEYS["gpt_oss"] = _HF_KEYS["mixtral"]
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
for _keys in _HF_KEYS.values():
    _keys.setdefault("tie_embeddings", "tie_word_embeddings")


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
    for key, example in (("model_type", '"llama"'), ("_name_or_path", '"meta-llama/Llama-2-7b-hf"')):
        if key in config and not isinstance(config[key], str):  # both are read as names before any field is checked
            raise SpecError(f"{path}: field `{key}`: value {shown(config[key])} — expected a string, e.g. {example}")
    # a model's folder names it when the file is its config.json; any other file is named by itself
    name = config.get("_name_or_path") or (path.parent.name if path.name == "config.json" else "") or path.stem
    where = str(path)
    refuse_experts_gbmw_cannot_read(config, where)
    refuse_decoders_gbmw_cannot_cost(config, where)
    if model_type == "gpt_oss":
        check_gpt_oss_keys(config, where)

    def need(*keys: str) -> Any:
        return required(config, where, model_type, *keys)

    keys_read = _HF_KEYS.get(model_type, {})
    default_seq_length = None

    if model_type == "gpt2":
        positions_field = "n_positions" if "n_positions" in config else "n_ctx"
        data = dict(
            family="gpt", num_layers=need("n_layer"), hidden_size=need("n_embd"), num_heads=need("n_head"),
            ffn_hidden_size=config.get("n_inner"), max_position_embeddings=need("n_positions", "n_ctx"),
            vocab_size=need("vocab_size"), tie_embeddings=config.get("tie_word_embeddings", True),
        )
    elif model_type in _LLAMA_LIKE or model_type in _MOE_DECODERS or model_type in LLAMA_VARIANTS:
        positions_field = "max_position_embeddings"
        variant = llama_variant(config, model_type, where) if model_type in LLAMA_VARIANTS else {}
        data = dict(
            family="gpt", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), num_kv_heads=config.get("num_key_value_heads"),
            head_dim=config.get("head_dim"), ffn_hidden_size=need("intermediate_size"),
            max_position_embeddings=need("max_position_embeddings"), vocab_size=need("vocab_size"),
            gated_mlp=True, norm="rms", position_embedding="rotary",
            tie_embeddings=config.get("tie_word_embeddings", False), dropout=False,
            rope_theta=config.get("rope_theta", 10000.0),
            **({} if variant else _llama_biases(config, model_type, where)),
            **({} if model_type in UNWINDOWED else _windows(config, model_type, where)),
            attention_sinks=model_type == "gpt_oss" or None,
            qk_norm={"qwen3_moe": "head", "olmoe": "full"}.get(model_type),
            moe=llama_style_experts(config, model_type, where) if model_type in _MOE_DECODERS else None,
        )
        data.update(variant)
    elif model_type in DEEPSEEK:
        positions_field = "max_position_embeddings"
        data = dict(
            family="gpt", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), ffn_hidden_size=need("intermediate_size"),
            max_position_embeddings=need("max_position_embeddings"), vocab_size=need("vocab_size"),
            gated_mlp=True, norm="rms", bias=False, position_embedding="rotary",
            tie_embeddings=config.get("tie_word_embeddings", False), dropout=bool(config.get("attention_dropout")),
            rope_theta=config.get("rope_theta", 10000.0), latent_attention=deepseek_latent_attention(config, where),
            moe=deepseek_experts(config, model_type, where),
        )
        if config.get("num_nextn_predict_layers"):
            notes.append(f"{where}: `num_nextn_predict_layers` {config['num_nextn_predict_layers']}: the multi-token "
                         "prediction module is not costed (gbmw plans the main model, as its published parameter "
                         "count does)")
    elif model_type == "dbrx":
        positions_field = "max_seq_len"
        attn, ffn = dbrx_section(config, "attn_config", where), dbrx_section(config, "ffn_config", where)
        data = dict(
            family="gpt", num_layers=need("n_layers"), hidden_size=need("d_model"), num_heads=need("n_heads"),
            num_kv_heads=required(attn, where, model_type, "kv_n_heads", prefix="attn_config."),
            ffn_hidden_size=required(ffn, where, model_type, "ffn_hidden_size", prefix="ffn_config."),
            max_position_embeddings=need("max_seq_len"), vocab_size=need("vocab_size"), gated_mlp=True,
            norm="layer", norm_bias=False, bias=False, position_embedding="rotary",
            tie_embeddings=config.get("tie_word_embeddings", False), rope_theta=attn.get("rope_theta", 10000.0),
            dropout=any(bool(value) for value in (config.get("emb_pdrop"), config.get("resid_pdrop"),
                                                   attn.get("attn_pdrop"))),
            moe=dict(num_experts=required(ffn, where, model_type, "moe_num_experts", prefix="ffn_config."),
                     top_k=required(ffn, where, model_type, "moe_top_k", prefix="ffn_config."),
                     expert_ffn_hidden_size=ffn["ffn_hidden_size"]),
        )
    elif model_type in DENSE_DECODERS:
        decoder = dense_decoder(config, where)
        data, keys_read = decoder.data, {**decoder.keys, "tie_embeddings": "tie_word_embeddings"}
        positions_field = "max_position_embeddings" if "max_position_embeddings" in config else ""
        if seq_length is None:
            seq_length = default_seq_length = decoder.trained_tokens
            notes.append(f"{where}: trained at {seq_length} tokens per sample, {decoder.trained_tokens_note} (no "
                         "sequence length given); set yours with --seq-length or the job's `seq_length`")
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
            "qwen3, gemma, phi3, bloom, opt, falcon (and its first RefinedWeb, RefinedWebModel), mixtral, qwen2_moe, "
            "qwen3_moe, olmoe, gpt_oss, dbrx, deepseek_v2, deepseek_v3, bert, roberta, t5, mt5, vit; or write a model "
            "recipe YAML (see recipes/models/)"
        )
    if data.get("family") == "gpt" and model_type != "gpt2":
        data["rope_scaling"] = _rope_scaling(config, where)
        if data["rope_scaling"] is not None:
            notes.append(f"{where}: rope_scaling {data['rope_scaling']}: costed as plain rotary (it changes no FLOPs or "
                         "memory); the emitted Megatron and DeepSpeed arguments leave it to you, and gbmw's runtime "
                         "does not train it")
    if isinstance(data.get("rope_theta"), int) and not isinstance(data["rope_theta"], bool):
        if abs(data["rope_theta"]) > 1e300:  # beyond a float: the schema's bound names the field
            raise SpecError(f"{where}: field `rope_theta`: value {shown(data['rope_theta'])} — expected a positive "
                            "number such as 10000 or 500000.0")
        data["rope_theta"] = float(data["rope_theta"])
    if isinstance(data.get("moe"), dict):
        check_top_k(data["moe"], _HF_KEYS[model_type], where)
    data = {key: value for key, value in data.items() if value is not None}
    if default_seq_length is not None:
        pass  # said above, with where the length comes from
    elif seq_length is None and positions_field:
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
        for field, key in keys_read.items():
            message = message.replace(f"field `{field}`", f"field `{key}`")
        raise SpecError(message) from None
    if architecture.family == "gpt" and architecture.sliding_window is not None \
            and architecture.seq_length > architecture.sliding_window:
        notes.append(f"{where}: sliding window {architecture.sliding_window} < {architecture.seq_length} tokens: "
                     + ("flash attention computes only the window's scores" if architecture.attention == "flash"
                        else "standard attention computes every score and masks those outside the window (with "
                             "--flash-attention only the window is computed)"))
    return architecture


def _rope_scaling(config: dict[str, Any], where: str) -> str | None:
    """The rotary scaling's type of a config's `rope_scaling` (None without one); anything but a mapping naming
    its type is refused — a silent plain-rotary reading would train another model."""
    scaling = config.get("rope_scaling")
    if scaling is None:
        return None
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    if not isinstance(kind, str) or not kind.replace("_", "").isalnum() or len(kind) > 40:
        raise SpecError(f"{where}: field `rope_scaling`: value {shown(scaling)} — a mapping whose `rope_type` (or "
                        "`type`) names the scaling (linear, dynamic, yarn, llama3, longrope), or null")
    return kind


def _llama_biases(config: dict[str, Any], model_type: str, where: str) -> dict[str, bool]:
    """`bias` (every linear layer) and `qkv_bias` of a LLaMA-style model, as its modeling code builds them."""
    if model_type in ("qwen2", "qwen2_moe"):
        return {"bias": False, "qkv_bias": True}
    if model_type in ("mistral", "mixtral"):
        return {"bias": False}
    if model_type == "gpt_oss":
        if config.get("attention_bias", False) is not True:
            raise SpecError(f"{where}: field `attention_bias`: value {shown(config.get('attention_bias'))} — GPT-OSS's "
                            "experts always have biases, and gbmw models biases on every linear layer or on none; "
                            "give true (as the published GPT-OSS configs do)")
        return {"bias": True}
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


_QWEN = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")
"""Qwen windows attention only with `use_sliding_window`, from block `max_window_layers` on."""


def _windows(config: dict[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """`sliding_window` and `full_attention_blocks`: the window, and the blocks that attend to the whole sequence
    beside it. Qwen2 windows only with `use_sliding_window`, and then only the blocks from `max_window_layers` on; a
    config's `layer_types` names each block's attention (GPT-OSS: `sliding_attention`, `full_attention`)."""
    window = config.get("sliding_window")
    if window is None:
        return {}
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise SpecError(f"{where}: field `sliding_window`: value {shown(window)} — a positive number of tokens each "
                        "query attends to, or null for attention over the whole prefix")
    if model_type in _QWEN and not config.get("use_sliding_window", False):
        return {}
    layers = layer_count(config)
    if layers is None:
        return {"sliding_window": window}  # the architecture's check of num_hidden_layers says what is wrong
    types = config.get("layer_types")
    if types is not None:
        kinds = ("sliding_attention", "full_attention")
        if not isinstance(types, list) or len(types) != layers or any(kind not in kinds for kind in types):
            raise SpecError(f"{where}: field `layer_types`: value {shown(types)} — must list one of "
                            f"{', '.join(kinds)} for each of the {layers} blocks")
        full = [i for i, kind in enumerate(types) if kind == "full_attention"]
    elif model_type in _QWEN:
        first_windowed = config.get("max_window_layers", 28)
        if not isinstance(first_windowed, int) or isinstance(first_windowed, bool) or first_windowed < 0:
            raise SpecError(f"{where}: field `max_window_layers`: value {shown(first_windowed)} — the number of blocks, "
                            "from the first, that attend to the whole sequence (a whole number from 0)")
        full = list(range(min(layers, first_windowed)))
    else:
        full = []
    if len(full) == layers:
        return {}
    return {"sliding_window": window, "full_attention_blocks": full}
