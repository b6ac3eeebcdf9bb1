"""Slice-Gather (paper Sec. 6, Fig. 7): re-lay activations between neighbouring layers whose strategies differ.

A layer's strategy decides which slice of each micro-batch a rank holds: its data-parallel digits pick
the slice, TP ranks hold the same one (`gbmw.ranks.activation_layout`). When layer i+1 slices the batch
differently from layer i, its input is re-laid within the stage's device group: forward, gather every
slice and keep this rank's new one; backward, gather the gradients of the new slices (one copy per
slice: TP replicas carry identical gradients, because Megatron's backward all-reduces them) and keep
this rank's old one. Both directions are one all-gather over the stage group; the planner prices them
as the transition cost R (gbmw.ranks.transition_fraction).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from gbmw.ranks import activation_layout


@dataclass(frozen=True)
class BatchLayout:
    """Which slice of the micro-batch every rank of a stage holds under one strategy."""

    slice_of_rank: tuple[int, ...]
    """Slice index of each local rank of the stage, in rank order."""
    slices: int

    @classmethod
    def of(cls, strategy) -> "BatchLayout":
        shards = activation_layout(strategy)
        return cls(tuple(index for index, _ in shards), shards[0][1])

    def take(self, full: torch.Tensor, local_rank: int) -> torch.Tensor:
        """This rank's slice of a full micro-batch tensor (batch dimension first)."""
        return full.chunk(self.slices)[self.slice_of_rank[local_rank]]

    def assemble(self, gathered: list[torch.Tensor]) -> torch.Tensor:
        """The full micro-batch from every local rank's slice (first holder of each slice)."""
        first_holder = {index: rank for rank, index in reversed(list(enumerate(self.slice_of_rank)))}
        return torch.cat([gathered[first_holder[index]] for index in range(self.slices)])


class SliceGather(torch.autograd.Function):
    """x laid out by `source` → the same activation laid out by `target` (and back for its gradient)."""

    @staticmethod
    def forward(ctx, x, source: BatchLayout, target: BatchLayout, local_rank: int, group):
        ctx.layouts, ctx.local_rank, ctx.group = (source, target), local_rank, group
        # clone: keep only this rank's slice (a view would pin the whole gathered micro-batch in memory)
        return target.take(source.assemble(_all_gather(x.contiguous(), group)), local_rank).clone()

    @staticmethod
    def backward(ctx, grad):
        source, target = ctx.layouts
        full = target.assemble(_all_gather(grad.contiguous(), ctx.group))
        return source.take(full, ctx.local_rank).clone(), None, None, None, None


def _all_gather(x: torch.Tensor, group) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return parts


def relayout(x: torch.Tensor, source: BatchLayout, target: BatchLayout, local_rank: int, group) -> torch.Tensor:
    """Identity when both layouts give every rank the same slice; otherwise Slice-Gather."""
    if source == target:
        return x
    return SliceGather.apply(x, source, target, local_rank, group)
