"""Qwen3, Gemma and Phi-3 in a Hugging Face config.json: LLaMA-shaped decoders (RMSNorm before attention and before
a gated MLP, rotary positions, grouped-query attention; gbmw.specs.hf_import reads what they share with LLaMA) that
differ in a few places, read as transformers' modeling code builds them; and the one-line refusal of Gemma 2, whose
blocks gbmw cannot cost.

Qwen3 (modeling_qwen3.py): an RMSNorm over head_dim on the queries and one on the keys (`q_norm`, `k_norm`: gbmw's
`qk_norm: head`); `head_dim` 128 where the file gives none, whatever hidden_size / heads is; `attention_bias` puts
biases on q, k, v and o alike, never on the MLP; Qwen2's windows (`use_sliding_window`, `max_window_layers`,
`layer_types`).

Gemma (modeling_gemma.py): `head_dim` 256 where the file gives none; a GeGLU MLP (`hidden_act`: transformers 5 runs
"gelu" as the tanh GELU); RMSNorms that scale by 1 + weight (the same parameters and cost as LLaMA's); the token
embeddings multiplied by √hidden_size; the head tied to the embeddings unless `tie_word_embeddings` is false;
`attention_bias` as Qwen3's; no sliding window.

Phi-3 (modeling_phi3.py; Phi-3/3.5-mini and -medium, Phi-4 and Phi-4-mini): q, k and v in one `qkv_proj` and gate and
up in one `gate_up_proj` — the same weights and FLOPs as separate ones — all without biases (its `attention_bias`
is not read); SwiGLU; `sliding_window` on every block; dropout `resid_pdrop` after attention and after the MLP and
`attention_dropout` on the probabilities, none on the embeddings (transformers' Phi-3 does not read `embd_pdrop`).
`partial_rotary_factor` and `original_max_position_embeddings` change no cost.

Dropout on the attention probabilities alone (`attention_dropout` of Qwen3, Gemma, Phi-3) is gbmw's
`attention_dropout` without `dropout`.
"""

from __future__ import annotations

from typing import Any

from gbmw.errors import SpecError
from gbmw.specs.files import shown
from gbmw.specs.hf_dense_decoders import drops, refuse_value

LLAMA_VARIANTS = ("qwen3", "gemma", "phi3")
UNWINDOWED = ("gemma",)
"""Variants whose attention transformers never windows, whatever `sliding_window` says."""
_DEFAULT_HEAD_DIM = {"qwen3": 128, "gemma": 256}
"""transformers' default `head_dim` of each variant that has one (Phi-3's is hidden_size / heads)."""
_GATES = {**{name: "gelu" for name in ("gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_python",
                                       "gelu_accurate")}, "silu": "silu", "swish": "silu"}
"""transformers' activation names → gbmw's `gated_activation`: each GELU and SiLU keeps its input for the backward,
so the variants of one cost the same."""
_DEFAULT_ACTIVATION = {"qwen3": "silu", "gemma": "gelu_pytorch_tanh", "phi3": "silu"}
_NAMES = {"qwen3": "Qwen3", "gemma": "Gemma", "phi3": "Phi-3"}
REFUSED_DECODERS = {
    "gemma2": "Gemma 2 norms each sub-block's output as well as its input (four RMSNorms per block: "
              "post_attention_layernorm, pre_feedforward_layernorm and post_feedforward_layernorm beside "
              "input_layernorm) and soft-caps its attention scores (`attn_logit_softcapping`) and logits "
              "(`final_logit_softcapping`), which change its parameters and stored activations and which gbmw does "
              "not model; write a model recipe YAML for the nearest layout (see recipes/models/)",
}
"""model_type → why gbmw cannot cost it: a decoder transformers builds that gbmw's layouts do not express."""


def refuse_decoders_gbmw_cannot_cost(config: dict[str, Any], where: str) -> None:
    """One line naming `model_type` and what gbmw would miss, for a decoder of REFUSED_DECODERS."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in REFUSED_DECODERS:
        raise SpecError(f"{where}: field `model_type`: value {shown(model_type)} — {REFUSED_DECODERS[model_type]}")


def llama_variant(config: dict[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """gbmw's architecture fields in which a Qwen3, Gemma or Phi-3 config (`model_type` in LLAMA_VARIANTS) differs
    from what gbmw.specs.hf_import reads for LLaMA; they replace those."""
    name = _NAMES[model_type]
    head_dim = config.get("head_dim")
    fields: dict[str, Any] = dict(
        head_dim=_DEFAULT_HEAD_DIM.get(model_type) if head_dim is None else head_dim,
        gated_activation=_gate(config, model_type, where), bias=False, qkv_bias=None,
        qk_norm="head" if model_type == "qwen3" else None, scaled_embeddings=model_type == "gemma" or None,
        tie_embeddings=config.get("tie_word_embeddings", model_type == "gemma"))
    if model_type != "phi3" and config.get("attention_bias", False) is not False:
        refuse_value(where, "attention_bias", config["attention_bias"],
                     f"{name} puts biases on q, k, v and the output projection but never on the MLP, and gbmw models "
                     "biases on every linear layer or on q/k/v alone; give false (as the published configs do)")
    if model_type == "phi3" and drops(config, where, "resid_pdrop", 0.0):
        refuse_value(where, "resid_pdrop", config["resid_pdrop"],
                     "gbmw's dropout on the hidden states comes with one on the embeddings, which transformers' "
                     "Phi-3 does not run; give 0.0 (as the published configs do)")
    fields.update(dropout=False, attention_dropout=drops(config, where, "attention_dropout", 0.0) or None)
    return fields


def _gate(config: dict[str, Any], model_type: str, where: str) -> str:
    """The gated MLP's activation: `hidden_act`, which transformers 5 reads (Gemma's `hidden_activation`, which
    earlier releases read instead, must not name another kind)."""
    value = config.get("hidden_act", _DEFAULT_ACTIVATION[model_type])
    if not isinstance(value, str) or value not in _GATES:
        refuse_value(where, "hidden_act", value, "gbmw costs a gated MLP with a GELU or SiLU gate (GeGLU or SwiGLU: "
                                                 f"{', '.join(_GATES)}); write a model recipe YAML for the nearest")
    other = config.get("hidden_activation") if model_type == "gemma" else None
    if other is not None and (not isinstance(other, str) or _GATES.get(other) != _GATES[value]):
        raise SpecError(f"{where}: fields `hidden_act` {shown(value)} and `hidden_activation` {shown(other)} — "
                        "transformers 5 runs hidden_act and earlier releases hidden_activation; give one activation")
    return _GATES[value]
