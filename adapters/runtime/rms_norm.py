"""RMSNorm (Zhang & Sennrich, "Root Mean Square Layer Normalization", NeurIPS 2019, Eq. 4): y = x / RMS(x) · g,
RMS(x) = √(mean(x²) + ε), the norm of LLaMA-style decoders (no mean subtraction, no bias).

Written as one autograd function so that backward keeps what LayerNorm's fused kernel keeps — the input and one
fp32 statistic per token (1/RMS), which is what the estimator charges (gbmw.specs.transformer_layers: "RMSNorm: 1/rms
only") — where torch's composite `nn.RMSNorm` on a CPU also saves the normalised input (a third tensor of the
input's size). Computed in fp32 at least (as autocast runs LayerNorm); the output has the input's dtype
(the fp32 residual stream), as LayerNorm's has under autocast.

Backward of y = x̂·g with x̂ = x·r, r = 1/RMS(x), over the n features of a token:
  ∂L/∂x = r · (g∘dy − x̂ · mean(g∘dy∘x̂)),   ∂L/∂g = Σ_tokens dy∘x̂.
"""

from __future__ import annotations

import torch
from torch import nn

RMS_NORM_EPS = 1e-5
"""ε inside the root (LLaMA-2's `rms_norm_eps`, Megatron's default --norm-epsilon)."""


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a learned gain `weight` (initialised to ones by name, as norms are)."""

    def __init__(self, hidden: int, dtype: torch.dtype = torch.float32, eps: float = RMS_NORM_EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFunction.apply(x, self.weight, self.eps)


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = _computed(x)
        inverse_rms = torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, inverse_rms)
        return (x32 * inverse_rms * _computed(weight)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        x, weight, inverse_rms = ctx.saved_tensors
        normalised = _computed(x) * inverse_rms
        grad_normalised = _computed(grad_output) * _computed(weight)
        projection = (grad_normalised * normalised).mean(-1, keepdim=True)
        grad_x = (inverse_rms * (grad_normalised - normalised * projection)).to(x.dtype)
        grad_weight = (_computed(grad_output) * normalised).reshape(-1, x.size(-1)).sum(0).to(weight.dtype)
        return grad_x, grad_weight, None


def _computed(tensor: torch.Tensor) -> torch.Tensor:
    """16-bit tensors are computed in fp32; fp32 and fp64 as they are."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))
