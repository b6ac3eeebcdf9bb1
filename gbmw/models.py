"""Analytic per-layer costs of the Transformer families: GPT, BERT, T5, ViT, Swin (and LLaMA-style GPTs).

A model recipe describes an architecture (`family: gpt`, widths, depths, sequence lengths); this
module turns it into a ModelSpec of LayerSpecs — embedding, blocks and head are each one layer —
for a training precision. Memory follows tensor shapes and dtypes (paper Sec. 5); the activation
accounting per block is that of Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (2022), Sec. 4.1: with 16-bit activations and 1-byte dropout masks a GPT block
stashes s·h·(34 + 5·a·s/h) bytes per sample, of which s·h·(10) stays whole under TP and the rest is
divided. FLOPs count 2 per multiply-add of every matmul, so 3× the forward FLOPs of all layers is
Megatron's model-FLOPs formula 72·B·s·L·h²·(1 + s/6h + V/12hL).

`import_hf_config` reads a Hugging Face config.json (GPT-2, LLaMA/Mistral, BERT/RoBERTa, T5, ViT)
into the same architecture types, reading only the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from gbmw.errors import SpecError
from gbmw.spec import ACTIVATION_DTYPE_BYTES, LayerSpec, ModelSpec, describe_validation_error, read_yaml

TOKEN_ID_BYTES = 8  # int64 token ids are the input of an embedding layer


class _Architecture(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    source: str = ""
    dropout: bool = True
    """Dropout layers stash 1-byte masks (Korthikanti et al.); modern LLMs train without."""
    attention: Literal["standard", "flash"] = "standard"
    """`flash` stashes no s×s attention scores (a log-sum-exp per row instead)."""

    @model_validator(mode="after")
    def _heads_divide(self) -> "_Architecture":
        for hidden, heads in self._head_pairs():
            if heads < 1 or hidden % heads != 0:
                raise ValueError(f"hidden size {hidden} is not divisible by {heads} attention heads")
        return self

    def _head_pairs(self) -> list[tuple[int, int]]:
        return []


class GPTArchitecture(_Architecture):
    """Decoder-only language model (GPT-2/3; LLaMA with `gated_mlp`, `norm: rms`, `bias: false`)."""

    family: Literal["gpt"]
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int | None = Field(default=None, ge=1)
    """Grouped-query attention; None means as many as `num_heads`."""
    ffn_hidden_size: int | None = Field(default=None, ge=1)
    """None means 4 × hidden_size."""
    seq_length: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    gated_mlp: bool = False
    bias: bool = True
    norm: Literal["layer", "rms"] = "layer"
    position_embedding: Literal["learned", "rotary"] = "learned"
    tie_embeddings: bool = True

    def _head_pairs(self) -> list[tuple[int, int]]:
        return [(self.hidden_size, self.num_heads)]


class BERTArchitecture(_Architecture):
    """Encoder-only masked language model with an MLM head and a pooler."""

    family: Literal["bert"]
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    ffn_hidden_size: int | None = Field(default=None, ge=1)
    seq_length: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int | None = Field(default=None, ge=1)
    type_vocab_size: int = Field(default=2, ge=0)

    def _head_pairs(self) -> list[tuple[int, int]]:
        return [(self.hidden_size, self.num_heads)]


class T5Architecture(_Architecture):
    """Encoder-decoder; the encoder and decoder sequence lengths may differ (T5-512/4)."""

    family: Literal["t5"]
    num_encoder_layers: int = Field(ge=1)
    num_decoder_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    head_dim: int | None = Field(default=None, ge=1)
    """T5's d_kv; None means hidden_size / num_heads."""
    ffn_hidden_size: int = Field(ge=1)
    encoder_seq_length: int = Field(ge=1)
    decoder_seq_length: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    gated_mlp: bool = False
    tie_embeddings: bool = True

    def _head_pairs(self) -> list[tuple[int, int]]:
        return [] if self.head_dim is not None else [(self.hidden_size, self.num_heads)]


class ViTArchitecture(_Architecture):
    """Vision Transformer: patch embedding, a class token, encoder blocks, a classifier head."""

    family: Literal["vit"]
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    ffn_hidden_size: int | None = Field(default=None, ge=1)
    image_size: int = Field(ge=1)
    patch_size: int = Field(ge=1)
    num_channels: int = Field(default=3, ge=1)
    num_classes: int = Field(default=1000, ge=1)

    def _head_pairs(self) -> list[tuple[int, int]]:
        return [(self.hidden_size, self.num_heads)]

    @model_validator(mode="after")
    def _patches_tile(self) -> "ViTArchitecture":
        if self.image_size % self.patch_size != 0:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        return self


class SwinArchitecture(_Architecture):
    """Swin Transformer: stages of windowed-attention blocks at halving resolution and doubling width."""

    family: Literal["swin"]
    embed_dim: int = Field(ge=1)
    depths: tuple[int, ...] = Field(min_length=1)
    num_heads: tuple[int, ...] = Field(min_length=1)
    window_size: int = Field(default=7, ge=1)
    image_size: int = Field(default=224, ge=1)
    patch_size: int = Field(default=4, ge=1)
    num_channels: int = Field(default=3, ge=1)
    mlp_ratio: float = Field(default=4.0, gt=0)
    num_classes: int = Field(default=1000, ge=1)

    def _head_pairs(self) -> list[tuple[int, int]]:
        return [(self.embed_dim * 2**stage, heads) for stage, heads in enumerate(self.num_heads)]

    @model_validator(mode="after")
    def _stages_consistent(self) -> "SwinArchitecture":
        if len(self.depths) != len(self.num_heads):
            raise ValueError(f"depths has {len(self.depths)} stages but num_heads has {len(self.num_heads)}")
        side = self.image_size // self.patch_size
        if side % 2 ** (len(self.depths) - 1) != 0:
            raise ValueError(
                f"image_size/patch_size = {side} patches per side cannot halve {len(self.depths) - 1} times"
            )
        return self


Architecture = Annotated[
    Union[GPTArchitecture, BERTArchitecture, T5Architecture, ViTArchitecture, SwinArchitecture],
    Field(discriminator="family"),
]
FAMILIES = ("gpt", "bert", "t5", "vit", "swin")


# ----------------------------------------------------------------------------------------------
# One Transformer block
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockShape:
    """Shapes of one Transformer block for one sample."""

    tokens: int
    hidden: int
    heads: int
    head_dim: int
    kv_heads: int
    ffn: int
    attended_tokens: int
    """Keys each query attends to: the sequence, or a window (Swin)."""
    gated_mlp: bool = False
    bias: bool = True
    norm: str = "layer"
    cross_attention_tokens: int = 0
    """Encoder tokens read by a cross-attention sub-block (T5 decoder); 0 for none."""
    extra_params: int = 0
    """Parameters outside the matmuls and norms (relative position biases), replicated under TP."""


def block_layer(name: str, kind: str, shape: BlockShape, dtype_bytes: int, dropout: bool, flash: bool) -> LayerSpec:
    """Costs of one self-attention (+ optional cross-attention) + MLP block (Korthikanti et al. Sec. 4.1)."""
    s, h, d = shape.tokens, shape.hidden, dtype_bytes
    attention_width = shape.heads * shape.head_dim
    kv_width = shape.kv_heads * shape.head_dim
    mask = 1 if dropout else 0
    norm_params = (2 if shape.norm == "layer" else 1) * h
    norm_statistics = (2 if shape.norm == "layer" else 1) * 4  # fp32 bytes per token kept for the norm's backward
    up_outputs = 2 if shape.gated_mlp else 1

    def attention(query_tokens: int, key_tokens: int, kv_input_tokens: int) -> dict[str, float]:
        weights = h * attention_width + 2 * h * kv_width + attention_width * h
        column_biases = (attention_width + 2 * kv_width) if shape.bias else 0
        row_bias = h if shape.bias else 0
        flops = (
            2 * query_tokens * (h * attention_width + attention_width * h)
            + 2 * kv_input_tokens * (2 * h * kv_width)
            + 4 * query_tokens * key_tokens * attention_width  # scores QK^T and scores × V
        )
        scores_per_head = query_tokens * key_tokens
        if flash:
            score_bytes = shape.heads * query_tokens * 4  # fp32 log-sum-exp per row
        else:
            score_bytes = shape.heads * scores_per_head * (d + (mask + d if dropout else 0))
        split = (
            query_tokens * attention_width * d  # Q
            + 2 * kv_input_tokens * kv_width * d  # K, V
            + score_bytes
            + query_tokens * attention_width * d  # input of the output projection
        )
        # norm input, norm output, the norm's fp32 statistics per token (mean and 1/std; RMSNorm: 1/rms only),
        # dropout mask
        replicated = query_tokens * h * (d + d) + query_tokens * norm_statistics + query_tokens * h * mask
        return dict(
            params=weights + column_biases + row_bias + norm_params,
            tp_split=weights + column_biases,
            flops=flops,
            split=split,
            replicated=replicated,
            allreduce=query_tokens * h * d,
        )

    self_attention = attention(s, shape.attended_tokens, s)
    mlp_weights = h * shape.ffn * up_outputs + shape.ffn * h
    mlp = dict(
        params=mlp_weights + ((shape.ffn * up_outputs + h) if shape.bias else 0) + norm_params,
        tp_split=mlp_weights + (shape.ffn * up_outputs if shape.bias else 0),
        flops=2 * s * mlp_weights,
        split=s * shape.ffn * (up_outputs + 1) * d,  # up-projection output(s) and activation output
        replicated=s * h * (d + d) + s * norm_statistics + s * h * mask,
        allreduce=s * h * d,
    )
    parts = [self_attention, mlp]
    if shape.cross_attention_tokens:
        parts.append(attention(s, shape.cross_attention_tokens, shape.cross_attention_tokens))
    total = {key: sum(part[key] for part in parts) for key in parts[0]}
    boundary = s * h * d
    return LayerSpec(
        name=name,
        kind=kind,
        parameter_count=int(total["params"] + shape.extra_params),
        tp_split_parameter_count=int(total["tp_split"]),
        forward_flops_per_sample=float(total["flops"]),
        boundary_activation_bytes_per_sample=float(boundary),
        # The first norm's input is the boundary itself: it is counted there, not twice.
        intermediate_activation_bytes_per_sample=float(total["replicated"] - boundary),
        intermediate_tp_split_activation_bytes_per_sample=float(total["split"]),
        side_input_bytes_per_sample=float(shape.cross_attention_tokens * h * d),
        tp_allreduce_bytes_per_sample=float(total["allreduce"]),
        attention_heads=shape.heads,
        kv_heads=shape.kv_heads,
    )


def embedding_layer(
    name: str, tokens: int, hidden: int, vocab: int, positions: int, extra_rows: int, dtype_bytes: int,
    dropout: bool, norm: bool,
) -> LayerSpec:
    """Token (vocabulary-parallel under TP) + position embeddings; output all-reduced across TP."""
    d, mask = dtype_bytes, 1 if dropout else 0
    return LayerSpec(
        name=name,
        kind="embedding",
        parameter_count=(vocab + positions + extra_rows) * hidden + (2 * hidden if norm else 0),
        tp_split_parameter_count=vocab * hidden,
        forward_flops_per_sample=0.0,
        boundary_activation_bytes_per_sample=float(tokens * TOKEN_ID_BYTES),
        intermediate_activation_bytes_per_sample=float(tokens * hidden * (mask + (d if norm else 0))),
        intermediate_tp_split_activation_bytes_per_sample=0.0,
        tp_allreduce_bytes_per_sample=float(tokens * hidden * d),
    )


def lm_head_layer(
    name: str, tokens: int, hidden: int, vocab: int, dtype_bytes: int, tied_to: str | None, transform: bool,
    norm_params: int,
) -> LayerSpec:
    """Final norm, (BERT: dense+norm transform), vocabulary projection and cross-entropy.

    The vocabulary-parallel cross-entropy (Megatron's, and torch's on one device) keeps the fp32 softmax of the
    logits, divided by TP; the logits themselves are not kept (the projection keeps its input, and a 16-bit
    logit tensor is freed once copied to fp32). Also kept: the int64 labels, and the norms' fp32 statistics.
    """
    d = dtype_bytes
    transform_weights = hidden * hidden if transform else 0
    params = norm_params + vocab * hidden + (transform_weights + hidden + 2 * hidden if transform else 0)
    statistics = (2 if norm_params == 2 * hidden else 1 if norm_params else 0) + (2 if transform else 0)
    replicated = (
        tokens * hidden * d * (3 if transform else 1)  # norm output (+ dense in, gelu in)
        + tokens * statistics * 4  # fp32 mean and 1/std per token of each LayerNorm (RMSNorm: 1/rms)
        + tokens * TOKEN_ID_BYTES  # the labels
    )
    return LayerSpec(
        name=name,
        kind="head",
        parameter_count=params,
        tp_split_parameter_count=vocab * hidden,
        forward_flops_per_sample=float(2 * tokens * hidden * vocab + 2 * tokens * transform_weights),
        boundary_activation_bytes_per_sample=float(tokens * hidden * d),
        intermediate_activation_bytes_per_sample=float(replicated),
        intermediate_tp_split_activation_bytes_per_sample=float(tokens * vocab * 4),
        tp_allreduce_bytes_per_sample=float(tokens * hidden * d),
        tied_to=tied_to,
        tied_parameter_count=vocab * hidden if tied_to else 0,
    )


# ----------------------------------------------------------------------------------------------
# Families
# ----------------------------------------------------------------------------------------------


def build_model(arch: Any, precision: str) -> ModelSpec:
    """The ModelSpec of an architecture under a training precision."""
    builder = {
        "gpt": _build_gpt,
        "bert": _build_bert,
        "t5": _build_t5,
        "vit": _build_vit,
        "swin": _build_swin,
    }[arch.family]
    layers, sequence_length, hidden_size = builder(arch, ACTIVATION_DTYPE_BYTES[precision])
    return ModelSpec(
        name=arch.name,
        family=arch.family,
        precision=precision,
        sequence_length=sequence_length,
        hidden_size=hidden_size,
        layers=tuple(layers),
        source=arch.source,
    )


def _build_gpt(arch: GPTArchitecture, d: int) -> tuple[list[LayerSpec], int, int]:
    s, h = arch.seq_length, arch.hidden_size
    shape = BlockShape(
        tokens=s, hidden=h, heads=arch.num_heads, head_dim=h // arch.num_heads,
        kv_heads=arch.num_kv_heads or arch.num_heads, ffn=arch.ffn_hidden_size or 4 * h, attended_tokens=s,
        gated_mlp=arch.gated_mlp, bias=arch.bias, norm=arch.norm,
    )
    flash = arch.attention == "flash"
    positions = s if arch.position_embedding == "learned" else 0
    layers = [embedding_layer("embedding", s, h, arch.vocab_size, positions, 0, d, arch.dropout, norm=False)]
    layers += [block_layer(f"decoder.{i}", "decoder", shape, d, arch.dropout, flash) for i in range(arch.num_layers)]
    norm_params = (2 if arch.norm == "layer" else 1) * h
    tied = "embedding" if arch.tie_embeddings else None
    layers.append(lm_head_layer("head", s, h, arch.vocab_size, d, tied, transform=False, norm_params=norm_params))
    return layers, s, h


def _build_bert(arch: BERTArchitecture, d: int) -> tuple[list[LayerSpec], int, int]:
    s, h = arch.seq_length, arch.hidden_size
    shape = BlockShape(
        tokens=s, hidden=h, heads=arch.num_heads, head_dim=h // arch.num_heads, kv_heads=arch.num_heads,
        ffn=arch.ffn_hidden_size or 4 * h, attended_tokens=s,
    )
    flash = arch.attention == "flash"
    positions = arch.max_position_embeddings or s
    layers = [
        embedding_layer("embedding", s, h, arch.vocab_size, positions, arch.type_vocab_size, d, arch.dropout, norm=True)
    ]
    layers += [block_layer(f"encoder.{i}", "encoder", shape, d, arch.dropout, flash) for i in range(arch.num_layers)]
    head = lm_head_layer("head", s, h, arch.vocab_size, d, "embedding", transform=True, norm_params=0)
    # The pooler (dense h×h + bias) and next-sentence classifier (h×2 + bias) sit on the head too.
    pooler_params = h * h + h + 2 * h + 2
    head = head.model_copy(
        update=dict(
            parameter_count=head.parameter_count + pooler_params,
            forward_flops_per_sample=head.forward_flops_per_sample + 2 * (h * h + 2 * h),
        )
    )
    layers.append(head)
    return layers, s, h


def _build_t5(arch: T5Architecture, d: int) -> tuple[list[LayerSpec], int, int]:
    h = arch.hidden_size
    head_dim = arch.head_dim or h // arch.num_heads
    flash = arch.attention == "flash"
    s_enc, s_dec = arch.encoder_seq_length, arch.decoder_seq_length
    relative_bias = 32 * arch.num_heads  # T5's relative-position buckets, in the first block of each stack
    common = dict(hidden=h, heads=arch.num_heads, head_dim=head_dim, kv_heads=arch.num_heads,
                  ffn=arch.ffn_hidden_size, gated_mlp=arch.gated_mlp, bias=False, norm="rms")
    encoder = BlockShape(tokens=s_enc, attended_tokens=s_enc, **common)
    decoder = BlockShape(tokens=s_dec, attended_tokens=s_dec, cross_attention_tokens=s_enc, **common)
    layers = [embedding_layer("encoder_embedding", s_enc, h, arch.vocab_size, 0, 0, d, arch.dropout, norm=False)]
    for i in range(arch.num_encoder_layers):
        shape = encoder if i else BlockShape(**{**encoder.__dict__, "extra_params": relative_bias})
        layers.append(block_layer(f"encoder.{i}", "encoder", shape, d, arch.dropout, flash))
    decoder_embedding = embedding_layer("decoder_embedding", s_dec, h, arch.vocab_size, 0, 0, d, arch.dropout, norm=False)
    layers.append(
        decoder_embedding.model_copy(
            update=dict(
                tied_to="encoder_embedding",
                tied_parameter_count=arch.vocab_size * h,
                # The encoder's final norm runs here, on the encoder output the decoder carries along.
                parameter_count=decoder_embedding.parameter_count + h,
                side_input_bytes_per_sample=float(s_enc * h * d),
            )
        )
    )
    for i in range(arch.num_decoder_layers):
        shape = decoder if i else BlockShape(**{**decoder.__dict__, "extra_params": relative_bias})
        layers.append(block_layer(f"decoder.{i}", "cross_decoder", shape, d, arch.dropout, flash))
    tied = "encoder_embedding" if arch.tie_embeddings else None
    layers.append(lm_head_layer("head", s_dec, h, arch.vocab_size, d, tied, transform=False, norm_params=h))
    return layers, s_enc, h


def _build_vit(arch: ViTArchitecture, d: int) -> tuple[list[LayerSpec], int, int]:
    h = arch.hidden_size
    patches = (arch.image_size // arch.patch_size) ** 2
    s = patches + 1  # the class token
    patch_weights = arch.patch_size**2 * arch.num_channels * h
    pixels = arch.image_size**2 * arch.num_channels
    embedding = LayerSpec(
        name="embedding",
        kind="embedding",
        parameter_count=patch_weights + h + h + s * h,  # patch projection + bias, class token, positions
        tp_split_parameter_count=0,
        forward_flops_per_sample=float(2 * patches * patch_weights),
        boundary_activation_bytes_per_sample=float(pixels * d),
        intermediate_activation_bytes_per_sample=float(s * h * (1 if arch.dropout else 0)),
        intermediate_tp_split_activation_bytes_per_sample=0.0,
    )
    shape = BlockShape(tokens=s, hidden=h, heads=arch.num_heads, head_dim=h // arch.num_heads,
                       kv_heads=arch.num_heads, ffn=arch.ffn_hidden_size or 4 * h, attended_tokens=s)
    flash = arch.attention == "flash"
    layers = [embedding]
    layers += [block_layer(f"encoder.{i}", "encoder", shape, d, arch.dropout, flash) for i in range(arch.num_layers)]
    layers.append(_classifier_head(s, h, arch.num_classes, d))
    return layers, s, h


def _classifier_head(tokens: int, hidden: int, classes: int, d: int) -> LayerSpec:
    """Final norm over all tokens, pooling, and a linear classifier (column-parallel over classes)."""
    return LayerSpec(
        name="head",
        kind="head",
        parameter_count=2 * hidden + hidden * classes + classes,
        tp_split_parameter_count=hidden * classes + classes,
        forward_flops_per_sample=float(2 * hidden * classes),
        boundary_activation_bytes_per_sample=float(tokens * hidden * d),
        intermediate_activation_bytes_per_sample=float(tokens * hidden * d),
        intermediate_tp_split_activation_bytes_per_sample=float(classes * (d + 4)),
        tp_allreduce_bytes_per_sample=float(hidden * d),
    )


def _build_swin(arch: SwinArchitecture, d: int) -> tuple[list[LayerSpec], int, int]:
    side = arch.image_size // arch.patch_size
    c = arch.embed_dim
    flash = arch.attention == "flash"
    window_tokens = arch.window_size**2
    patch_weights = arch.patch_size**2 * arch.num_channels * c
    layers = [
        LayerSpec(
            name="embedding",
            kind="embedding",
            parameter_count=patch_weights + c + 2 * c,  # projection + bias, norm
            tp_split_parameter_count=0,
            forward_flops_per_sample=float(2 * side * side * patch_weights),
            boundary_activation_bytes_per_sample=float(arch.image_size**2 * arch.num_channels * d),
            intermediate_activation_bytes_per_sample=float(side * side * c * d * 2),
            intermediate_tp_split_activation_bytes_per_sample=0.0,
        )
    ]
    for stage, (depth, heads) in enumerate(zip(arch.depths, arch.num_heads)):
        width, tokens = c * 2**stage, (side // 2**stage) ** 2
        if stage:
            # Patch merging: concatenate 2×2 neighbours (4·C/2 channels), norm, project to C.
            in_width, out_tokens = 2 * width, tokens
            layers.append(
                LayerSpec(
                    name=f"merge.{stage}",
                    kind="patch_merging",
                    parameter_count=4 * (width // 2) * width + 2 * 4 * (width // 2),
                    tp_split_parameter_count=4 * (width // 2) * width,
                    forward_flops_per_sample=float(2 * out_tokens * 4 * (width // 2) * width),
                    boundary_activation_bytes_per_sample=float(4 * out_tokens * (width // 2) * d),
                    intermediate_activation_bytes_per_sample=float(out_tokens * in_width * 2 * d),
                    intermediate_tp_split_activation_bytes_per_sample=0.0,
                    tp_allreduce_bytes_per_sample=float(out_tokens * width * d),
                )
            )
        shape = BlockShape(
            tokens=tokens, hidden=width, heads=heads, head_dim=width // heads, kv_heads=heads,
            ffn=int(width * arch.mlp_ratio), attended_tokens=min(window_tokens, tokens),
            extra_params=(2 * arch.window_size - 1) ** 2 * heads,  # relative position bias table
        )
        for block in range(depth):
            layers.append(block_layer(f"stage{stage}.{block}", "encoder", shape, d, arch.dropout, flash))
    last_width, last_tokens = c * 2 ** (len(arch.depths) - 1), (side // 2 ** (len(arch.depths) - 1)) ** 2
    layers.append(_classifier_head(last_tokens, last_width, arch.num_classes, d))
    return layers, side * side, last_width


# ----------------------------------------------------------------------------------------------
# Loading: recipes, profiled layer lists, Hugging Face config.json
# ----------------------------------------------------------------------------------------------

_ARCHITECTURE = TypeAdapter(Architecture)


def parse_architecture(data: dict[str, Any], where: str) -> Any:
    """Validate an architecture mapping (needs `family`) with field-level errors."""
    family = data.get("family")
    if family not in FAMILIES:
        raise SpecError(f"{where}: field `family`: value {family!r} — must be one of {list(FAMILIES)}")
    try:
        return _ARCHITECTURE.validate_python(data)
    except ValidationError as error:
        # pydantic prefixes the discriminator value to each location; drop it.
        message = describe_validation_error(error, where).replace(f"`{family}.", "`")
        raise SpecError(message) from None


def load_model(path: str | Path, precision: str) -> ModelSpec:
    """A ModelSpec from a model recipe (architecture YAML), a profiled layer list, or an HF config.json."""
    path = Path(path)
    if path.suffix == ".json":
        return build_model(import_hf_config(path), precision)
    data = read_yaml(path)
    if "layers" in data:  # a profiled or hand-written layer list
        from gbmw.spec import validate_as

        spec = validate_as(ModelSpec, data, str(path))
        if spec.precision != precision:
            raise SpecError(
                f"{path}: field `precision`: value {spec.precision!r} — its activation bytes were measured "
                f"for {spec.precision}, but the job trains in {precision}; profile again in {precision}"
            )
        return spec
    return build_model(parse_architecture(data, str(path)), precision)


def load_architecture(path: str | Path) -> Any:
    """The architecture of a model recipe, model YAML or HF config.json (what the runtime builds modules from)."""
    path = Path(path)
    if path.suffix == ".json":
        return import_hf_config(path)
    data = read_yaml(path)
    if "layers" in data:
        if isinstance(data.get("architecture"), str):  # a profile carries what it was measured from
            try:
                return parse_architecture(json.loads(data["architecture"]), f"{path} (field `architecture`)")
            except json.JSONDecodeError as error:
                raise SpecError(f"{path}: field `architecture`: not valid JSON ({error.msg})") from None
        raise SpecError(f"{path}: a layer list (hand-written, or a profile without `architecture`) has costs but no "
                        "architecture; the runtime needs the model recipe it was made from (family, hidden_size, …)")
    return parse_architecture(data, str(path))


def import_hf_config(path: str | Path) -> Any:
    """An architecture from a Hugging Face config.json (GPT-2, LLaMA-style, BERT/RoBERTa, T5, ViT)."""
    path = Path(path)
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except json.JSONDecodeError as error:
        raise SpecError(f"{path}: not valid JSON at line {error.lineno}, column {error.colno}: {error.msg}") from None
    if not isinstance(config, dict):
        raise SpecError(f"{path}: expected a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    name = config.get("_name_or_path") or path.parent.name or path.stem
    source = f"Hugging Face config {path}"
    where = str(path)

    def need(*keys: str) -> Any:
        for key in keys:
            if key in config:
                return config[key]
        raise SpecError(f"{where}: field `{keys[0]}` is required for model_type {model_type!r}")

    if model_type == "gpt2":
        data = dict(
            family="gpt", num_layers=need("n_layer"), hidden_size=need("n_embd"), num_heads=need("n_head"),
            ffn_hidden_size=config.get("n_inner"), seq_length=need("n_positions", "n_ctx"),
            vocab_size=need("vocab_size"), tie_embeddings=config.get("tie_word_embeddings", True),
        )
    elif model_type in ("llama", "mistral", "qwen2"):
        data = dict(
            family="gpt", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), num_kv_heads=config.get("num_key_value_heads"),
            ffn_hidden_size=need("intermediate_size"), seq_length=need("max_position_embeddings"),
            vocab_size=need("vocab_size"), gated_mlp=True, bias=False, norm="rms", position_embedding="rotary",
            tie_embeddings=config.get("tie_word_embeddings", False), dropout=False,
        )
    elif model_type in ("bert", "roberta"):
        data = dict(
            family="bert", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), ffn_hidden_size=need("intermediate_size"),
            seq_length=need("max_position_embeddings"), max_position_embeddings=need("max_position_embeddings"),
            vocab_size=need("vocab_size"), type_vocab_size=config.get("type_vocab_size", 2),
        )
    elif model_type in ("t5", "mt5"):
        seq = config.get("n_positions", 512)
        data = dict(
            family="t5", num_encoder_layers=need("num_layers"),
            num_decoder_layers=config.get("num_decoder_layers") or need("num_layers"),
            hidden_size=need("d_model"), num_heads=need("num_heads"), head_dim=need("d_kv"),
            ffn_hidden_size=need("d_ff"), encoder_seq_length=seq, decoder_seq_length=seq,
            vocab_size=need("vocab_size"),
            gated_mlp=str(config.get("feed_forward_proj", "relu")).startswith("gated"),
            tie_embeddings=config.get("tie_word_embeddings", True),
        )
    elif model_type == "vit":
        data = dict(
            family="vit", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), ffn_hidden_size=need("intermediate_size"),
            image_size=need("image_size"), patch_size=need("patch_size"),
            num_channels=config.get("num_channels", 3),
            num_classes=len(config["id2label"]) if isinstance(config.get("id2label"), dict) else 1000,
        )
    else:
        raise SpecError(
            f"{where}: field `model_type`: value {model_type!r} — supported: gpt2, llama, mistral, qwen2, "
            "bert, roberta, t5, mt5, vit; or write a model recipe YAML (see recipes/models/)"
        )
    data = {key: value for key, value in data.items() if value is not None}
    return parse_architecture({"name": str(name), "source": source, **data}, where)
