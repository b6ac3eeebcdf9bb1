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

A strategy with a sequence axis splits each sample's tokens too: a rank holds its batch slice × its pieces of the
tokens (`gbmw.ranks.data_layout`) — one contiguous part under Ulysses (gbmw.adapters.runtime.ulysses), chunks j and
2c − 1 − j of 2c under ring context parallelism (gbmw.adapters.runtime.context_parallel), held one after another.
Between such layouts the same rule moves blocks of (rows × tokens): every rank receives the blocks of its new pieces
it does not hold, each from one holder — what `transition_fraction` prices. Layouts that split the batch only take
the row path unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from gbmw.ranks import data_layout


@dataclass(frozen=True)
class BatchLayout:
    """Which slice of the micro-batch, and which tokens of each sample, every rank of a stage holds under one
    strategy."""

    slice_of_rank: tuple[int, ...]
    """Slice index of each local rank of the stage, in rank order."""
    slices: int
    pieces_of_rank: tuple[tuple[tuple[int, int], ...], ...] | None = None
    """The pieces of each sample's tokens every local rank holds, in token order, each (index, count): the index-th of
    `count` equal parts (gbmw.ranks.sequence_pieces — Ulysses' one part, ring CP's chunks j and 2c − 1 − j);
    None: the whole sequence."""

    @classmethod
    def of(cls, strategy) -> "BatchLayout":
        shards = data_layout(strategy)
        pieces = tuple(shard[2] for shard in shards) if strategy.sequence_axis else None
        return cls(tuple(shard[0] for shard in shards), shards[0][1], pieces)

    @property
    def parts(self) -> int:
        """Ways each sample's tokens are split: every rank holds 1/parts of them (1: none)."""
        if self.pieces_of_rank is None:
            return 1
        pieces = self.pieces_of_rank[0]
        return pieces[0][1] // len(pieces)

    def part(self, local_rank: int) -> int:
        """The rank's digit on the sequence axis, the index of its first piece (0 without a sequence split)."""
        return self.pieces_of_rank[local_rank][0][0] if self.pieces_of_rank else 0

    def token_ranges(self, local_rank: int, tokens: int) -> list[tuple[int, int]]:
        """[start, stop) of each piece of a sample's `tokens` tokens the rank holds, in the order it holds them."""
        pieces = self.pieces_of_rank[local_rank] if self.pieces_of_rank else ((0, 1),)
        return [(index * tokens // count, (index + 1) * tokens // count) for index, count in pieces]

    def take(self, full: torch.Tensor, local_rank: int) -> torch.Tensor:
        """This rank's slice of a full micro-batch tensor (batch dimension first), and its pieces of the tokens
        (dimension 1, one after another) when the layout splits the sequence and the tensor has one."""
        sliced = full.chunk(self.slices)[self.slice_of_rank[local_rank]]
        if self.parts == 1 or sliced.dim() < 2:
            return sliced
        return torch.cat([sliced[:, start:stop] for start, stop in self.token_ranges(local_rank, sliced.size(1))], 1)


class SliceGather(torch.autograd.Function):
    """x laid out by `source` → the same activation laid out by `target` (and back for its gradient)."""

    @staticmethod
    def forward(ctx, x, source: BatchLayout, target: BatchLayout, local_rank: int, group):
        ctx.layouts, ctx.local_rank, ctx.group = (source, target), local_rank, group
        return _exchange(x, source, target, local_rank, group)

    @staticmethod
    def backward(ctx, grad):
        source, target = ctx.layouts
        return _exchange(grad, target, source, ctx.local_rank, ctx.group), None, None, None, None


def _exchange(x: torch.Tensor, held: BatchLayout, needed: BatchLayout, local_rank: int, group) -> torch.Tensor:
    """Rows alone when neither layout splits the sequence; blocks of rows × tokens otherwise."""
    if held.parts == 1 and needed.parts == 1:
        return exchange_rows(x, held, needed, local_rank, group)
    return exchange_blocks(x, held, needed, local_rank, group)


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


def _cells(layout: BatchLayout, local_rank: int, rows: int, tokens: int
           ) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """([row start, stop), [token start, stop)) of every block a local rank holds of a micro-batch of `rows` ×
    `tokens`: its rows by each piece of its tokens."""
    row_range = _rows(layout, layout.slice_of_rank[local_rank], rows)
    return [(row_range, token_range) for token_range in layout.token_ranges(local_rank, tokens)]


def block_transfers(held: BatchLayout, needed: BatchLayout, rows: int, tokens: int
                    ) -> list[tuple[int, int, tuple[int, int], tuple[int, int]]]:
    """(sender, receiver, (row start, stop), (token start, stop)): every block of the micro-batch a local rank needs
    under `needed`, from itself when it holds it under `held`, else from one holder (spread over the holders by
    receiver) — `transfers` with the sequence split as a second dimension. A block lies inside one held and one needed
    piece of the tokens."""
    holders: dict[tuple, list[int]] = {}
    for rank in range(len(held.slice_of_rank)):
        for cell in _cells(held, rank, rows, tokens):
            holders.setdefault(cell, []).append(rank)
    result = []
    for receiver in range(len(needed.slice_of_rank)):
        for (low, high), (first, last) in _cells(needed, receiver, rows, tokens):
            for ((source_low, source_high), (source_first, source_last)), candidates in holders.items():
                start, stop = max(low, source_low), min(high, source_high)
                begin, end = max(first, source_first), min(last, source_last)
                if start < stop and begin < end:
                    sender = receiver if receiver in candidates else candidates[receiver % len(candidates)]
                    result.append((sender, receiver, (start, stop), (begin, end)))
    return result


def _local_tokens(ranges: list[tuple[int, int]], begin: int, end: int) -> slice:
    """Where the global tokens [begin, end), inside one of `ranges`, sit in a tensor holding `ranges` one after
    another."""
    offset = 0
    for start, stop in ranges:
        if start <= begin and end <= stop:
            return slice(offset + begin - start, offset + end - start)
        offset += stop - start
    raise ValueError(f"tokens [{begin}, {end}) are not inside one of {ranges}")


def exchange_blocks(x: torch.Tensor, held: BatchLayout, needed: BatchLayout, local_rank: int, group) -> torch.Tensor:
    """`exchange_rows` for layouts that split the sequence (dimension 1 of x) too: blocks of rows × tokens, each sent
    contiguous and received into a buffer of its own where the block is not contiguous in the result."""
    x = x.contiguous()
    rows, tokens = x.size(0) * held.slices, x.size(1) * held.parts
    held_low = _rows(held, held.slice_of_rank[local_rank], rows)[0]
    low, high = _rows(needed, needed.slice_of_rank[local_rank], rows)
    held_ranges, needed_ranges = held.token_ranges(local_rank, tokens), needed.token_ranges(local_rank, tokens)
    out = x.new_empty((high - low, tokens // needed.parts, *x.shape[2:]))
    operations, copies = [], []
    for sender, receiver, (start, stop), (begin, end) in block_transfers(held, needed, rows, tokens):
        if sender == local_rank:
            source = x[start - held_low:stop - held_low, _local_tokens(held_ranges, begin, end)]
        if receiver == local_rank:
            target = out[start - low:stop - low, _local_tokens(needed_ranges, begin, end)]
        if sender == local_rank and receiver == local_rank:
            target.copy_(source)
        elif sender == local_rank:
            operations.append(dist.P2POp(dist.isend, source.contiguous(), dist.get_global_rank(group, receiver),
                                         group))
        elif receiver == local_rank:
            buffer = target if target.is_contiguous() else torch.empty_like(target)
            operations.append(dist.P2POp(dist.irecv, buffer, dist.get_global_rank(group, sender), group))
            if buffer is not target:
                copies.append((target, buffer))
    if operations:
        for request in dist.batch_isend_irecv(operations):
            request.wait()
    for target, buffer in copies:
        target.copy_(buffer)
    return out


def relayout(x: torch.Tensor, source: BatchLayout, target: BatchLayout, local_rank: int, group) -> torch.Tensor:
    """Identity when both layouts give every rank the same slice; otherwise Slice-Gather."""
    if source == target:
        return x
    return SliceGather.apply(x, source, target, local_rank, group)
