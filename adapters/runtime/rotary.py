"""Rotary position embeddings (Su et al., "RoFormer", arXiv 2104.09864, Eq. 34): each pair of a query's or key's
features is rotated by an angle proportional to the token's position, so Q·Kᵀ depends on relative positions only.

Pairs are (i, i + d/2) of a head's d features ("rotate half", the layout of GPT-NeoX, LLaMA's Hugging Face weights
and Megatron's default): x ↦ x·cos θ + rotate_half(x)·sin θ with rotate_half(x) = (−x₂, x₁) and
θ_{p,i} = p · base^(−2i/d). The rotation is orthogonal, so backward rotates the gradient back by −θ:
dx = dy·cos θ − rotate_half(dy·sin θ). As one autograd function it keeps nothing of the activations' size for
backward (only the s × d/2-sized angle tables, which it recomputes): the attention kernel keeps the rotated Q and
K, which is all the estimator charges for them (gbmw.specs.transformer_layers).
"""

from __future__ import annotations

import torch

ROTARY_BASE = 10000.0
"""θ's base (RoFormer's and LLaMA's `rope_theta`)."""


def rotary_angles(tokens: int, head_dim: int, base: float, device: torch.device,
                  positions: torch.Tensor | None = None) -> torch.Tensor:
    """θ[p, i] = p · base^(−2i/d) for the tokens' positions p and i < d/2, in fp32 (computed, never learned).
    `positions`: the global position of each of the `tokens` tokens (a Ulysses rank's part, gbmw.adapters.runtime
    .ulysses; a CP rank's two chunks, gbmw.adapters.runtime.context_parallel); None: 0 … tokens − 1."""
    if head_dim % 2:
        raise ValueError(f"rotary position embeddings rotate feature pairs: head_dim {head_dim} must be even")
    inverse_frequencies = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    if positions is None:
        positions = torch.arange(tokens, dtype=torch.float32, device=device)
    return torch.outer(positions.to(torch.float32), inverse_frequencies)


def rotate(x: torch.Tensor, base: float = ROTARY_BASE, positions: torch.Tensor | None = None) -> torch.Tensor:
    """x of shape [batch, tokens, heads, head_dim] with each token rotated by its position's angles (`positions`: each
    token's global position; None: 0 … tokens − 1)."""
    return _Rotate.apply(x, base, positions)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _cos_sin(x: torch.Tensor, base: float, positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos θ and sin θ over the whole head (each pair's angle twice), shaped to broadcast over batch and heads, in
    x's dtype (a 16-bit query stays 16-bit, as Hugging Face's LLaMA casts its tables)."""
    angles = rotary_angles(x.size(1), x.size(-1), base, x.device, positions)
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


class _Rotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, base: float, positions: torch.Tensor | None) -> torch.Tensor:
        ctx.base, ctx.positions = base, positions
        cos, sin = _cos_sin(x, base, positions)
        return x * cos + _rotate_half(x) * sin

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        cos, sin = _cos_sin(grad_output, ctx.base, ctx.positions)
        return grad_output * cos - _rotate_half(grad_output * sin), None, None
