"""A mixture-of-experts block with sequence parallelism (+sp, Korthikanti et al. 2022, Sec. 4.2.2): the routed experts
of a TP group run on the token copies every TP rank received, as megatron-core's MoEAlltoAllTokenDispatcher runs them
(its expert TP degree equal to the layer's: A2A over EP, then all-gather over the TP group; reduce-scatter over the
TP group, then A2A back).

Under +sp each TP rank holds its slice of the sequence, so it routes and dispatches only its own tokens — 1/t of the
replica's copies cross the EP group's all-to-alls, the bytes gbmw.cost.expert_parallel prices under +sp. The experts
are TP-split (gate and fc1 by output features, fc2 by input features), so each TP rank needs the copies all t ranks
received: `gather_rows` all-gathers them (rank-major, counts differing per rank), the experts run their shards on
all of them with no collective of their own (`partial_expert_mlps`: local products, fc2's partial sums), and
`reduce_scatter_rows` sums the partial outputs over the group and returns each rank the rows it received. fc2's bias
(replicated) is added after the sum, on the rank's own rows, its gradient summed over the group as every replicated
parameter used on a sequence slice (gbmw.adapters.runtime.sequence_parallel.sum_gradient_over_group); so are the
router's and the shared experts' gate's. The shared experts are a dense MLP of the block's TP linears, which gather
and reduce-scatter the slices themselves (a token-wise MLP: the slices' order does not matter).

Backward: `gather_rows`'s is a reduce-scatter of the gradient (each rank's rows summed over the group, back to it),
`reduce_scatter_rows`'s an all-gather; the uneven counts go through `all_to_all_single` with per-rank split sizes,
which gloo runs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .gated_mlp import swiglu
from .grouped_experts import bias_rows
from .sequence_parallel import local_linear, sum_gradient_over_group


def _all_gather_rows(rows: torch.Tensor, counts: list[int], group: Any) -> torch.Tensor:
    """Every rank's rows, rank-major (rank r sent counts[r] of them)."""
    size = dist.get_world_size(group)
    output = rows.new_empty((sum(counts), *rows.shape[1:]))
    dist.all_to_all_single(output, rows.contiguous().repeat(size, *([1] * (rows.dim() - 1))), counts,
                           [rows.size(0)] * size, group=group)
    return output


def _reduce_scatter_rows(rows: torch.Tensor, counts: list[int], group: Any) -> torch.Tensor:
    """Rank-major rows (rank r's block counts[r] long) summed over the group; this rank's block kept."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    received = rows.new_empty((size * counts[rank], *rows.shape[1:]))
    dist.all_to_all_single(received, rows.contiguous(), [counts[rank]] * size, counts, group=group)
    return received.view(size, counts[rank], *rows.shape[1:]).sum(0)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, counts, group):
        ctx.counts, ctx.group = counts, group
        return _all_gather_rows(rows, counts, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_rows(grad, ctx.counts, ctx.group), None, None


class _ReduceScatterRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, counts, group):
        ctx.counts, ctx.group = counts, group
        return _reduce_scatter_rows(rows, counts, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_rows(grad, ctx.counts, ctx.group), None, None


def gather_rows(rows: torch.Tensor, counts: list[int], group: Any) -> torch.Tensor:
    """All-gather rows of uneven counts over `group` (counts[r]: rank r's), rank-major; backward reduce-scatters."""
    return _GatherRows.apply(rows, counts, group)


def reduce_scatter_rows(rows: torch.Tensor, counts: list[int], group: Any) -> torch.Tensor:
    """Sum rank-major rows over `group`, keep this rank's block (counts[r] rows for rank r); backward all-gathers."""
    return _ReduceScatterRows.apply(rows, counts, group)


def peer_counts(per_expert: list[int], group: Any, balanced: bool, device) -> torch.Tensor:
    """[TP rank, local expert] counts of the copies every rank of the TP group received, on `device` (the collective's:
    NCCL's on the GPU); under balanced routing every rank received the same, known without a collective."""
    size = dist.get_world_size(group)
    mine = torch.tensor(per_expert, dtype=torch.int64, device=device)
    if balanced:
        return mine.expand(size, -1).clone()
    parts = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(parts, mine, group=group)
    return torch.stack(parts)


def partial_expert_mlps(experts: list[nn.Module], rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Each expert's TP shard on its expert-major rows, with no collective: SwiGLU (or GELU) of the gate and fc1
    shards, then fc2's shard — a partial sum, without fc2's bias (`fc2_bias_rows` adds it after the sum). Each
    product keeps its input and the fp32 weight shard for backward and casts it again there, as megatron-core's TP
    linears do (`local_linear`), not a 16-bit copy per expert per micro-batch."""
    outputs = []
    for expert, part in zip(experts, rows.split(counts)):
        up = local_linear(part, expert.fc1.weight, expert.fc1.bias)
        gate = local_linear(part, expert.gate.weight, expert.gate.bias) if expert.gated else None
        hidden = swiglu(gate, up) if expert.gated else F.gelu(up)
        outputs.append(local_linear(hidden, expert.fc2.weight, None))
    return torch.cat(outputs)



def fc2_bias_rows(experts: list[nn.Module], counts: list[int], group: Any, dtype: torch.dtype) -> torch.Tensor:
    """[Σ counts, hidden]: each expert-major row's expert's fc2 bias (replicated, its gradient summed over the group)."""
    return bias_rows([sum_gradient_over_group(expert.fc2.bias, group) for expert in experts], counts, dtype)
