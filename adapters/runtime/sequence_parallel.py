"""Sequence parallelism with TP (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", 2022, Sec. 4.2.2): inside a TP group of t ranks, the norm, dropout and residual regions of a Transformer
block run on 1/t of the sequence.

The block's activations are [batch, tokens, hidden]; the sequence is dim 1 and rank r holds tokens
[r·s/t, (r+1)·s/t). The paper's two conjugate operators replace TP's all-reduce:
* g (before a column-parallel linear): all-gather along the sequence in forward, reduce-scatter the input gradient
  in backward. The linear keeps only its sequence shard for backward and gathers it again there, so its stashed
  input is 1/t of the plain TP layer's.
* ḡ (after a row-parallel linear): reduce-scatter along the sequence in forward, all-gather in backward.
Parameters replicated over the group but used inside the sequence-split region (the norms' weights and biases, the
row-parallel linear's bias) see only their shard's tokens, so their gradients are summed over the group
(`sum_gradient_over_group`).

A gbmw layer with +sp keeps its boundaries as every other layer's (the whole sequence on every TP rank): it takes
its shard at entry (`scatter_sequence`) and all-gathers its output at exit (`gather_sequence`), so neighbouring
layers of any strategy connect unchanged (gbmw.adapters.runtime.redistribute).

The reduce-scatter is the backend's own where it has one (NCCL: each rank sends (n−1)/n of the tensor, as
gbmw.cost.comm prices it); gloo has none, and there it is an in-place all-reduce and this rank's slice
(`has_reduce_scatter`): the same sum, twice the traffic — a CPU test runtime's cost.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

SEQUENCE_DIM = 1


def _shard(x: torch.Tensor, group: Any) -> torch.Tensor:
    """This rank's slice of the sequence, always a copy of its own: with one sample per micro-batch the slice of a
    [1, tokens, hidden] tensor is already contiguous, so `.contiguous()` would return a view, and a view saved for
    backward (the next norm's input) keeps the whole sequence's tensor alive — t times the slice (measured at full
    scale: LLaMA-7B, TP 4, 24 MiB more per +sp block than the estimate)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    return x.chunk(size, SEQUENCE_DIM)[rank].clone(memory_format=torch.contiguous_format)


def has_reduce_scatter(group: Any) -> bool:
    """Whether `group`'s backend has a reduce-scatter that sends (n−1)/n of the tensor from each rank, as gbmw.cost.comm
    prices it: NCCL's (CUDA) and any backend but gloo's, the fake one of adapters/profile/fake_memory included (it
    stands for the GPU run). gloo (CPU) only emulates it: in torch 2.13 its `reduce_scatter_single` and
    `reduce_scatter` clone the whole input, all-reduce the clone and copy this rank's slice out
    (ProcessGroupGloo::reduce_scatter_tensor_coalesced; torch.profiler shows aten::clone of the whole input, then
    gloo:all_reduce), so on gloo an in-place all-reduce and a slice move the same bytes without the clone."""
    return dist.get_backend(group) != "gloo"


def reduce_scatter_sequence(x: torch.Tensor, group: Any, by_reduce_scatter: bool | None = None) -> torch.Tensor:
    """The sum of `x` ([batch, tokens, ...], a tensor the caller gives up) over the group, this rank's slice of the
    tokens kept. With the backend's reduce-scatter (`by_reduce_scatter`, default `has_reduce_scatter`): one per
    batch row, whose tokens are contiguous and lead (the collective splits its input along the leading dimension),
    into a new [batch, tokens/t, ...] tensor (batch − 1 more collective latencies than one call, the same bytes);
    otherwise `x` is all-reduced in place and the slice copied out. Both hold `x` and the slice (1/t of it) at once
    and nothing else, so the memory trace is the same either way."""
    if not (has_reduce_scatter(group) if by_reduce_scatter is None else by_reduce_scatter):
        dist.all_reduce(x, group=group)
        return _shard(x, group)
    x = x.contiguous()
    shard = x.new_empty((x.shape[0], x.shape[SEQUENCE_DIM] // dist.get_world_size(group), *x.shape[2:]))
    for row, shard_row in zip(x, shard):
        dist.reduce_scatter_single(shard_row, row, group=group)
    return shard


def _gather(x: torch.Tensor, group: Any) -> torch.Tensor:
    """The whole sequence from every rank's slice (rank order)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, SEQUENCE_DIM)


class _Scatter(torch.autograd.Function):
    """Entry of a +sp layer: the input is whole on every rank; keep this rank's slice (backward: all-gather)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _shard(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.group), None


class _Gather(torch.autograd.Function):
    """Exit of a +sp layer: all-gather the output; the next layer's gradient is whole on every rank, so backward
    keeps this rank's slice (no reduction: every rank already holds the same whole gradient)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _shard(grad, ctx.group), None


class _SumGradient(torch.autograd.Function):
    """Identity in forward; the gradient summed over the group in backward (a replicated parameter used on 1/t of
    the sequence)."""

    @staticmethod
    def forward(ctx, parameter, group):
        ctx.group = group
        return parameter.view_as(parameter)

    @staticmethod
    def backward(ctx, grad):
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


class _Linear(torch.autograd.Function):
    """y = x·Wᵀ (+ b) computed in `dtype` (autocast's, or the weight's), with g or ḡ around it:
    `gather` (column-parallel): the input's sequence slices all-gathered first (in `dtype`), the input gradient
    reduce-scattered; `reduce_scatter` (row-parallel): the partial products summed over the group and this rank's
    slice kept, the output gradient all-gathered in backward. Like megatron-core's TP linears it keeps its input as
    given (with g: the slice, gathered again in backward) and the weight itself, casting it again in backward
    rather than keeping a 16-bit copy."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, gather, reduce_scatter, dtype):
        ctx.group, ctx.gather, ctx.reduce_scatter, ctx.dtype = group, gather, reduce_scatter, dtype
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        whole = _gather(x.to(dtype), group) if gather else x.to(dtype)
        output = torch.matmul(whole, weight.to(dtype).t())
        if bias is not None:
            output = output + bias.to(dtype)
        if reduce_scatter:  # the product is this function's own tensor
            output = reduce_scatter_sequence(output, group)
        return output

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        if ctx.reduce_scatter:
            grad = _gather(grad, ctx.group)
        whole = _gather(x.to(ctx.dtype), ctx.group) if ctx.gather else x.to(ctx.dtype)
        grad_input = grad.matmul(weight.to(ctx.dtype))
        if ctx.gather:
            grad_input = reduce_scatter_sequence(grad_input, ctx.group)
        grad_weight = grad.flatten(0, -2).t().matmul(whole.flatten(0, -2)).to(weight.dtype)
        grad_bias = grad.flatten(0, -2).sum(0).to(weight.dtype) if ctx.has_bias else None
        return grad_input.to(x.dtype), grad_weight, grad_bias, None, None, None, None


def scatter_sequence(x: torch.Tensor, group: Any) -> torch.Tensor:
    return _Scatter.apply(x, group)


def gather_sequence(x: torch.Tensor, group: Any) -> torch.Tensor:
    return _Gather.apply(x, group)


def sum_gradient_over_group(parameter: torch.Tensor | None, group: Any) -> torch.Tensor | None:
    return None if parameter is None else _SumGradient.apply(parameter, group)


def _compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """What `nn.Linear` computes in: autocast's 16-bit type when it is on, else the weight's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


def column_linear_forward(module: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
    """A megatron-core ColumnParallelLinear's weights applied with g: input a sequence slice, output the whole
    sequence's split features."""
    dtype = _compute_dtype(x, module.weight)
    with torch.autocast(x.device.type, enabled=False):
        return _Linear.apply(x, module.weight, module.bias, group, True, False, dtype)


def local_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x·Wᵀ (+ b) on this rank's weight shard with neither collective, computed as `_Linear` computes (autocast's type
    where it is on), keeping the weight itself for backward: the routed experts' shards under +sp
    (gbmw.adapters.runtime.expert_sequence_parallel)."""
    dtype = _compute_dtype(x, weight)
    with torch.autocast(x.device.type, enabled=False):
        return _Linear.apply(x, weight, bias, None, False, False, dtype)


def row_linear_forward(module: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
    """A megatron-core RowParallelLinear's weights applied with ḡ: input the whole sequence's split features, output
    this rank's sequence slice of the sum (+ the replicated bias, its gradient summed over the group)."""
    dtype = _compute_dtype(x, module.weight)
    with torch.autocast(x.device.type, enabled=False):
        output = _Linear.apply(x, module.weight, None, group, False, True, dtype)
        bias = sum_gradient_over_group(module.bias, group)
        return output if bias is None else output + bias.to(dtype)


def norm_forward(norm: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
    """A LayerNorm or RMSNorm (gbmw.adapters.runtime.rms_norm) on this rank's sequence slice, its weight (and bias)
    gradients summed over the group."""
    from .rms_norm import RMSNorm, _RMSNormFunction

    weight = sum_gradient_over_group(norm.weight, group)
    if isinstance(norm, RMSNorm):
        return _RMSNormFunction.apply(x, weight, norm.eps)
    return F.layer_norm(x, norm.normalized_shape, weight, sum_gradient_over_group(norm.bias, group), norm.eps)
