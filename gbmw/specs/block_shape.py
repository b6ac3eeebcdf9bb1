"""The shape of one Transformer block for one sample (gbmw.specs.transformer_layers costs it), and the parameters of
its norms."""

from __future__ import annotations

from dataclasses import dataclass


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
    qkv_bias: bool | None = None
    """Biases on Q, K and V; None means as `bias` (Qwen2 has them with no other linear bias)."""
    norm: str = "layer"
    norm_bias: bool = True
    """LayerNorm's shift beside its scale (gbmw.specs.architectures.GPTArchitecture.norm_bias)."""
    qk_norm: str = "none"
    """Norms on Q and K: `head` (over head_dim, shared by the heads) or `full` (over the whole projection)."""
    cross_attention_tokens: int = 0
    """Encoder tokens read by a cross-attention sub-block (T5 decoder); 0 for none."""
    extra_params: int = 0
    """Parameters outside the matmuls and norms (relative position biases), replicated under TP."""
    experts: int = 0
    """Routed experts of a mixture-of-experts MLP (gbmw.specs.moe_mlp); 0: the dense MLP of width `ffn`."""
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    """Width of the shared experts together (count × width: they run on every token as one MLP)."""
    shared_gate: bool = False
    expert_score_bias: bool = False
    """A per-expert routing bias beside the router (gbmw.specs.architectures.MixtureOfExperts.expert_score_bias)."""
    router_bias: bool = False
    """A bias per expert on the router (gbmw.specs.architectures.MixtureOfExperts.router_bias)."""
    attention_sinks: bool = False
    """A learned softmax logit per head (gbmw.specs.architectures.GPTArchitecture.attention_sinks)."""
    capacity_factor: float | None = None
    load_imbalance: float = 1.0
    q_lora_rank: int = 0
    """Multi-head latent attention's query latent (gbmw.specs.latent_attention); 0: queries straight from the hidden
    state."""
    kv_lora_rank: int = 0
    """Multi-head latent attention's key/value latent; 0: standard attention (Q, K, V of `head_dim` per head)."""
    qk_rope_head_dim: int = 0
    """Latent attention: the rotary part of each query/key head (`head_dim` is the whole query/key head)."""
    v_head_dim: int = 0
    """Latent attention: the width of each value head."""
    fp8_linears: bool = False
    """The linear layers run as Transformer Engine's FP8 linears (precision fp8; the module docstring)."""
    mlp_activation: str = "gelu"
    """A dense MLP's activation: `relu` keeps only its output, which FC2 keeps anyway
    (gbmw.specs.architectures.GPTArchitecture.mlp_activation)."""
    parallel_norms: int = 0
    """0: the MLP follows the attention; 1 or 2: attention and MLP read the block input through one shared norm or
    two (gbmw.specs.architectures.GPTArchitecture.parallel_attention_norms)."""
    score_dropout: bool | None = None
    """Dropout on the attention probabilities; None: as the block's dropout."""
    causal: bool = False
    """Self-attention under a causal mask (decoders): a flash kernel skips the scores above the diagonal
    (gbmw.specs.causal_attention)."""
    rotary: bool = False
    """Rotary position embeddings rotate Q and K in every attention (what a framework running the rotation unfused
    passes over: gbmw.cost.runtime_passes)."""


def norm_parameter_count(shape: BlockShape, width: int) -> int:
    """Parameters of one norm over `width` elements: LayerNorm's scale and shift (the scale only without
    `norm_bias`), RMSNorm's scale."""
    return (2 if shape.norm == "layer" and shape.norm_bias else 1) * width
