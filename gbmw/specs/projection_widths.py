"""The widest matmul a decoder block fuses, checked at the architecture: each width a model gives stays within
MAX_WIDTH by its own field's bound, but the fused Q, K and V projection ((num_heads + 2 × num_kv_heads) × head_dim
output features) or a gated MLP's two up-projections (2 × its width) can exceed it, and would otherwise reach the
layer's Matmul validation as a traceback instead of one line naming the field."""

from __future__ import annotations

from typing import Any

from gbmw.specs.schema import MAX_WIDTH


def check_fused_projection_widths(architecture: Any) -> None:
    """Raise ValueError naming the field, its value and the largest that fits, where a GPT block's fused projection
    (Q, K and V in one matmul; a gated MLP's gate and up projections; the experts' and the shared experts') would be
    wider than MAX_WIDTH output features."""
    up = 2 if architecture.gated_mlp else 1
    head_dim = architecture.head_dim or architecture.hidden_size // architecture.num_heads
    kv_heads = architecture.num_kv_heads or architecture.num_heads
    widths = [("ffn_hidden_size", architecture.ffn_hidden_size or 4 * architecture.hidden_size, up)]
    if architecture.latent_attention is None:
        widths.append(("head_dim", head_dim, architecture.num_heads + 2 * kv_heads))
    moe = architecture.moe
    if moe is not None:
        widths += [("moe.expert_ffn_hidden_size", moe.expert_ffn_hidden_size, up),
                   ("moe.shared_expert_ffn_hidden_size", moe.shared_ffn_hidden_size, up * moe.shared_experts)]
    for field, width, copies in widths:
        if width * copies > MAX_WIDTH:
            raise ValueError(f"{field} {width}: the block's fused projection would be {copies} × {width} = "
                             f"{width * copies} wide, over gbmw's limit of {MAX_WIDTH}; give at most "
                             f"{MAX_WIDTH // copies}")
