"""The mixture-of-experts MLP with expert parallelism (EP): routed experts split over `ep` data-parallel ranks.

Routing is Mixtral's (Jiang et al., "Mixtral of Experts", 2024, Eq. 1–2): a router (hidden → E, no bias,
replicated under TP) scores each token, the softmax over all E experts runs in fp32, the token goes to its top-k
experts and their outputs are summed with the top-k probabilities renormalised to sum to 1 (the same as a softmax
over the top-k logits). Shared experts (DeepSeek-MoE, Qwen2-MoE) are one dense MLP on every token, optionally scaled
by a sigmoid gate (hidden → 1), added to the routed sum. Dropless only: every routed token copy is computed (the
runtime refuses a capacity factor, gbmw.space.runtime_support).

Expert parallelism (Lepikhin et al., "GShard", 2020, Sec. 2.2; megatron-core's `MoEAlltoAllTokenDispatcher`):
rank r of an EP group of `ep` ranks (gbmw.ranks.RankLayout.expert_group) holds experts [r·E/ep, (r+1)·E/ep) and
still runs attention on its own share of the batch. Each rank sorts its token copies by expert, tells every EP
rank how many copies it sends to each of that rank's experts (an all-to-all of counts), sends the copies by
`torch.distributed.all_to_all_single` with per-rank split sizes (dispatch; gloo runs it in torch 2.13), runs each
local expert on the copies it received from all sources, returns the outputs by the reverse all-to-all (combine),
and forms the weighted sum on the tokens' own rank. `_AllToAll`'s backward is the reverse all-to-all of the
gradient. With TP > 1 each expert is column- then row-parallel on the layer's TP group (as the dense MLP,
gbmw.adapters.runtime.tensor_parallel): the EP group is the ranks of one TP index, and the TP peers of a rank hold
the same tokens and routing, so they receive the same copies. Under `+etpN` (megatron-core's
--expert-tensor-parallel-size, always with +sp: gbmw.space.expert_tensor_parallel) the experts are split over their
own TP group of N consecutive ranks instead (`ExpertParallel.tensor`), the EP group is N ranks apart and spans TP
ranks, each routing its own sequence slice; the copies an EP rank receives are gathered over its ETP group for the
experts' shards (gbmw.adapters.runtime.expert_sequence_parallel), and at ETP 1 the whole experts run on the rank's
own copies with no gather. Every local expert runs even on no tokens, so each expert weight has a gradient (zero) in
every arrangement — the same on every rank of a group, and in single-process training.

Parameter names are plan-independent (`moe.router.weight`, `moe.experts.<e>.fc1.weight` with e the global expert
index, `moe.shared.fc1.weight`): a rank holds the experts it owns under their global names, and `gather_experts`
assembles every expert's full tensor for checkpoints. A rank's routed experts are one module, `LocalExperts`, called
once per forward, so that sharded data parallelism can shard them over their own group: their gradients are summed
(dp) or sharded (sdp, z1dp, z2dp) over the expert-data-parallel group, all others' over the whole data-parallel
group (gbmw.adapters.runtime.expert_data_parallel).

Balanced routing (`balanced_routing()`, for the memory trace only): real routing's token counts are data — read back
with `.tolist()`, counted by `bincount`, and the all-to-all's split sizes — so torch's fake tensors, which have shapes
but no values, cannot run it. Inside `with balanced_routing():` the router still scores every token (the same fp32
softmax, kept for backward as before), but token copy j = i·k + κ (token i's κ-th choice) goes to expert j mod E,
and its weight is the router's probability of that expert (gathered, renormalised over the token's k, as Mixtral
renormalises its top-k). Every expert then receives exactly n·k/E copies of a rank's n tokens and every EP rank the
mean — the estimator's stated assumption (`moe.load_imbalance` = 1, gbmw.cost.expert_parallel) — and every count
is known without reading a tensor, while each tensor has the shape it has under real routing with that balanced
load (the gather's saved index is the size of top-k's, the index and count tensors are built as before).
gbmw.adapters.profile.fake_memory enters it to trace the memory of balanced routing at full scale; training never
does, and under fake tensors without it the layer refuses to run rather than guess.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from gbmw.errors import PlanError
from gbmw.space.strategy import Strategy

from .expert_sequence_parallel import (fc2_bias_rows, gather_rows, partial_expert_mlps, peer_counts,
                                       reduce_scatter_rows)
from .gated_mlp import swiglu
from .grouped_experts import grouped_expert_mlps
from .sequence_parallel import sum_gradient_over_group
from .tensor_parallel import TensorParallel

_EXPERT_KEY = re.compile(r"^moe\.experts\.(\d+)\.(.+)$")
_BALANCED_ROUTING = contextvars.ContextVar("balanced_routing", default=False)


@contextlib.contextmanager
def balanced_routing():
    """MoE layers route every token by the fixed balanced assignment while inside (the module docstring): for
    tracing memory under fake tensors (gbmw.adapters.profile.fake_memory) and for checking that trace against real
    tensors, never for training."""
    token = _BALANCED_ROUTING.set(True)
    try:
        yield
    finally:
        _BALANCED_ROUTING.reset(token)


def routes_balanced() -> bool:
    """Whether MoE layers route by the balanced assignment here (inside `balanced_routing()`)."""
    return _BALANCED_ROUTING.get()


@dataclass(frozen=True)
class ExpertParallel:
    """The EP group of one layer on this rank, and the experts' own TP group under `+etpN`."""

    group: Any
    """torch.distributed ProcessGroup, None for one rank (every expert local)."""
    size: int
    rank: int
    tensor: TensorParallel | None = None
    """The experts' TP group under `+etpN` (gbmw.ranks.RankLayout.expert_tensor_group: ETP consecutive ranks, this
    rank's index among them); None: the layer's TP group."""

    @classmethod
    def single(cls) -> "ExpertParallel":
        return cls(None, 1, 0)

    @classmethod
    def of(cls, pool, strategy: Strategy) -> "ExpertParallel":
        """This rank's EP group under `strategy`, from the process-group pool (gbmw.adapters.runtime.groups)."""
        ranks = pool.layout.expert_group(pool.rank, strategy)
        tensor = None
        if strategy.expert_tp is not None:
            tensor_ranks = pool.layout.expert_tensor_group(pool.rank, strategy)
            tensor = TensorParallel(pool.get(tensor_ranks), len(tensor_ranks), tensor_ranks.index(pool.rank))
        return cls(pool.get(ranks), len(ranks), ranks.index(pool.rank), tensor)

    def tensor_parallel(self, layer_tp: TensorParallel) -> TensorParallel:
        """The TP group the routed experts are split over: their own under `+etpN`, else the layer's."""
        return layer_tp if self.tensor is None else self.tensor


def is_expert_parameter(key: str) -> bool:
    """Whether a parameter (its name inside its layer) belongs to a routed expert (split by EP)."""
    return _EXPERT_KEY.match(key) is not None


class ExpertMLP(nn.Module):
    """One MLP of the model's kind (SwiGLU when gated, else GELU), column- then row-parallel over the TP group."""

    def __init__(self, hidden: int, ffn: int, bias: bool, gated: bool, tp: TensorParallel, dtype: torch.dtype):
        super().__init__()
        if ffn % tp.size:
            raise PlanError(f"TP degree {tp.size} must divide the expert MLP width ({ffn})")
        self.gated = gated
        if gated:
            self.gate = tp.column_linear(hidden, ffn, bias, dtype)
        self.fc1 = tp.column_linear(hidden, ffn, bias, dtype)
        self.fc2 = tp.row_linear(ffn, hidden, bias, dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """[n, hidden] → [n, hidden] (megatron's linears take a 3-D input: one row of n tokens)."""
        x = tokens.unsqueeze(0)
        up = self.fc1(x)
        return self.fc2(swiglu(self.gate(x), up) if self.gated else F.gelu(up)).squeeze(0)


class LocalExperts(nn.ModuleDict):
    """The routed experts this rank holds, by their global index (`"<e>"`), run in one call: its forward is what
    FSDP2 hooks when it shards them over the expert-data-parallel group (gbmw.adapters.runtime.expert_data_parallel)."""

    def forward(self, rows: torch.Tensor, counts: list[int], expert_rows_group: Any = None,
                balanced: bool = False) -> torch.Tensor:
        """Expert-major rows, counts[i] of them for the i-th local expert → their outputs in the same order: as grouped
        products where they run (gbmw.adapters.runtime.grouped_experts), else expert by expert. With
        `expert_rows_group` (+sp, the experts' TP group of more than one rank) the rows are this rank's, and the
        experts' TP shards run on the rows of every rank of the group
        (gbmw.adapters.runtime.expert_sequence_parallel)."""
        experts = list(self.values())
        if expert_rows_group is not None:
            return _over_tp_group(experts, rows, counts, expert_rows_group, balanced)
        grouped = grouped_expert_mlps(experts, rows, counts)
        if grouped is not None:
            return grouped
        return torch.cat([expert(part) for expert, part in zip(experts, rows.split(counts))])


def _over_tp_group(experts: list[ExpertMLP], rows: torch.Tensor, counts: list[int], group: Any, balanced: bool
                   ) -> torch.Tensor:
    """gbmw.adapters.runtime.expert_sequence_parallel's steps: all-gather the TP group's rows, run the experts'
    shards on them expert-major, sum the partial outputs back to the rows' ranks, add fc2's bias."""
    by_rank = peer_counts(counts, group, balanced, rows.device)
    rows_per_rank = [sum(counts)] * by_rank.size(0) if balanced else by_rank.sum(1).tolist()
    gathered = gather_rows(rows, rows_per_rank, group)
    regroup, expert_rows, per_expert = expert_major_rows(gathered, by_rank, counts[0] if balanced else None)
    partial = partial_expert_mlps(experts, expert_rows, per_expert)
    del gathered, expert_rows
    if regroup is not None:
        partial = partial[torch.argsort(regroup)]
    outputs = reduce_scatter_rows(partial, rows_per_rank, group)
    if experts[0].fc2.bias is None:
        return outputs
    return outputs + fc2_bias_rows(experts, counts, group, outputs.dtype)


class MixtureOfExpertsMLP(nn.Module):
    """Router, this rank's routed experts, shared experts: [batch, tokens, hidden] → the same shape."""

    def __init__(self, hidden: int, moe: Any, bias: bool, gated: bool, tp: TensorParallel, experts: ExpertParallel,
                 dtype: torch.dtype):
        super().__init__()
        if moe.num_experts % experts.size:
            raise PlanError(f"expert parallelism +ep{experts.size} must divide the {moe.num_experts} experts")
        self.num_experts, self.top_k, self.ep = moe.num_experts, moe.top_k, experts
        self.sequence_parallel_group = tp.group if tp.sequence_parallel and tp.size > 1 else None
        """+sp: the TP group whose ranks hold sequence slices (gbmw.adapters.runtime.expert_sequence_parallel)."""
        expert_tp = experts.tensor_parallel(tp)
        self.expert_rows_group = expert_tp.group if tp.sequence_parallel and expert_tp.size > 1 else None
        """+sp: the experts' TP group, over which the received copies are gathered for the experts' shards (the layer's
        TP group, or the ETP group under +etpN; None at ETP 1: whole experts on this rank's own copies)."""
        self.router = nn.Linear(hidden, moe.num_experts, bias=False, dtype=dtype)
        local = moe.num_experts // experts.size
        routed_tp = replace(expert_tp, sequence_parallel=False)  # under +sp the experts' shards run without collectives
        self.experts = LocalExperts({
            str(index): ExpertMLP(hidden, moe.expert_ffn_hidden_size, bias, gated, routed_tp, dtype)
            for index in range(experts.rank * local, (experts.rank + 1) * local)})
        shared_width = moe.shared_experts * moe.shared_ffn_hidden_size
        self.shared = ExpertMLP(hidden, shared_width, bias, gated, tp, dtype) if shared_width else None
        gate = moe.shared_experts and moe.shared_expert_gate
        self.shared_gate = nn.Linear(hidden, 1, bias=False, dtype=dtype) if gate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.size(-1))
        balanced = routes_balanced()
        if not balanced and isinstance(tokens, FakeTensor):
            raise PlanError("an MoE layer cannot route fake tensors (its token counts are data): trace it inside "
                            "gbmw.adapters.runtime.experts.balanced_routing(), which routes n·k/E copies to each expert")
        if balanced:
            _check_balanced(tokens.size(0), self.top_k, self.num_experts)
        logits = self._replicated_linear(self.router, tokens)
        weights, chosen = (balanced_route if balanced else route)(logits, self.top_k)
        output = self._routed(tokens, weights, chosen, balanced)
        if self.shared is not None:
            shared = self.shared(tokens)  # +sp: its TP linears gather and reduce-scatter the slices
            if self.shared_gate is not None:
                gate = self._replicated_linear(self.shared_gate, tokens)
                shared = torch.sigmoid(_at_least_fp32(gate)).to(shared.dtype) * shared
            output = output + shared
        return output.view(*x.shape[:-1], output.size(-1))

    def _replicated_linear(self, linear: nn.Linear, tokens: torch.Tensor) -> torch.Tensor:
        """A linear replicated over the TP group (the router, the shared experts' gate); under +sp it sees this rank's
        slice only, so its weight's gradient is summed over the group."""
        if self.sequence_parallel_group is None:
            return linear(tokens)
        return F.linear(tokens, sum_gradient_over_group(linear.weight, self.sequence_parallel_group))

    def _routed(self, tokens: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, balanced: bool = False
                ) -> torch.Tensor:
        """Σ_k weight_k · expert_k(token) for every token of this rank (the sum over its top-k copies). `balanced`:
        `chosen` is the balanced assignment, every count n·k/E (known without reading a tensor)."""
        count, top_k = chosen.shape
        device = tokens.device.type
        if torch.is_autocast_enabled(device):  # dispatch 16-bit copies, as the experts' linears would cast them
            tokens = tokens.to(torch.get_autocast_dtype(device))
        expert_of_copy = chosen.reshape(-1)
        order = torch.argsort(expert_of_copy, stable=True)  # copies sorted by expert, tokens in order within each
        copies = tokens[order // top_k]
        if balanced:
            per_expert = torch.full((self.num_experts,), count * top_k // self.num_experts, dtype=torch.int64,
                                    device=expert_of_copy.device)
        else:
            per_expert = torch.bincount(expert_of_copy, minlength=self.num_experts)
        received, received_counts, splits = self._dispatch(copies, per_expert, balanced)
        # a name kept on a tensor keeps it alive until this function returns: the cast tokens and the copies are sent
        # (EP) or become the experts' input (EP 1), and the received copies are regrouped; only what backward saves
        # stays (the forward peak at the experts' SwiGLU: gbmw.cost.framework_memory.gated_activation_peak_bytes)
        del tokens, copies
        regroup, rows, per_expert = expert_major_rows(
            received, received_counts, count * top_k // self.num_experts if balanced else None)
        del received
        outputs = self.experts(rows, per_expert, self.expert_rows_group, balanced)
        del rows
        if regroup is not None:
            outputs = outputs[torch.argsort(regroup)]
        if splits is not None:
            outputs = _AllToAll.apply(outputs, splits[1], splits[0], self.ep.group)  # combine
        by_copy = outputs[torch.argsort(order)].view(count, top_k, -1)
        del outputs
        # weights are fp32 (or fp64): the product promotes to them, and the multiply saves the 16-bit copies for
        # backward, not an fp32 cast of them (twice their bytes; the same values, so the same gradients)
        return (by_copy * weights.unsqueeze(-1)).sum(1).to(by_copy.dtype)

    def _dispatch(self, copies: torch.Tensor, per_expert: torch.Tensor, balanced: bool = False):
        """(copies received from every EP rank, [source rank, local expert] counts, (received, sent) split sizes).
        `balanced`: every rank sends and receives the same number of copies to and from each (the EP group's ranks
        route as many tokens each)."""
        if self.ep.size == 1:
            return copies, per_expert.view(1, -1), None
        sent_counts = per_expert.view(self.ep.size, -1)  # row q: counts for the experts of EP rank q
        received_counts = torch.empty_like(sent_counts)
        dist.all_to_all_single(received_counts, sent_counts, group=self.ep.group)
        if balanced:
            splits = ([copies.size(0) // self.ep.size] * self.ep.size,) * 2
        else:
            splits = (received_counts.sum(1).tolist(), sent_counts.sum(1).tolist())
        return _AllToAll.apply(copies, splits[0], splits[1], self.ep.group), received_counts, splits

def expert_major_rows(received: torch.Tensor, counts: torch.Tensor, balanced_count: int | None = None
                      ) -> tuple[torch.Tensor | None, torch.Tensor, list[int]]:
    """(the row of `received` each expert-major row came from — None when they already are —, the expert-major
    rows, each local expert's count of them). `received` is source-major ([source][expert] blocks);
    `balanced_count`: every entry of `counts` (balanced routing), which is then not read."""
    sources, local = counts.shape
    per_expert = counts.sum(0).tolist() if balanced_count is None else [balanced_count * sources] * local
    if sources == 1:
        return None, received, per_expert
    sizes = counts.t().reshape(-1)  # expert-major blocks: (expert, source)
    starts = (counts.reshape(-1).cumsum(0) - counts.reshape(-1)).view(sources, local).t().reshape(-1)
    total = int(sizes.sum()) if balanced_count is None else balanced_count * sources * local
    regroup = torch.repeat_interleave(starts - (sizes.cumsum(0) - sizes), sizes, output_size=total) + torch.arange(
        total, device=counts.device)
    return regroup, received[regroup], per_expert


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts) of each token's top-k: softmax over all experts in fp32, top-k, renormalised (Mixtral)."""
    probabilities = torch.softmax(_at_least_fp32(logits), dim=-1)
    weights, chosen = probabilities.topk(top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), chosen


def balanced_route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`route` with the experts of `balanced_experts` in place of the top-k, weighted by their probabilities (the
    gather saves an index the size of top-k's): for `balanced_routing()` only."""
    probabilities = torch.softmax(_at_least_fp32(logits), dim=-1)
    chosen = balanced_experts(logits.size(0), top_k, logits.size(-1), logits.device)
    weights = probabilities.gather(-1, chosen)
    return weights / weights.sum(-1, keepdim=True), chosen


def balanced_experts(tokens: int, top_k: int, num_experts: int, device) -> torch.Tensor:
    """[tokens, top_k] experts of the balanced assignment: copy j = i·k + κ goes to expert j mod E (a token's k
    experts differ, k ≤ E), so each expert gets tokens·k/E copies where E divides tokens·k."""
    return (torch.arange(tokens * top_k, device=device) % num_experts).view(tokens, top_k)


def _check_balanced(tokens: int, top_k: int, num_experts: int) -> None:
    if tokens * top_k % num_experts:
        raise PlanError(f"balanced routing needs the experts ({num_experts}) to divide a rank's token copies: "
                        f"{tokens} tokens × top-{top_k} = {tokens * top_k}")


def _at_least_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """16-bit tensors in fp32; fp32 and fp64 as they are."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


class _AllToAll(torch.autograd.Function):
    """y = AllToAll(x): the rows of x in blocks of `sent` sizes go to the EP ranks in order, y holds the blocks of
    `received` sizes from them. Backward: the gradient goes back by the reverse all-to-all (sent ↔ received)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, received: list[int], sent: list[int], group) -> torch.Tensor:
        ctx.received, ctx.sent, ctx.group = received, sent, group
        return _all_to_all(x, received, sent, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_to_all(grad, ctx.sent, ctx.received, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, received: list[int], sent: list[int], group) -> torch.Tensor:
    output = x.new_empty((sum(received), *x.shape[1:]))
    dist.all_to_all_single(output, x.contiguous(), received, sent, group=group)
    return output


def gather_experts(tensors: dict[str, torch.Tensor], experts: ExpertParallel, device: torch.device
                   ) -> dict[str, torch.Tensor]:
    """A layer's full tensors by name with every EP rank's experts (collective over the EP group): `tensors` holds
    this rank's experts (`moe.experts.<e>.…`, also `…#exp_avg`), the result those of all E experts."""
    if experts.size == 1:
        return tensors
    owned = sorted({int(match[1]) for match in map(_EXPERT_KEY.match, tensors) if match})
    result = {}
    for key, tensor in tensors.items():
        match = _EXPERT_KEY.match(key)
        if match is None:
            result[key] = tensor
            continue
        parts = [torch.empty_like(tensor, device=device) for _ in range(experts.size)]
        dist.all_gather(parts, tensor.to(device).contiguous(), group=experts.group)
        for source, part in enumerate(parts):
            index = source * len(owned) + int(match[1]) - owned[0]
            result[f"moe.experts.{index}.{match[2]}"] = part.to(tensor.device)
    return result
