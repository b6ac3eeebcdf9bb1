"""Multi-head latent attention's widths as a model recipe gives them (gbmw.specs.architectures.GPTArchitecture's
`latent_attention`); gbmw.specs.latent_attention costs it."""

from __future__ import annotations

from pydantic import Field

from gbmw.specs.schema import MAX_WIDTH, Frozen


class MultiLatentAttention(Frozen):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 Sec. 2.1; transformers' modeling_deepseek_v2/v3,
    megatron-core's MLASelfAttention): keys and values are compressed into a `kv_lora_rank` latent per token
    (kv_a_proj_with_mqa, hidden → kv_lora_rank + qk_rope_head_dim, then an RMSNorm kv_a_layernorm) and expanded per
    head (kv_b_proj, kv_lora_rank → heads·(qk_nope_head_dim + v_head_dim)); queries likewise through a
    `q_lora_rank` latent (q_a_proj, q_a_layernorm, q_b_proj, rank → heads·(qk_nope_head_dim + qk_rope_head_dim)), or
    directly (q_proj, hidden → the same) when q_lora_rank is null. Each query and key head is qk_nope_head_dim wide
    without positions plus qk_rope_head_dim with rotary positions (the rotary key part is one, shared by every head:
    the "decoupled RoPE" of Sec. 2.1.3); values are v_head_dim wide; o_proj maps heads·v_head_dim → hidden. Every
    head has its own keys and values: no grouped-query groups."""

    q_lora_rank: int | None = Field(default=None, ge=1, le=MAX_WIDTH)
    """Rank of the query latent (DeepSeek-V3: 1536); None: queries projected straight from the hidden state
    (DeepSeek-V2-Lite)."""
    kv_lora_rank: int = Field(ge=1, le=MAX_WIDTH)
    """Rank of the key/value latent (DeepSeek-V2/V3: 512)."""
    qk_nope_head_dim: int = Field(ge=1, le=MAX_WIDTH)
    """Width of each query/key head's part without positions (128)."""
    qk_rope_head_dim: int = Field(ge=1, le=MAX_WIDTH)
    """Width of each query/key head's rotary part (64); the key's is shared by the heads."""
    v_head_dim: int = Field(ge=1, le=MAX_WIDTH)
    """Width of each value head (128)."""

    @property
    def qk_head_dim(self) -> int:
        """The width of a query or key head: its part without positions and its rotary part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim
