"""Ring context parallelism (Liu, Zaharia and Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite
Context", 2023, Sec. 3 and Alg. 1; megatron-core's `--context-parallel-size`, its p2p ring with the load-balanced
causal split): a layer's `cp{c}` axis splits every sample's tokens over c ranks, and attention passes keys and values
round the ring so that every query meets every key without any rank holding the whole sequence.

Layout. Each sample's tokens are cut into 2c equal chunks; rank j of the CP group (gbmw.ranks.RankLayout
.sequence_group: the same digit on every axis but `cp`) holds chunks j and 2c − 1 − j, one after another
(gbmw.ranks.sequence_pieces, megatron.core.utils.get_batch_on_this_cp_rank's split): under a causal mask an early
chunk has few keys before it and a late chunk many, so every rank does the same attention work. Norms, MLP, residual
adds, embeddings and the head's loss run on those tokens alone; learned position embeddings and rotary angles use
each token's global position (`positions`).

Forward (`ContextParallel.attend`). Step t = 0 … c − 1: the rank holds the keys and values of rank j − t (its own at
t = 0), starts sending them to rank j + 1 and receiving the next from rank j − 1 (torch.distributed P2P, gloo and NCCL
alike), and meanwhile attends its two query chunks to the chunks it holds — blockwise, one (query chunk, key chunk)
pair at a time: a key chunk before the query chunk is attended in full, the same chunk under the causal mask, a later
one skipped. Each block's output is normalised within the block; blocks are merged by their log-sum-exp
(online softmax: out ← out·e^{lse − lse'} + out_b·e^{lse_b − lse'}, lse' = log(e^{lse} + e^{lse_b}); Milakov and
Gimelshein 2018, FlashAttention's rescaling), so the result is exactly softmax over all keys, up to fp32 rounding.
Forward keeps Q, K, V, the output and the fp32 log-sum-exp of each row — what a flash kernel keeps.

Backward (ring, not an all-gather). Every block's probabilities are rebuilt from the saved log-sum-exp, and
dS = P ∘ (dP − D) with D = rowsum(dO ∘ O) (FlashAttention Alg. 2). The keys and values go round the ring again,
each with fp32 accumulators of its dK and dV that every rank adds its queries' share to; after the c-th step each
accumulator is one hop short of home and takes that hop — so rank j ends with dK, dV of its own chunks summed over
every query of the sequence, and dQ of its own queries. Communication per step: forward K and V of the rank's
tokens; backward K, V and (fp32) dK, dV.

Grouped-query attention: query heads of one key/value group are adjacent (gbmw.adapters.runtime.model's per-group
layout), so queries are viewed as [batch, kv heads, group, tokens, head_dim] and each key/value head is read by its
group without a copy. With TP the ring runs over the TP rank's heads (the CP group is one TP index). Compute is plain
torch matmuls in fp32 (16-bit inputs under autocast are sent as they are and computed in fp32), the blockwise form of
flash attention: a block of L × L (L = tokens / 2c) runs in tiles of query rows whose scores hold at most
`score_tile_elements` (never the s × s ones, nor a whole block's at long sequences: 32k tokens on cp 4 made a block's
fp32 scores 2 GiB a tensor for 32 heads, and the backward holds four such tensors at once). Not run:
attention dropout (refused in one line: the ring would need each block's mask drawn again in backward), and the
runtime offers no +sp with cp (gbmw.space.runtime_support).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.checkpoint

from gbmw.cost.context_parallel import RUNTIME_SCORE_TILE_ELEMENTS
from gbmw.errors import PlanError
from gbmw.space.runtime_support import runtime_strategy_refusal
from gbmw.space.strategy import Strategy

RING_ATTENTION_DROPOUT = ("gbmw's ring attention (cp) runs without attention dropout; train the model with `dropout: "
                          "false`, or use ulysses in place of cp")


@dataclass(frozen=True)
class ContextParallel:
    """The CP ring of one layer on this rank."""

    group: Any
    """torch.distributed ProcessGroup over the ring's ranks; None for one rank."""
    size: int
    """c: ranks the tokens are split over (each sample's tokens are cut into 2c chunks)."""
    part: int
    """This rank's place j on the ring (its `cp` digit): it holds chunks j and 2c − 1 − j."""
    ranks: tuple[int, ...] = ()
    """The ring's global ranks in order of their `cp` digits."""
    score_tile_elements: int = RUNTIME_SCORE_TILE_ELEMENTS
    """The most score elements a tile of query rows holds (the estimator's number, gbmw.cost.context_parallel: a
    tile's fp32 scores at most 256 MiB, the four score-sized tensors its backward holds at once at most 1 GiB; tests
    set fewer to tile tiny shapes)."""

    def tile_rows(self, batch: int, heads: int, chunk: int) -> int:
        """Query rows R attended at once in a block of `chunk` × `chunk`: R = max(1, score_tile_elements // (batch ·
        heads · chunk)), at most the block. Rows are independent in forward; in backward each tile adds its share to
        dK and dV."""
        return max(1, min(chunk, self.score_tile_elements // max(1, batch * heads * chunk)))

    @classmethod
    def of(cls, pool, strategy: Strategy) -> "ContextParallel | None":
        """This rank's CP ring under `strategy` from the process-group pool (None: the strategy has no cp axis); one
        line for what the runtime does not run with it."""
        problem = runtime_strategy_refusal(strategy)
        if problem:
            raise PlanError(problem)
        if strategy.sequence_axis != "cp":
            return None
        ranks = pool.layout.sequence_group(pool.rank, strategy)
        return cls(pool.get(ranks), len(ranks), ranks.index(pool.rank), ranks)

    @property
    def head_split(self) -> int:
        """Ways the attention core splits the heads: none (every rank attends with all of its TP share)."""
        return 1

    @property
    def token_pieces(self) -> int:
        """Equal pieces each sample's tokens are cut into (2c chunks)."""
        return 2 * self.size

    def chunks_of(self, part: int) -> tuple[int, int]:
        """The two chunks (of 2c) ring rank `part` holds, in the order it holds them."""
        return part, 2 * self.size - 1 - part

    def positions(self, local_tokens: int, device: torch.device) -> torch.Tensor:
        """The global positions of this rank's `local_tokens` tokens (its two chunks, one after another)."""
        chunk = local_tokens // 2
        return torch.cat([torch.arange(index * chunk, (index + 1) * chunk, device=device)
                          for index in self.chunks_of(self.part)])

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool, dropout_p: float,
               recompute: bool = False) -> torch.Tensor:
        """Attention of this rank's queries over the whole sequence's keys and values, each [batch, its tokens, heads
        (key/value heads for K and V), head_dim] → [batch, its tokens, heads, head_dim]. `recompute` (+sel): keep only
        the inputs and run the ring's forward again in backward (torch's non-reentrant checkpoint; every rank of the
        ring recomputes the same layer in the same order, so the sends pair up again)."""
        if dropout_p > 0.0:
            raise PlanError(RING_ATTENTION_DROPOUT)
        if recompute:
            return torch.utils.checkpoint.checkpoint(_RingAttention.apply, query, key, value, self, causal,
                                                     use_reentrant=False)
        return _RingAttention.apply(query, key, value, self, causal)

    def exchange(self, tensor: torch.Tensor) -> "_Pending":
        """Start sending `tensor` to the next rank of the ring and receiving the previous one's (same shape and
        dtype); `wait()` on the result gives it."""
        received = torch.empty_like(tensor)
        following, preceding = self.ranks[(self.part + 1) % self.size], self.ranks[(self.part - 1) % self.size]
        requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, following, self.group),
                                           dist.P2POp(dist.irecv, received, preceding, self.group)])
        return _Pending(requests, received)


@dataclass
class _Pending:
    """A ring exchange in flight; `wait()` gives what arrived."""

    requests: list
    received: torch.Tensor

    def wait(self) -> torch.Tensor:
        for request in self.requests:
            request.wait()
        return self.received


def _tiles(block_rows: slice, tile: int) -> list[tuple[slice, int]]:
    """(rows, offset inside the block) of each tile of at most `tile` query rows of a block's `block_rows`."""
    start, stop = block_rows.start, block_rows.stop
    return [(slice(first, min(first + tile, stop)), first - start) for first in range(start, stop, tile)]


def _blocks(query_chunks: tuple[int, int], key_chunks: tuple[int, int], causal: bool
            ) -> list[tuple[int, int, bool]]:
    """(local query chunk, local key chunk, diagonal) of every block a step attends: a key chunk before the query chunk
    in full, the same chunk under the causal mask (`diagonal`), a later one not at all (without a causal mask: all)."""
    return [(q, k, causal and key_chunks[k] == query_chunks[q]) for q in range(2) for k in range(2)
            if not causal or key_chunks[k] <= query_chunks[q]]


def _scores(query: torch.Tensor, key: torch.Tensor, diagonal: bool, offset: int = 0) -> torch.Tensor:
    """Q·Kᵀ/√d of one tile of a block, [batch, kv heads, group, rows, L]; on the diagonal block the tile's row i (row
    offset + i of the block) masks the keys after it."""
    scores = torch.matmul(query, key.unsqueeze(2).transpose(-1, -2)) * (1.0 / math.sqrt(query.size(-1)))
    if diagonal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1 + offset)
        scores = scores.masked_fill(future, float("-inf"))
    return scores


def _grouped_queries(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[b, T, H, d] queries (or their output, or its gradient) → [b, kv heads, group, T, d], computed at least in
    fp32."""
    batch, tokens, heads, head_dim = x.shape
    return _computed(x.reshape(batch, tokens, kv_heads, heads // kv_heads, head_dim).permute(0, 2, 3, 1, 4))


def _computed(x: torch.Tensor) -> torch.Tensor:
    """16-bit values are computed in fp32, fp32 and fp64 as they are."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _stacked(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """[b, T, kv heads, d] keys and values → one [2, b, kv heads, T, d] tensor (what travels round the ring)."""
    return torch.stack((key, value)).permute(0, 1, 3, 2, 4).contiguous()


def _token_layout(grouped: torch.Tensor) -> torch.Tensor:
    """[b, kv heads, group, T, d] → [b, T, H, d]."""
    batch, kv_heads, group, tokens, head_dim = grouped.shape
    return grouped.permute(0, 3, 1, 2, 4).reshape(batch, tokens, kv_heads * group, head_dim)


class _RingAttention(torch.autograd.Function):
    """Ring attention's forward and ring backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, query, key, value, ring: ContextParallel, causal: bool):
        with torch.autocast(query.device.type, enabled=False):
            grouped, key_value = _grouped_queries(query, key.size(2)), _stacked(key, value)
            chunk = query.size(1) // 2
            tile = ring.tile_rows(query.size(0), query.size(2), chunk)
            output = torch.zeros_like(grouped)
            log_sum_exp = torch.full(grouped.shape[:-1], float("-inf"), dtype=grouped.dtype, device=query.device)
            for step in range(ring.size):
                pending = ring.exchange(key_value) if step < ring.size - 1 else None
                key_chunks = ring.chunks_of((ring.part - step) % ring.size)
                for q, k, diagonal in _blocks(ring.chunks_of(ring.part), key_chunks, causal):
                    keys = slice(k * chunk, (k + 1) * chunk)
                    block_key, block_value = (_computed(key_value[0, ..., keys, :]),
                                              _computed(key_value[1, ..., keys, :]).unsqueeze(2))
                    for rows, offset in _tiles(slice(q * chunk, (q + 1) * chunk), tile):
                        scores = _scores(grouped[..., rows, :], block_key, diagonal, offset)
                        block_lse = torch.logsumexp(scores, dim=-1)
                        block_output = torch.matmul(torch.exp(scores - block_lse.unsqueeze(-1)), block_value)
                        del scores
                        merged = torch.logaddexp(log_sum_exp[..., rows], block_lse)
                        output[..., rows, :] = (output[..., rows, :]
                                                * torch.exp(log_sum_exp[..., rows] - merged)[..., None]
                                                + block_output * torch.exp(block_lse - merged)[..., None])
                        log_sum_exp[..., rows] = merged
                if pending is not None:
                    key_value = pending.wait()
            result = _token_layout(output).to(query.dtype)
        ctx.save_for_backward(query, key, value, result, log_sum_exp)
        ctx.ring, ctx.causal = ring, causal
        return result

    @staticmethod
    def backward(ctx, grad_output):
        query, key, value, output, log_sum_exp = ctx.saved_tensors
        ring, causal = ctx.ring, ctx.causal
        with torch.autocast(query.device.type, enabled=False):
            grouped, key_value = _grouped_queries(query, key.size(2)), _stacked(key, value)
            grad_grouped = _grouped_queries(grad_output, key.size(2))
            row_dot = (grad_grouped * _grouped_queries(output, key.size(2))).sum(-1)  # D_i of FlashAttention Alg. 2
            grad_query = torch.zeros_like(grouped)
            grad_key_value = torch.zeros(key_value.shape, dtype=grouped.dtype, device=query.device)  # ≥ fp32
            scale, chunk = 1.0 / math.sqrt(query.size(-1)), query.size(1) // 2
            tile = ring.tile_rows(query.size(0), query.size(2), chunk)
            for step in range(ring.size):
                pending = ring.exchange(key_value) if step < ring.size - 1 else None
                key_chunks = ring.chunks_of((ring.part - step) % ring.size)
                for q, k, diagonal in _blocks(ring.chunks_of(ring.part), key_chunks, causal):
                    keys = slice(k * chunk, (k + 1) * chunk)
                    block_key = _computed(key_value[0, ..., keys, :])
                    block_value = _computed(key_value[1, ..., keys, :]).unsqueeze(2)
                    for rows, offset in _tiles(slice(q * chunk, (q + 1) * chunk), tile):
                        block_query, block_grad = grouped[..., rows, :], grad_grouped[..., rows, :]
                        probabilities = torch.exp(_scores(block_query, block_key, diagonal, offset)
                                                  - log_sum_exp[..., rows].unsqueeze(-1))
                        grad_key_value[1, ..., keys, :] += torch.matmul(probabilities.transpose(-1, -2),
                                                                        block_grad).sum(2)
                        grad_probabilities = torch.matmul(block_grad, block_value.transpose(-1, -2))
                        grad_scores = probabilities * (grad_probabilities - row_dot[..., rows].unsqueeze(-1)) * scale
                        del probabilities, grad_probabilities
                        grad_query[..., rows, :] += torch.matmul(grad_scores, block_key.unsqueeze(2))
                        grad_key_value[0, ..., keys, :] += torch.matmul(grad_scores.transpose(-1, -2),
                                                                        block_query).sum(2)
                        del grad_scores
                if pending is not None:
                    key_value = pending.wait()
                # the accumulators follow their K and V one hop; after the last step that hop takes them home
                if ring.size > 1:
                    grad_key_value = ring.exchange(grad_key_value).wait()
            grad_key, grad_value = grad_key_value.permute(0, 1, 3, 2, 4)
        return (_token_layout(grad_query).to(query.dtype), grad_key.to(key.dtype), grad_value.to(value.dtype),
                None, None)
