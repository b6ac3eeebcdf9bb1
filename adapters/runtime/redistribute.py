"""Slice-Gather (paper Sec. 6, Fig. 7): re-lay activations between neighbouring layers whose strategies differ.

A layer's strategy decides which slice of each micro-batch a rank holds: its data-parallel digits pick
the slice, TP ranks hold the same one (`gbmw.ranks.activation_layout`). When layer i+1 slices the batch
differently from layer i, its input is re-laid within the stage's device group: forward, every rank receives
the rows of its new slice that it does not hold, each from one rank that holds them; backward, the gradients
of the rows of its old slice that it no longer computes, each from one holder of the new slice (TP replicas
carry identical gradients, because Megatron's backward all-reduces them). Point-to-point sends of exactly the
missing rows: what one rank receives is the transition cost R the planner prices (gbmw.ranks
.transition_fraction), and no rank ever holds more than its own slices (an all-gather over the stage group
would hold the group's size in slices at once).
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


class SliceGather(torch.autograd.Function):
    """x laid out by `source` → the same activation laid out by `target` (and back for its gradient)."""

    @staticmethod
    def forward(ctx, x, source: BatchLayout, target: BatchLayout, local_rank: int, group):
        ctx.layouts, ctx.local_rank, ctx.group = (source, target), local_rank, group
        return exchange_rows(x, source, target, local_rank, group)

    @staticmethod
    def backward(ctx, grad):
        source, target = ctx.layouts
        return exchange_rows(grad, target, source, ctx.local_rank, ctx.group), None, None, None, None


def _rows(layout: BatchLayout, index: int, rows: int) -> tuple[int, int]:
    """The micro-batch rows [start, stop) of slice `index` (as `torch.chunk` splits them)."""
    size = -(-rows // layout.slices)
    return min(index * size, rows), min((index + 1) * size, rows)


def transfers(held: BatchLayout, needed: BatchLayout, rows: int) -> list[tuple[int, int, int, int]]:
    """(sender, receiver, start, stop): every range of micro-batch rows a local rank needs under `needed`, from
    itself when it holds them under `held`, else from one holder (spread over the holders by receiver)."""
    holders: dict[int, list[int]] = {}
    for rank, index in enumerate(held.slice_of_rank):
        holders.setdefault(index, []).append(rank)
    result = []
    for receiver, index in enumerate(needed.slice_of_rank):
        low, high = _rows(needed, index, rows)
        for source_index in range(held.slices):
            source_low, source_high = _rows(held, source_index, rows)
            start, stop = max(low, source_low), min(high, source_high)
            if start < stop:
                candidates = holders[source_index]
                sender = receiver if receiver in candidates else candidates[receiver % len(candidates)]
                result.append((sender, receiver, start, stop))
    return result


def exchange_rows(x: torch.Tensor, held: BatchLayout, needed: BatchLayout, local_rank: int, group) -> torch.Tensor:
    """This rank's slice under `needed` of the micro-batch whose slices under `held` the ranks hold (x: this
    rank's), by point-to-point sends of the missing rows (see the module docstring)."""
    x = x.contiguous()
    rows = x.size(0) * held.slices
    held_low = _rows(held, held.slice_of_rank[local_rank], rows)[0]
    low, high = _rows(needed, needed.slice_of_rank[local_rank], rows)
    out = x.new_empty((high - low, *x.shape[1:]))
    operations = []
    for sender, receiver, start, stop in transfers(held, needed, rows):
        if sender == local_rank and receiver == local_rank:
            out[start - low:stop - low] = x[start - held_low:stop - held_low]
        elif sender == local_rank:
            operations.append(dist.P2POp(dist.isend, x[start - held_low:stop - held_low],
                                         dist.get_global_rank(group, receiver), group))
        elif receiver == local_rank:
            operations.append(dist.P2POp(dist.irecv, out[start - low:stop - low],
                                         dist.get_global_rank(group, sender), group))
    if operations:
        for request in dist.batch_isend_irecv(operations):
            request.wait()
    return out


def relayout(x: torch.Tensor, source: BatchLayout, target: BatchLayout, local_rank: int, group) -> torch.Tensor:
    """Identity when both layouts give every rank the same slice; otherwise Slice-Gather."""
    if source == target:
        return x
    return SliceGather.apply(x, source, target, local_rank, group)
