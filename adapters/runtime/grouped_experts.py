"""A rank's routed experts as grouped matrix products: one `torch._grouped_mm` per expert matrix for all local experts
at once, where the per-expert loop (gbmw.adapters.runtime.experts.LocalExperts) launches every expert's kernels one
by one — on a GPU, 64 small experts make a step wait on Python's launches (docs/gpu-measurements.md: 13,665 launches
in a step of 64 experts top-8, wall time five times the kernels').

The rows arrive expert-major (expert 0's copies, then expert 1's, …) with their counts; expert e's output is
`rows_e · W_eᵀ (+ b_e)`, which the grouped product computes for every e from the stacked weights [E, out, in] and the
cumulative counts (the group ends), as megatron-core's GroupedMLP and torchtitan's GroupedExperts do. The weights stay
one parameter per expert under their global names (checkpoints, FSDP2 over the expert-data-parallel group and the
per-name initialisation are unchanged): `grouped_linear` stacks them inside its forward.

Backward (Y = X·Wᵀ per group): ∂X = ∂Y·W, a grouped product of the same shape; ∂W_e = ∂Y_eᵀ·X_e expert by expert,
each cast to the weight's type before the next, so one expert's 16-bit weight gradient is alive at a time, as in the
loop (a grouped product would hold all of them, and CUDA's kernel groups along the contraction only where each
count's bytes are a multiple of 16). An expert with no tokens gets a zero gradient, as in the loop (every expert's
weight has one in every arrangement).

What differs from the loop in memory: the gated activation (SwiGLU) runs once on all the rank's copies, so its
working set is all local experts' (gbmw.cost.framework_memory.expert_call_rows prices it).

Memory is the loop's: under autocast the loop's linears keep each expert's 16-bit weight copy for backward, and this
keeps the stacked 16-bit copy (the same bytes); without a cast it keeps the parameters themselves and stacks them
again in backward, where the loop keeps the parameters too. The stack is written in place (one copy per expert into
one buffer), so no per-expert cast lives beside it.

Where it runs: TP 1 (plain nn.Linear experts; under TP the experts are megatron-core's parallel linears and run one
by one), products in fp32 or bf16 on a CPU and bf16 on CUDA (the types `_grouped_mm` runs there), feature widths
whose rows are 16-byte aligned — `groups_experts` decides; elsewhere the loop runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from .gated_mlp import swiglu

ALIGNMENT_BYTES = 16
"""`_grouped_mm`'s operands: strides and group starts multiples of 16 bytes."""
_PRODUCT_DTYPES = {"cpu": (torch.float32, torch.bfloat16), "cuda": (torch.bfloat16,)}


def product_dtype(weight_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype the experts' products run in: autocast's where it is on (as nn.Linear would cast), else the weights'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return weight_dtype


def groups_experts(linears: list[nn.Linear], device: torch.device) -> bool:
    """Whether `grouped_linear` runs these experts' matrix (the module docstring's conditions)."""
    if not hasattr(torch, "_grouped_mm") or not all(type(linear) is nn.Linear for linear in linears):
        return False
    dtype = product_dtype(linears[0].weight.dtype, device)
    if dtype not in _PRODUCT_DTYPES.get(device.type, ()):
        return False
    element = torch.empty((), dtype=dtype).element_size()
    out_features, in_features = linears[0].weight.shape
    return (in_features * element) % ALIGNMENT_BYTES == 0 and (out_features * element) % ALIGNMENT_BYTES == 0


def grouped_linear(rows: torch.Tensor, counts: list[int], linears: list[nn.Linear]) -> torch.Tensor:
    """[Σ counts, in] expert-major rows → [Σ counts, out]: rows of expert e through `linears[e]` (weight and bias)."""
    weights = [linear.weight for linear in linears]
    dtype = product_dtype(weights[0].dtype, rows.device)
    ends = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(device=rows.device, dtype=torch.int32)
    output = _GroupedLinear.apply(rows.to(dtype).contiguous(), ends, tuple(counts), dtype, *weights)
    if linears[0].bias is None:
        return output
    return output + bias_rows([linear.bias for linear in linears], counts, dtype)


def bias_rows(biases: list[torch.Tensor], counts: list[int], dtype: torch.dtype) -> torch.Tensor:
    """[Σ counts, out]: each expert-major row's expert's bias (counts[e] rows of expert e), in `dtype`."""
    stacked = torch.stack(biases).to(dtype)
    expert_of_row = torch.repeat_interleave(torch.arange(len(counts), device=stacked.device),
                                            torch.tensor(counts, device=stacked.device), output_size=sum(counts))
    return stacked[expert_of_row]


def _stacked(weights: tuple[torch.Tensor, ...], dtype: torch.dtype) -> torch.Tensor:
    """[E, out, in] in `dtype`, written expert by expert into one buffer."""
    stack = weights[0].new_empty((len(weights), *weights[0].shape), dtype=dtype)
    for index, weight in enumerate(weights):
        stack[index].copy_(weight)
    return stack


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm; under fake tensors in a type its meta kernel refuses (it checks CUDA's bf16), an empty result
    of its shape and type — the one allocation the CPU kernel makes (the memory trace, gbmw.adapters.profile.fake_memory,
    traces fp32 plans on a CPU)."""
    if isinstance(a, FakeTensor) and a.dtype != torch.bfloat16:
        shape = (a.size(0), b.size(-1)) if b.dim() == 3 else (ends.size(0), a.size(0), b.size(-1))
        return a.new_empty(shape)
    return torch._grouped_mm(a, b, offs=ends)


class _GroupedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, ends, counts, dtype, *weights):
        stack = _stacked(weights, dtype)
        cast = weights[0].dtype != dtype
        ctx.counts, ctx.dtype, ctx.cast = counts, dtype, cast
        ctx.weight_dtype, ctx.weight_shape = weights[0].dtype, weights[0].shape
        ctx.save_for_backward(rows, ends, *((stack,) if cast else weights))
        return _grouped_mm(rows, stack.transpose(-2, -1), ends)

    @staticmethod
    def backward(ctx, grad_output):
        rows, ends, *kept = ctx.saved_tensors
        stack = kept[0] if ctx.cast else _stacked(tuple(kept), ctx.dtype)
        grad_output = grad_output.to(ctx.dtype).contiguous()
        grad_rows = _grouped_mm(grad_output, stack, ends) if ctx.needs_input_grad[0] else None
        del stack
        grads, start = [], 0
        for count in ctx.counts:  # one expert at a time: one 16-bit weight gradient alive beside the outputs
            if count:
                grads.append(torch.mm(grad_output[start:start + count].t(), rows[start:start + count]
                                      ).to(ctx.weight_dtype))
            else:
                grads.append(rows.new_zeros(ctx.weight_shape, dtype=ctx.weight_dtype))
            start += count
        return grad_rows, None, None, None, *grads


def grouped_expert_mlps(experts: list[nn.Module], rows: torch.Tensor, counts: list[int]) -> torch.Tensor | None:
    """The experts' MLPs (gbmw.adapters.runtime.experts.ExpertMLP: SwiGLU when gated, else GELU) on their expert-major
    rows, as grouped products; None where `groups_experts` says they run one by one."""
    first = experts[0]
    matrices = ("gate", "fc1", "fc2") if first.gated else ("fc1", "fc2")
    if not groups_experts([getattr(first, name) for name in matrices], rows.device):
        return None
    up = grouped_linear(rows, counts, [expert.fc1 for expert in experts])
    if first.gated:
        hidden = swiglu(grouped_linear(rows, counts, [expert.gate for expert in experts]), up)
    else:
        hidden = F.gelu(up)
    return grouped_linear(hidden, counts, [expert.fc2 for expert in experts])
