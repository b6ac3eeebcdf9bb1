"""Ulysses sequence parallelism (Jacobs et al., "DeepSpeed Ulysses: System Optimizations for Enabling Training of
Extreme Long Sequence Transformer Models", 2023, Sec. 3 and Fig. 2): a layer's `ulysses{u}` axis splits every
sample's tokens over u ranks, and attention alone sees the whole sequence.

A rank of the Ulysses group (gbmw.ranks.RankLayout.ulysses_group: the same digit on every axis but `ulysses`) holds
the `part`-th of u contiguous parts of each sample's tokens (gbmw.ranks.sequence_shard). Norms, MLP, residual adds,
embeddings and the head's loss run on those tokens alone. Before the attention core an all-to-all over the group
turns Q, K and V of [its tokens, all of its TP share of the heads] into [all tokens, 1/u of those heads] (Fig. 2's
first all-to-all: N/P × d → N × d/P); the core runs on the whole sequence, its causal mask over it; a second
all-to-all brings the output back to [its tokens, all heads] for the output projection. Each all-to-all is an
autograd function whose backward is the reverse all-to-all of the gradient (`_SequenceToHeads` and
`_HeadsToSequence` are each other's backward).

Heads are split contiguously: with grouped-query attention the query heads of one key/value group are adjacent
(gbmw.adapters.runtime.model's per-group layout), so rank j of the group takes key/value groups
[j·g/u, (j+1)·g/u) of the g = kv_heads / tp its TP rank holds, and exactly their query heads — whole groups, which
the planner guarantees by keeping tp·u a divisor of the key/value heads (gbmw.space.targets.sequence_split_problem).
Positions are global: learned position embeddings and rotary angles of the part-th part start at
part · (tokens / u) (`offset`), so a token is embedded and rotated as in single-process training.

Loss and gradients (gbmw.adapters.runtime.engine): a head's loss is the mean over its tokens; the parts are equal,
so the sample's mean is the mean of the parts' means and each rank back-propagates its part's mean / u — its exact
share. Weights are the same on every rank of the group, so their gradients are summed over the data-parallel and
Ulysses ranks together (Strategy.gradient_view: the Ulysses ranks act as data-parallel ranks for the weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gbmw.errors import PlanError
from gbmw.space.runtime_support import runtime_strategy_refusal
from gbmw.space.strategy import Strategy

from .attention import attention
from .attention_core_recompute import recomputed_attention


@dataclass(frozen=True)
class UlyssesParallel:
    """The Ulysses group of one layer on this rank."""

    group: Any
    """torch.distributed ProcessGroup over the group's ranks in sequence order; None for one rank."""
    size: int
    """u: parts each sample's tokens are split into (1: the whole sequence)."""
    part: int
    """Which part this rank holds (its `ulysses` digit)."""

    @classmethod
    def single(cls) -> "UlyssesParallel":
        return cls(None, 1, 0)

    @classmethod
    def of(cls, pool, strategy: Strategy) -> "UlyssesParallel":
        """This rank's Ulysses group under `strategy`, from the process-group pool; one line for what the runtime
        does not run with it."""
        problem = runtime_strategy_refusal(strategy)
        if problem:
            raise PlanError(problem)
        if strategy.sequence_axis != "ulysses":
            return cls.single()
        ranks = pool.layout.ulysses_group(pool.rank, strategy)
        return cls(pool.get(ranks), len(ranks), ranks.index(pool.rank))

    @property
    def head_split(self) -> int:
        """Ways the attention core splits the heads (u: each rank attends with 1/u of them)."""
        return self.size

    @property
    def token_pieces(self) -> int:
        """Equal pieces each sample's tokens are cut into (u contiguous parts)."""
        return self.size

    def offset(self, local_tokens: int) -> int:
        """The global position of this rank's first token, its part holding `local_tokens` tokens."""
        return self.part * local_tokens

    def positions(self, local_tokens: int, device: torch.device) -> torch.Tensor:
        """The global positions of this rank's `local_tokens` tokens (one contiguous part)."""
        first = self.offset(local_tokens)
        return torch.arange(first, first + local_tokens, device=device)

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool, dropout_p: float,
               recompute: bool = False) -> torch.Tensor:
        """Attention over the whole sequence, each tensor [batch, its tokens, heads, head_dim]: all-to-all to whole
        sequences of 1/u of the heads, the core (`recompute`, +sel: gbmw.adapters.runtime.attention_core_recompute),
        all-to-all back. Without Ulysses (u = 1) the plain core."""
        core = recomputed_attention if recompute else attention
        query, key, value = (part.transpose(1, 2) for part in self.heads_for_attention(query, key, value))
        return self.tokens_after_attention(core(query, key, value, causal, dropout_p).transpose(1, 2))

    def heads_for_attention(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """[batch, its tokens, heads, head_dim] → [batch, all tokens, heads / u, head_dim], each tensor."""
        if self.size == 1:
            return tensors
        return tuple(_SequenceToHeads.apply(tensor, self.size, self.group) for tensor in tensors)

    def tokens_after_attention(self, context: torch.Tensor) -> torch.Tensor:
        """[batch, all tokens, heads / u, head_dim] → [batch, its tokens, heads, head_dim]."""
        if self.size == 1:
            return context
        return _HeadsToSequence.apply(context, self.size, self.group)


def _all_to_all(blocks: torch.Tensor, group) -> torch.Tensor:
    """blocks[j] goes to rank j of the group; the result's block i came from rank i (dimension 0 of size u)."""
    output = torch.empty(blocks.shape, dtype=blocks.dtype, device=blocks.device)  # contiguous, as gloo needs
    dist.all_to_all_single(output, blocks.contiguous(), group=group)
    return output


def sequence_to_heads(x: torch.Tensor, size: int, group) -> torch.Tensor:
    """[b, s/u, H, d] (this rank's tokens) → [b, s, H/u, d] (this rank's heads): rank j receives heads block j."""
    batch, tokens, heads, head_dim = x.shape
    blocks = x.reshape(batch, tokens, size, heads // size, head_dim).permute(2, 0, 1, 3, 4)
    received = _all_to_all(blocks, group)  # [u (source part), b, s/u, H/u, d]
    return received.permute(1, 0, 2, 3, 4).reshape(batch, size * tokens, heads // size, head_dim)


def heads_to_sequence(x: torch.Tensor, size: int, group) -> torch.Tensor:
    """[b, s, H/u, d] (this rank's heads) → [b, s/u, H, d] (this rank's tokens): rank j receives token part j."""
    batch, tokens, heads, head_dim = x.shape
    blocks = x.reshape(batch, size, tokens // size, heads, head_dim).permute(1, 0, 2, 3, 4)
    received = _all_to_all(blocks, group)  # [u (source heads block), b, s/u, H/u, d]
    return received.permute(1, 2, 0, 3, 4).reshape(batch, tokens // size, size * heads, head_dim)


class _SequenceToHeads(torch.autograd.Function):
    """Fig. 2's all-to-all before attention; backward brings the gradient back by `heads_to_sequence`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, size: int, group) -> torch.Tensor:
        ctx.size, ctx.group = size, group
        return sequence_to_heads(x, size, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return heads_to_sequence(grad, ctx.size, ctx.group), None, None


class _HeadsToSequence(torch.autograd.Function):
    """Fig. 2's all-to-all after attention; backward sends the gradient back by `sequence_to_heads`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, size: int, group) -> torch.Tensor:
        ctx.size, ctx.group = size, group
        return heads_to_sequence(x, size, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return sequence_to_heads(grad, ctx.size, ctx.group), None, None
