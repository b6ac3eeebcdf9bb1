"""The dense decoders BLOOM, OPT and Falcon in a Hugging Face config.json (gbmw.specs.hf_import reads the rest), as
transformers' modeling code builds them, and the one-line refusal of what gbmw cannot cost as the file says.

BLOOM (modeling_bloom.py): token embeddings, a LayerNorm on them (`word_embeddings_layernorm`), ALiBi positions (no
parameters, no maximum length), fused QKV and every linear with a bias, an MLP of 4 × hidden_size whatever `n_inner`
says, GELU, LayerNorms, the head tied to the embeddings. `n_embed` overrides `hidden_size`; `n_layer` / `n_head` are
also read as `num_hidden_layers` / `num_attention_heads`. `seq_length` (in some configs) is the length it was trained
at; BigScience trained every BLOOM at 2048 tokens, the default here.

OPT (modeling_opt.py): learned positions of `max_position_embeddings` + 2 rows (the first two are never used),
q/k/v/out and fc1/fc2 with biases (`enable_bias`), an MLP of `ffn_dim`, ReLU (`activation_function`), a final
LayerNorm when `do_layer_norm_before`, dropout `dropout` on the hidden states and `attention_dropout` on the
probabilities. OPT-350m's post-norm blocks and 512-wide embeddings with project_in/out are refused by name.

Falcon (modeling_falcon.py): rotary positions, or ALiBi (`alibi`); `bias` on every linear or none; an MLP of
`ffn_hidden_size` (4 × hidden) with `activation` (GELU). Its attention: with `new_decoder_architecture`
(Falcon-40B/180B) `num_kv_heads` grouped key/value heads, and attention and MLP side by side on two norms (`ln_attn`,
`ln_mlp`; one with `num_ln_in_parallel_attn: 1`); otherwise one key/value head with `multi_query` (whatever
`num_kv_heads` says), all heads without, attention and MLP side by side on one norm with `parallel_attn`, one after
the other without. The configs TII first published (`model_type` RefinedWebModel for Falcon-7B, RefinedWeb for
Falcon-40B, read by the checkpoints' own code) name the sizes `n_layer`, `n_head`, `n_head_kv`; RefinedWeb is the new
decoder architecture. Keys that change no cost (token ids, init, eps, `pretraining_tp`, `slow_but_exact`,
`offset_alibi`, fused-kernel switches) are not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gbmw.errors import SpecError
from gbmw.specs.files import shown
from gbmw.specs.hf_experts import required

FALCON = ("falcon", "RefinedWeb", "RefinedWebModel")
DENSE_DECODERS = ("bloom", "opt", *FALCON)
BLOOM_TRAINED_TOKENS = 2048
"""The sequence length BigScience trained every BLOOM at (the model cards: "Sequence length of 2048 tokens")."""
FALCON_POSITIONS = 2048
"""transformers' FalconConfig default `max_position_embeddings` (the length Falcon-7B/40B were trained at): the
sequence length when a config gives neither it nor one."""
_ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}


@dataclass
class DenseDecoder:
    """What the config says, as gbmw's architecture fields, and how to tell the user about it."""

    data: dict[str, Any]
    keys: dict[str, str]
    """gbmw's field → the config key it was read from (an error about the field names the key)."""
    trained_tokens: int
    """The sequence length when none is given."""
    trained_tokens_note: str
    notes: list[str] = field(default_factory=list)


def dense_decoder(config: dict[str, Any], where: str) -> DenseDecoder:
    """The architecture fields of a BLOOM, OPT or Falcon config.json (`model_type` in DENSE_DECODERS)."""
    model_type = config["model_type"]
    if model_type == "bloom":
        return _bloom(config, where)
    if model_type == "opt":
        return _opt(config, where)
    return _falcon(config, where, model_type)


def _one_of(config: dict[str, Any], where: str, model_type: str, *keys: str) -> tuple[Any, str]:
    """The value of the one of `keys` the config sets (aliases of one setting), and its key; two different values
    are refused."""
    given = [key for key in keys if config.get(key) is not None]
    if len({str(config[key]) for key in given}) > 1:
        raise SpecError(f"{where}: fields {' and '.join(f'`{key}` {shown(config[key])}' for key in given)} — two names "
                        f"of one setting of model_type {shown(model_type)} with different values; keep one")
    if not given:
        required(config, where, model_type, keys[0])
    return config[given[0]], given[0]


def flag(config: dict[str, Any], where: str, key: str, default: bool) -> bool:
    """The config's true/false `key` (`default` where absent); anything else is refused."""
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"{where}: field `{key}`: value {shown(value)} — must be true or false")
    return value


def drops(config: dict[str, Any], where: str, key: str, default: float) -> bool:
    """Whether the dropout probability `key` drops anything."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise SpecError(f"{where}: field `{key}`: value {shown(value)} — a dropout probability from 0 to below 1")
    return value > 0


def refuse_value(where: str, key: str, value: Any, why: str) -> None:
    """The one-line refusal of a config's `key` whose `value` gbmw cannot cost as the file says, and `why`."""
    raise SpecError(f"{where}: field `{key}`: value {shown(value)} — {why}")


def _dropouts(config: dict[str, Any], where: str, hidden_key: str, hidden_default: float,
              attention_key: str) -> dict[str, Any]:
    """gbmw's `dropout` (any dropout layer) and `attention_dropout` (on the probabilities, where it differs)."""
    hidden, attention = (drops(config, where, hidden_key, hidden_default),
                         drops(config, where, attention_key, 0.0))
    return {"dropout": hidden or attention, "attention_dropout": attention if attention != hidden else None}


def _activation(config: dict[str, Any], where: str, key: str, default: str) -> str:
    value = config.get(key, default)
    if not isinstance(value, str) or value not in _ACTIVATIONS:
        refuse_value(where, key, value, f"gbmw costs a dense MLP with {' or '.join(_ACTIVATIONS)} (what they keep "
                     "for the backward differs); write a model recipe YAML for the nearest")
    return _ACTIVATIONS[value]


def _bloom(config: dict[str, Any], where: str) -> DenseDecoder:
    layers, layers_key = _one_of(config, where, "bloom", "n_layer", "num_hidden_layers")
    heads, heads_key = _one_of(config, where, "bloom", "n_head", "num_attention_heads")
    hidden_key = "n_embed" if config.get("n_embed") is not None else "hidden_size"
    hidden = required(config, where, "bloom", hidden_key)
    if flag(config, where, "apply_residual_connection_post_layernorm", False):
        refuse_value(where, "apply_residual_connection_post_layernorm", True,
                     "gbmw models the residual around each norm, as every published BLOOM has it (false)")
    inner = config.get("n_inner")
    if inner is not None and (not isinstance(hidden, int) or inner != 4 * hidden):
        refuse_value(where, "n_inner", inner, "transformers' BLOOM builds an MLP of 4 × hidden_size whatever "
                     "n_inner says; give null (the published configs do)")
    trained = config.get("seq_length", BLOOM_TRAINED_TOKENS)
    data = dict(family="gpt", num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=config.get(
        "vocab_size", 250880), norm="layer", bias=True, position_embedding="alibi", embedding_norm=True,
        tie_embeddings=config.get("tie_word_embeddings", True),
        **_dropouts(config, where, "hidden_dropout", 0.0, "attention_dropout"))
    note = (f"the config's `seq_length`" if "seq_length" in config else
            "the length BigScience trained BLOOM at (ALiBi sets no maximum)")
    return DenseDecoder(data, {"num_layers": layers_key, "num_heads": heads_key, "hidden_size": hidden_key},
                        trained, note)


def _opt(config: dict[str, Any], where: str) -> DenseDecoder:
    def need(key: str) -> Any:
        return required(config, where, "opt", key)

    hidden = need("hidden_size")
    projection = config.get("word_embed_proj_dim", hidden)
    if projection != hidden:
        refuse_value(where, "word_embed_proj_dim", projection,
                     f"embeddings narrower than hidden_size {hidden} (OPT-350m's project_in/project_out) are not "
                     "modelled by gbmw; write a model recipe YAML for the nearest")
    if not flag(config, where, "do_layer_norm_before", True):
        refuse_value(where, "do_layer_norm_before", False, "post-norm blocks without a final norm (OPT-350m) are "
                     "not modelled by gbmw, which norms before each sub-block")
    for key, bad in (("_remove_final_layer_norm", True), ("layer_norm_elementwise_affine", False)):
        if flag(config, where, key, not bad) == bad:
            refuse_value(where, key, bad, "LayerNorms without their weights, or no final norm, are not modelled by "
                         f"gbmw; give {str(not bad).lower()} (the published OPT configs do)")
    for key in ("activation_dropout", "layerdrop"):
        if drops(config, where, key, 0.0):
            refuse_value(where, key, config[key], "gbmw does not model dropout after the MLP's activation or "
                         "dropped layers; give 0.0 (the published OPT configs do)")
    data = dict(family="gpt", num_layers=need("num_hidden_layers"), hidden_size=hidden,
                num_heads=need("num_attention_heads"), ffn_hidden_size=need("ffn_dim"),
                max_position_embeddings=need("max_position_embeddings"), vocab_size=need("vocab_size"),
                norm="layer", bias=flag(config, where, "enable_bias", True), position_embedding="learned",
                position_offset=2, mlp_activation=_activation(config, where, "activation_function", "relu"),
                tie_embeddings=config.get("tie_word_embeddings", True),
                **_dropouts(config, where, "dropout", 0.1, "attention_dropout"))
    return DenseDecoder(data, {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                               "ffn_hidden_size": "ffn_dim"},
                        data["max_position_embeddings"], "the config's `max_position_embeddings`")


def _falcon(config: dict[str, Any], where: str, model_type: str) -> DenseDecoder:
    old = model_type != "falcon"
    keys = {"num_layers": "n_layer", "num_heads": "n_head", "num_kv_heads": "n_head_kv"} if old else {
        "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "num_kv_heads": "num_kv_heads"}
    hidden_key = "n_embed" if config.get("n_embed") is not None else "hidden_size"
    keys["hidden_size"] = hidden_key
    heads = required(config, where, model_type, keys["num_heads"])
    new_architecture = model_type == "RefinedWeb" or flag(config, where, "new_decoder_architecture", False)
    parallel = flag(config, where, "parallel_attn", True) if not old else required(config, where, model_type,
                                                                                    "parallel_attn")
    multi_query = flag(config, where, "multi_query", True) if model_type != "RefinedWebModel" else required(
        config, where, model_type, "multi_query")
    kv_heads = required(config, where, model_type, "n_head_kv") if model_type == "RefinedWeb" else config.get(
        keys["num_kv_heads"])
    norms = config.get("num_ln_in_parallel_attn")
    if new_architecture:
        if not parallel:
            refuse_value(where, "parallel_attn", False, "with new_decoder_architecture transformers builds the "
                         "sequential block's norms but runs the parallel block; give true")
        if norms not in (None, 1, 2):
            refuse_value(where, "num_ln_in_parallel_attn", norms, "one shared norm (1) or two (2, the default)")
        norms = norms or 2
    else:
        if norms not in (None, 1):
            refuse_value(where, "num_ln_in_parallel_attn", norms, "without new_decoder_architecture transformers "
                         "runs one norm before attention and MLP; give null or 1")
        if not multi_query and kv_heads not in (None, heads):
            refuse_value(where, keys["num_kv_heads"], kv_heads, "grouped key/value heads need "
                         f"new_decoder_architecture (without it and multi_query every one of the {heads} heads "
                         "has its own); give null")
        kv_heads = 1 if multi_query else None
        norms = 1 if parallel else 0
    if flag(config, where, "apply_residual_connection_post_layernorm", False):
        refuse_value(where, "apply_residual_connection_post_layernorm", True,
                     "the residual after the norm is run by Falcon's own code, not by transformers'; give false")
    alibi = flag(config, where, "alibi", False)
    positions = config.get("max_position_embeddings")
    data = dict(family="gpt", num_layers=required(config, where, model_type, keys["num_layers"]),
                hidden_size=required(config, where, model_type, hidden_key), num_heads=heads, num_kv_heads=kv_heads,
                ffn_hidden_size=config.get("ffn_hidden_size"), max_position_embeddings=positions,
                vocab_size=config.get("vocab_size", 65024), norm="layer", bias=flag(config, where, "bias", False),
                position_embedding="alibi" if alibi else "rotary", rope_theta=config.get("rope_theta", 10000.0),
                mlp_activation=_activation(config, where, "activation", "gelu"), parallel_attention_norms=norms,
                tie_embeddings=config.get("tie_word_embeddings", True),
                **_dropouts(config, where, "hidden_dropout", 0.0, "attention_dropout"))
    note = ("the config's `max_position_embeddings`" if positions else "transformers' FalconConfig default "
            "`max_position_embeddings` (the config gives none; rotary and ALiBi positions set no maximum)")
    keys["ffn_hidden_size"] = "ffn_hidden_size"
    return DenseDecoder(data, keys, positions or FALCON_POSITIONS, note)
