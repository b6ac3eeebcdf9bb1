"""Model architectures as recipes describe them: the Transformer families gbmw plans (GPT, BERT, T5, ViT,
Swin) as typed, validated records — widths, depths, heads, sequence lengths, and the options that change
costs (gated MLPs, RMSNorm, rotary positions, grouped-query or multi-head latent attention, flash attention,
dropout).

`gbmw.specs.models` turns an architecture into the planner's per-layer costs; the runtime builds its modules
from the same record, and the Megatron emitter reads its flags from it. A ModelSpec carries the
architecture it was built from, so nothing downstream re-reads the model's file.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from gbmw.errors import SpecError
from gbmw.specs.files import shown
from gbmw.specs.latent_attention_spec import MultiLatentAttention
from gbmw.specs.projection_widths import check_fused_projection_widths
from gbmw.specs.schema import MAX_LAYERS, MAX_SEQUENCE, MAX_WIDTH, Frozen, Items, check_kind, describe_validation_error


class _Architecture(Frozen):
    name: str
    source: str = ""
    dropout: bool = True
    """Dropout layers stash 1-byte masks (Korthikanti et al.); modern LLMs train without."""
    attention: Literal["standard", "flash", "standard-with-raw-scores"] = "standard"
    """`flash` stashes no s×s attention scores (a log-sum-exp per row instead); `standard-with-raw-scores` also
    stashes the raw scores QKᵀ before scaling and softmax, as the paper's testbed did (gbmw.specs.transformer_layers)."""

    @model_validator(mode="after")
    def _heads_divide(self) -> "_Architecture":
        for hidden, heads in self._head_pairs():
            if heads < 1 or hidden % heads != 0:
                raise ValueError(f"hidden size {hidden} is not divisible by {heads} attention heads")
        return self

    def _head_pairs(self) -> list[tuple[int, int]]:
        return []


class MixtureOfExperts(Frozen):
    """The routed feed-forward of a mixture-of-experts decoder (Shazeer et al. 2017, Lepikhin et al. "GShard" 2020,
    Jiang et al. "Mixtral of Experts" 2024; DeepSeek-MoE's shared experts, Dai et al. 2024). In each MoE block a
    router (a linear layer, hidden → experts, no bias) scores every token, the token goes to its `top_k` experts —
    each an MLP of the model's kind (gated or not) of width `expert_ffn_hidden_size` — and their outputs are summed
    with the router's weights; `shared_experts` MLPs run on every token beside them. The other blocks keep the
    model's dense MLP."""

    num_experts: int = Field(ge=2, le=MAX_WIDTH)
    """Routed experts per MoE block."""
    top_k: int = Field(ge=1, le=MAX_WIDTH)
    """Experts each token is routed to."""
    expert_ffn_hidden_size: int = Field(ge=1, le=MAX_WIDTH)
    """Width of one routed expert's MLP (Mixtral: the model's FFN; Qwen-MoE, DeepSeek: a narrower one)."""
    shared_experts: int = Field(default=0, ge=0, le=64)
    """MLPs every token passes through beside its routed experts (DeepSeek, Qwen2-MoE)."""
    shared_expert_ffn_hidden_size: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """Width of each shared expert's MLP; None: `expert_ffn_hidden_size`."""
    shared_expert_gate: bool = False
    """A sigmoid gate (a hidden → 1 linear) scales the shared experts' output (Qwen2-MoE)."""
    expert_score_bias: bool = False
    """A learned bias per expert added to the routing scores when the top-k are chosen (DeepSeek-V3's
    auxiliary-loss-free balancing, `e_score_correction_bias`; megatron-core's `--moe-router-enable-expert-bias`):
    `num_experts` numbers per MoE block, counted as parameters as the checkpoint stores them (updated by a balancing
    rule, not by gradients: their few optimizer states are an over-count of bytes)."""
    dense_blocks: Items[Annotated[int, Field(ge=0, le=MAX_LAYERS)]] = Field(default=(), max_length=MAX_LAYERS)
    """Indices (from 0) of the blocks whose MLP stays dense: DeepSeek's first `first_k_dense_replace` blocks,
    Qwen's `mlp_only_layers` and the blocks `decoder_sparse_step` skips. Every other block is an MoE block."""
    capacity_factor: float | None = Field(default=None, gt=0, le=64)
    """Each expert takes at most capacity_factor × (tokens × top_k / experts) tokens per micro-batch, padded to
    exactly that many (token dropping, GShard); None: dropless (every routed token is computed)."""
    router_bias: bool = False
    """A learned bias per expert on the router's logits (GPT-OSS: `nn.Linear(hidden, experts, bias=True)`;
    megatron-core's router has one wherever `add_bias_linear` is set)."""
    load_imbalance: float = Field(default=1.0, ge=1.0, le=64)
    """An ASSUMPTION, not a fact of the model: with dropless routing and expert parallelism, the routed tokens the
    busiest rank of an EP group receives over the mean. 1.0 assumes perfectly balanced routing (what an auxiliary
    balancing loss aims at); the estimate states it. Ignored under a capacity factor (padding fixes the load)."""

    @property
    def shared_ffn_hidden_size(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size

    @model_validator(mode="after")
    def _top_k_within_experts(self) -> "MixtureOfExperts":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} > num_experts {self.num_experts}: a token is routed to at most "
                             f"every expert; give top_k from 1 to {self.num_experts}")
        if len(set(self.dense_blocks)) != len(self.dense_blocks):
            raise ValueError(f"dense_blocks {list(self.dense_blocks)} names a block twice")
        return self


class GPTArchitecture(_Architecture):
    """Decoder-only language model (GPT-2/3; LLaMA with `gated_mlp`, `norm: rms`, `bias: false`)."""

    family: Literal["gpt"]
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=MAX_WIDTH)
    num_heads: int = Field(ge=1, le=MAX_WIDTH)
    num_kv_heads: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """Grouped-query attention; None means as many as `num_heads`."""
    head_dim: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """Width of one attention head; None means hidden_size / num_heads (Mistral-Nemo: 128 with 32 heads on a
    hidden size of 5120, so the attention is 4096 wide)."""
    ffn_hidden_size: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """None means 4 × hidden_size."""
    seq_length: int = Field(ge=1, le=MAX_SEQUENCE)
    """Tokens per training sample."""
    max_position_embeddings: int | None = Field(default=None, ge=1, le=MAX_SEQUENCE)
    """The longest sequence the model takes (the rows of a learned position table); None means seq_length."""
    vocab_size: int = Field(ge=1, le=MAX_WIDTH)
    gated_mlp: bool = False
    gated_activation: Literal["silu", "gelu"] = "silu"
    """The gate's activation in a `gated_mlp`: SiLU (SwiGLU: LLaMA, Qwen) or GELU (GeGLU: Gemma's tanh GELU). The same
    cost (each keeps its input); gbmw's runtime and Megatron's `--swiglu` build SiLU only."""
    bias: bool = True
    """Biases on every linear layer (Q, K, V, the attention output projection, the MLP)."""
    qkv_bias: bool | None = None
    """Biases on the Q, K and V projections; None means as `bias` (Qwen2: true, with `bias` false)."""
    norm: Literal["layer", "rms"] = "layer"
    norm_bias: bool = True
    """LayerNorm's learned shift beside its scale (2 × width parameters per norm); false: the scale only, one
    parameter per element (DBRX's `LayerNorm(bias=False)`). RMSNorm has no shift, whatever this says."""
    qk_norm: Literal["none", "head", "full"] = "none"
    """Norms (of the model's `norm` kind) on the queries and keys before the scores. `head`: one norm over
    head_dim shared by every head of Q and one of K (Qwen3, Megatron's `--qk-layernorm`), 2 × head_dim weights,
    whole on every TP rank; `full`: one norm over the whole Q projection (heads × head_dim) and one over K
    (kv_heads × head_dim) (OLMoE), weights split with the heads under TP (the norm's statistic then needs a
    per-token sum over the TP group, a few bytes, not costed)."""
    position_embedding: Literal["learned", "rotary", "alibi"] = "learned"
    """`alibi` (BLOOM, Falcon-RW): a fixed bias per head and key distance added to the scores — no parameters, and
    one add per score (not counted, as the softmax's own ops are not)."""
    rope_theta: float = Field(default=10000.0, gt=0, le=1e12)
    """Rotary base frequency; no effect on costs (the model's runtime reads it)."""
    rope_scaling: str | None = Field(default=None, min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_]+$")
    """The rotary embedding's frequency scaling (a Hugging Face `rope_scaling.rope_type`: linear, dynamic, yarn,
    llama3, longrope…): the same cost as plain rotary; gbmw's runtime trains plain rotary only."""
    sliding_window: int | None = Field(default=None, ge=1, le=MAX_SEQUENCE)
    """Each query attends to at most this many keys (Mistral-7B v0.1: 4096); None: the whole causal prefix.
    Only flash attention skips the keys outside the window; standard attention computes the whole score matrix
    and masks it, so the window changes costs only with `attention: flash` and a sequence longer than it."""
    full_attention_blocks: Items[Annotated[int, Field(ge=0, le=MAX_LAYERS)]] = Field(default=(),
                                                                                      max_length=MAX_LAYERS)
    """Indices (from 0) of the blocks that attend to the whole causal prefix although `sliding_window` is set (a
    config.json's `layer_types`: GPT-OSS alternates windowed and full blocks, the odd ones full)."""
    attention_sinks: bool = False
    """A learned logit per head joins every row's softmax (GPT-OSS's `sinks`; megatron-core's `softmax_type:
    learnable`): one parameter per head and block, split with the heads under TP; its FLOPs (one more term per
    row of scores) are not counted."""
    tie_embeddings: bool = True
    moe: MixtureOfExperts | None = None
    """Routed experts in the MLPs (a mixture-of-experts decoder); None: every block's MLP is dense."""
    latent_attention: MultiLatentAttention | None = None
    """Multi-head latent attention in every block (DeepSeek-V2/V3) in place of Q, K, V projections of `head_dim`;
    None: standard (or grouped-query) attention."""
    attention_dropout: bool | None = None
    """Dropout on the attention probabilities; None: as `dropout` (OPT drops the hidden states only)."""
    mlp_activation: Literal["gelu", "relu"] = "gelu"
    """A dense MLP's activation (not `gated_mlp`): GELU keeps its input for the backward, ReLU its output — the
    tensor FC2 keeps anyway (OPT), so one FFN-wide tensor fewer per block."""
    embedding_norm: bool = False
    """A LayerNorm on the token embeddings before the first block (BLOOM's word_embeddings_layernorm)."""
    scaled_embeddings: bool = False
    """The token embeddings multiplied by √hidden_size before the first block (Gemma): one more pass over them."""
    position_offset: int = Field(default=0, ge=0, le=MAX_WIDTH)
    """Rows of a learned position table before the first position (OPT: 2, `max_position_embeddings + 2` rows)."""
    parallel_attention_norms: Literal[0, 1, 2] = 0
    """0: attention, then the MLP on the updated residual; 1 or 2: both read the block's input through one shared
    norm or their own norm and their outputs are added to it together, with one dropout (GPT-J, Falcon)."""

    def _head_pairs(self) -> list[tuple[int, int]]:
        if self.head_dim is not None or self.latent_attention is not None:
            return []  # the heads' widths are given, not hidden_size / num_heads
        return [(self.hidden_size, self.num_heads)]

    def is_moe_block(self, index: int) -> bool:
        """Whether block `index` (from 0) routes its tokens to experts."""
        return self.moe is not None and index not in self.moe.dense_blocks

    @property
    def attention_head_dim(self) -> int:
        """The width of one attention head."""
        return self.head_dim or self.hidden_size // self.num_heads

    def is_windowed_block(self, index: int) -> bool:
        """Whether block `index` (from 0) attends through `sliding_window`."""
        return self.sliding_window is not None and index not in self.full_attention_blocks

    def attended_tokens(self, index: int) -> int:
        """Keys per query whose scores block `index` computes (gbmw.specs.block_shape.BlockShape.attended_tokens):
        the window where the block has one and flash attention skips the keys outside it, else the sequence."""
        if self.attention == "flash" and self.is_windowed_block(index):
            return min(self.seq_length, self.sliding_window)
        return self.seq_length

    @model_validator(mode="after")
    def _kv_heads_divide(self) -> "GPTArchitecture":
        if self.latent_attention is not None:
            self._check_latent_attention()
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}: "
                             "grouped-query attention shares each key/value head among equal groups")
        check_fused_projection_widths(self)
        if self.moe is not None and any(index >= self.num_layers for index in self.moe.dense_blocks):
            raise ValueError(f"moe.dense_blocks {list(self.moe.dense_blocks)} names a block past the last of "
                             f"{self.num_layers} (blocks count from 0)")
        if any(index >= self.num_layers for index in self.full_attention_blocks):
            raise ValueError(f"full_attention_blocks {list(self.full_attention_blocks)} names a block past the last "
                             f"of {self.num_layers} (blocks count from 0)")
        if self.full_attention_blocks and self.sliding_window is None:
            raise ValueError(f"full_attention_blocks {list(self.full_attention_blocks)} without a sliding_window: "
                             "every block attends to the whole sequence already; set sliding_window or drop them")
        if self.max_position_embeddings is not None and self.seq_length > self.max_position_embeddings:
            raise ValueError(f"seq_length {self.seq_length} exceeds max_position_embeddings "
                             f"{self.max_position_embeddings}: the model takes at most "
                             f"{self.max_position_embeddings} tokens per sample")
        special = self.moe is not None or self.latent_attention is not None
        for field, bad, why in (("mlp_activation", self.gated_mlp and self.mlp_activation == "relu",
                                 "with gated_mlp (its activation is gated_activation's gate); drop one"),
                                ("gated_activation", not self.gated_mlp and self.gated_activation != "silu",
                                 "without gated_mlp (a dense MLP's activation is mlp_activation); drop it"),
                                ("position_offset", self.position_offset and self.position_embedding != "learned",
                                 "without a learned position table; give 0"),
                                *((field, special and getattr(self, field) not in (default, None),
                                   "with moe or latent_attention: gbmw costs those blocks' own layout; drop it")
                                  for field, default in (("mlp_activation", "gelu"), ("parallel_attention_norms", 0),
                                                         ("attention_dropout", None)))):
            if bad:
                raise ValueError(f"{field} {getattr(self, field)!r} {why}")
        return self

    def _check_latent_attention(self) -> None:
        """What multi-head latent attention leaves no room for, one value at a time."""
        if self.num_kv_heads is not None and self.num_kv_heads != self.num_heads:
            raise ValueError(f"num_kv_heads {self.num_kv_heads} with latent_attention: every one of the {self.num_heads} "
                             "heads expands its own keys and values from the latent (no grouped-query groups); drop "
                             f"num_kv_heads or give {self.num_heads}")
        if self.head_dim is not None:
            raise ValueError(f"head_dim {self.head_dim} with latent_attention: its head widths are "
                             "latent_attention.qk_nope_head_dim + qk_rope_head_dim (queries, keys) and v_head_dim "
                             "(values); drop head_dim")
        if self.position_embedding != "rotary":
            raise ValueError(f"position_embedding {self.position_embedding!r} with latent_attention: its positions are "
                             "the rotary part of each head (qk_rope_head_dim); give position_embedding: rotary")
        if self.qk_norm != "none":
            raise ValueError(f"qk_norm {self.qk_norm!r} with latent_attention: its norms are on the latents "
                             "(q_a_layernorm, kv_a_layernorm), counted with it; drop qk_norm")
        if self.bias or self.qkv_bias:
            raise ValueError(f"{'bias' if self.bias else 'qkv_bias'} true with latent_attention: gbmw models "
                             "DeepSeek's latent attention, whose projections have no biases; give bias: false")
        if self.sliding_window is not None:
            raise ValueError(f"sliding_window {self.sliding_window} with latent_attention: gbmw models latent "
                             "attention over the whole causal prefix; drop sliding_window")


class BERTArchitecture(_Architecture):
    """Encoder-only masked language model with an MLM head and a pooler."""

    family: Literal["bert"]
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=MAX_WIDTH)
    num_heads: int = Field(ge=1, le=MAX_WIDTH)
    ffn_hidden_size: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    seq_length: int = Field(ge=1, le=MAX_SEQUENCE)
    vocab_size: int = Field(ge=1, le=MAX_WIDTH)
    max_position_embeddings: int | None = Field(default=None, ge=1, le=MAX_SEQUENCE)
    type_vocab_size: int = Field(default=2, ge=0, le=MAX_WIDTH)

    def _head_pairs(self) -> list[tuple[int, int]]:
        return [(self.hidden_size, self.num_heads)]

    @model_validator(mode="after")
    def _positions_cover_the_sequence(self) -> "BERTArchitecture":
        if self.max_position_embeddings is not None and self.seq_length > self.max_position_embeddings:
            raise ValueError(f"seq_length {self.seq_length} exceeds max_position_embeddings "
                             f"{self.max_position_embeddings}: the position table has no row for the later tokens")
        return self


class T5Architecture(_Architecture):
    """Encoder-decoder; the encoder and decoder sequence lengths may differ (T5-512/4)."""

    family: Literal["t5"]
    num_encoder_layers: int = Field(ge=1, le=MAX_LAYERS // 2)
    num_decoder_layers: int = Field(ge=1, le=MAX_LAYERS // 2)
    hidden_size: int = Field(ge=1, le=MAX_WIDTH)
    num_heads: int = Field(ge=1, le=MAX_WIDTH)
    head_dim: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """T5's d_kv; None means hidden_size / num_heads."""
    ffn_hidden_size: int = Field(ge=1, le=MAX_WIDTH)
    encoder_seq_length: int = Field(ge=1, le=MAX_SEQUENCE)
    decoder_seq_length: int = Field(ge=1, le=MAX_SEQUENCE)
    vocab_size: int = Field(ge=1, le=MAX_WIDTH)
    gated_mlp: bool = False
    tie_embeddings: bool = True

    def _head_pairs(self) -> list[tuple[int, int]]:
        return [] if self.head_dim is not None else [(self.hidden_size, self.num_heads)]


class ViTArchitecture(_Architecture):
    """Vision Transformer: patch embedding, a class token, encoder blocks, a classifier head."""

    family: Literal["vit"]
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=MAX_WIDTH)
    num_heads: int = Field(ge=1, le=MAX_WIDTH)
    ffn_hidden_size: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    image_size: int = Field(ge=1, le=MAX_SEQUENCE)
    patch_size: int = Field(ge=1, le=MAX_SEQUENCE)
    num_channels: int = Field(default=3, ge=1, le=MAX_WIDTH)
    num_classes: int = Field(default=1000, ge=1, le=MAX_WIDTH)

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
    embed_dim: int = Field(ge=1, le=MAX_WIDTH)
    depths: Items[Annotated[int, Field(ge=1, le=MAX_LAYERS // 16)]] = Field(min_length=1, max_length=16)
    num_heads: Items[Annotated[int, Field(ge=1, le=MAX_WIDTH)]] = Field(min_length=1, max_length=16)
    window_size: int = Field(default=7, ge=1, le=MAX_SEQUENCE)
    image_size: int = Field(default=224, ge=1, le=MAX_SEQUENCE)
    patch_size: int = Field(default=4, ge=1, le=MAX_SEQUENCE)
    num_channels: int = Field(default=3, ge=1, le=MAX_WIDTH)
    mlp_ratio: float = Field(default=4.0, gt=0, le=64)
    num_classes: int = Field(default=1000, ge=1, le=MAX_WIDTH)

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
"""Any family's architecture; pydantic picks the type by `family`."""
FAMILIES = ("gpt", "bert", "t5", "vit", "swin")
_ARCHITECTURE = TypeAdapter(Architecture)


def parse_architecture(data: dict[str, Any], where: str) -> Any:
    """Validate an architecture mapping (needs `family`) with field-level errors."""
    family = data.get("family")
    if family not in FAMILIES:
        check_kind(data, "model", where)
        raise SpecError(f"{where}: field `family`: value {shown(family)} — must be one of {list(FAMILIES)}")
    try:
        return _ARCHITECTURE.validate_python(data, strict=True)
    except ValidationError as error:
        # pydantic prefixes the discriminator value to each location; drop it.
        message = describe_validation_error(error, where).replace(f"`{family}.", "`")
        raise SpecError(message) from None


def apply_training_settings(data: dict[str, Any], seq_length: int | None, flash_attention: bool | None,
                            where: str) -> Any:
    """Validate an architecture mapping trained at `seq_length` tokens per sample (None: as the mapping says) with
    flash attention on or off (None: as the mapping says). A T5 model takes the length for its encoder and decoder;
    an image model's sequence comes from its image and patch sizes and takes none."""
    data = dict(data)
    if seq_length is not None:
        family = data.get("family")
        if family in ("gpt", "bert"):
            data["seq_length"] = seq_length
        elif family == "t5":
            data["encoder_seq_length"] = data["decoder_seq_length"] = seq_length
        else:
            raise SpecError(f"{where}: a sequence length ({seq_length}) was given, but a {family} model's tokens are "
                            "its image patches (image_size / patch_size); drop --seq-length / `seq_length`")
    if flash_attention is not None:
        data["attention"] = "flash" if flash_attention else "standard"
    return parse_architecture(data, where)
