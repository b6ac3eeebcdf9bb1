"""SwiGLU, the gated MLP of LLaMA-style decoders (Shazeer, "GLU Variants Improve Transformer", arXiv 2002.05202,
Eq. 6): FFN(x) = (Swish(x·W) ∘ x·V)·W₂, with Swish = SiLU(z) = z·σ(z).

`swiglu(gate, up)` is one autograd function that keeps only its two inputs for backward and recomputes σ there
(as Megatron's fused bias-SwiGLU does): with the down projection keeping its own input, the MLP stashes three
ffn-wide tensors per token — gate, up and their product — which is what the estimator charges for a gated MLP
(gbmw.specs.transformer_layers: `up_outputs + 1` tensors). torch's composite `F.silu(gate) * up` would also keep
SiLU's output (a fourth). Forward forms the product in fp32 at least and returns the inputs' dtype; backward
computes in the inputs' dtype (as Megatron's bias-SwiGLU backward does), in place where it can, so its working set
beside the two gradients it returns is one more ffn-wide tensor (σ) — not five fp32 ones.

Backward: with s = σ(g), SiLU(g) = g·s and SiLU'(g) = s·(1 + g·(1 − s)):
  ∂L/∂g = dy ∘ up ∘ s·(1 + g·(1 − s)),   ∂L/∂up = dy ∘ g·s.
"""

from __future__ import annotations

import torch


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) ∘ up."""
    return _SwiGLU.apply(gate, up)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        gate32 = _computed(gate)
        return (gate32 * torch.sigmoid(gate32) * _computed(up)).to(torch.promote_types(gate.dtype, up.dtype))

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        gate, up = ctx.saved_tensors
        grad_output = grad_output.to(gate.dtype)
        sigmoid = torch.sigmoid(gate)
        grad_up = (gate * sigmoid).mul_(grad_output)
        grad_gate = torch.sub(1, sigmoid).mul_(gate).add_(1).mul_(sigmoid).mul_(up).mul_(grad_output)
        return grad_gate, grad_up.to(up.dtype)


def _computed(tensor: torch.Tensor) -> torch.Tensor:
    """16-bit tensors are computed in fp32; fp32 and fp64 as they are."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))
