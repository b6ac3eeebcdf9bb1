"""Rank math for every process group a plan uses (paper Sec. 6, "communication group pool").

Global ranks are laid out with the pipeline outermost, as gbmw's cost model assumes (gbmw.comm): stage
s owns ranks [s·G, (s+1)·G) with G = N / pp. Inside a stage, a layer's strategy numbers the G local
ranks in mixed radix over its dims, innermost first (`tp2-dp4`: local rank = tp_index + 2·dp_index),
so the ranks of one group along an axis are `stride` apart, stride being the product of the inner
degrees. Everything here is pure: no process group is created, so it is unit-tested without
processes; `plan_group_ranks` lists every group a plan needs so a pool can create them once, in the
same order on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from gbmw.errors import PlanError
from gbmw.plan import Plan
from gbmw.space import DATA_PARALLEL_AXES, Strategy

from .tied_weights import tie_group_ranks, tie_partner_pairs


@dataclass(frozen=True)
class RankLayout:
    """Where a global rank sits: its pipeline stage and its rank inside the stage's device group."""

    world_size: int
    pp: int

    def __post_init__(self) -> None:
        if self.pp < 1 or self.world_size % self.pp:
            raise PlanError(f"world_size({self.world_size}) % pp({self.pp}) != 0: stages need equal device groups")

    @property
    def stage_size(self) -> int:
        return self.world_size // self.pp

    def stage_of(self, rank: int) -> int:
        return rank // self.stage_size

    def local_rank(self, rank: int) -> int:
        return rank % self.stage_size

    def next_stage_rank(self, rank: int) -> int | None:
        """The rank this one sends activations to (same local rank, next stage), None on the last stage."""
        stage = self.stage_of(rank)
        return None if stage == self.pp - 1 else rank + self.stage_size

    def previous_stage_rank(self, rank: int) -> int | None:
        stage = self.stage_of(rank)
        return None if stage == 0 else rank - self.stage_size

    def digits(self, rank: int, strategy: Strategy) -> dict[str, int]:
        """This rank's index along every axis of `strategy` (mixed radix, innermost first)."""
        self._check(strategy)
        remainder, result = self.local_rank(rank), {}
        for axis, degree in strategy.dims:
            result[axis] = remainder % degree
            remainder //= degree
        return result

    def group(self, rank: int, strategy: Strategy, axes: tuple[str, ...]) -> tuple[int, ...]:
        """The global ranks that share every digit of `rank` except those of `axes` (sorted)."""
        self._check(strategy)
        digits = self.digits(rank, strategy)
        base = self.stage_of(rank) * self.stage_size
        members = [base]
        stride = 1
        for axis, degree in strategy.dims:
            if axis in axes:
                members = [member + index * stride for member in members for index in range(degree)]
            else:
                members = [member + digits[axis] * stride for member in members]
            stride *= degree
        return tuple(sorted(members))

    def tensor_group(self, rank: int, strategy: Strategy) -> tuple[int, ...]:
        return self.group(rank, strategy, ("tp",))

    def data_group(self, rank: int, strategy: Strategy) -> tuple[int, ...]:
        """Ranks holding the same weights but different samples: gradients are averaged over them."""
        return self.group(rank, strategy, DATA_PARALLEL_AXES)

    def batch_shard(self, rank: int, strategy: Strategy) -> tuple[int, int]:
        """(index, count): this rank holds the index-th of `count` equal slices of each micro-batch
        (data-parallel digits combined with the outer axis most significant, as gbmw.cost's layouts)."""
        digits = self.digits(rank, strategy)
        index, count = 0, 1
        for axis, degree in strategy.dims:
            if axis in DATA_PARALLEL_AXES:
                index += digits[axis] * count
                count *= degree
        return index, count

    def _check(self, strategy: Strategy) -> None:
        if strategy.group_size != self.stage_size:
            raise PlanError(
                f"strategy {strategy.name} spans {strategy.group_size} devices but a stage has "
                f"world_size({self.world_size}) / pp({self.pp}) = {self.stage_size}"
            )


def plan_group_ranks(plan: Plan) -> list[tuple[int, ...]]:
    """Every group of two or more ranks the plan uses — TP and data-parallel groups of each layer's
    strategy, per-axis groups of multi-axis data parallelism, each stage, the first and last stages
    together (tied embeddings), and pipeline neighbours — once each, in
    a deterministic order (torch.distributed.new_group must be called in the same order everywhere)."""
    layout = RankLayout(plan.num_devices, plan.pp)
    seen: dict[tuple[int, ...], None] = {}
    for stage, (first, end) in enumerate(plan.stage_bounds):
        ranks = range(stage * layout.stage_size, (stage + 1) * layout.stage_size)
        for strategy in dict.fromkeys(plan.strategies[first:end]):
            axis_sets = [("tp",), DATA_PARALLEL_AXES] + [(axis,) for axis, _ in strategy.dims if axis != "tp"]
            for axes in axis_sets:
                for rank in ranks:
                    group = layout.group(rank, strategy, axes)
                    if len(group) > 1:
                        seen.setdefault(group, None)
    for stage in range(plan.pp):  # Slice-Gather between layers runs over the whole stage
        stage_ranks = tuple(range(stage * layout.stage_size, (stage + 1) * layout.stage_size))
        if len(stage_ranks) > 1:
            seen.setdefault(stage_ranks, None)
    first_and_last = tie_group_ranks(plan)  # tied embedding/head gradients (tied_weights)
    if len(first_and_last) > 1:
        seen.setdefault(first_and_last, None)
    for pair in tie_partner_pairs(plan):
        seen.setdefault(pair, None)
    for rank in range(plan.num_devices):
        following = layout.next_stage_rank(rank)
        if following is not None:
            seen.setdefault((rank, following), None)
    return list(seen)


class GroupPool:
    """Every process group a plan uses, created once, in the same order on every rank (paper Sec. 6:
    creating communicator groups is expensive, so the pool is built up front and passed explicitly).

    `GroupPool(plan)` must be called on every rank after torch.distributed is initialised; `get(ranks)`
    returns the group of exactly those global ranks (None for a single rank).
    """

    def __init__(self, plan: Plan, backend: str | None = None):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise PlanError("GroupPool needs torch.distributed initialised (see gbmw.adapters.runtime.launch)")
        if dist.get_world_size() != plan.num_devices:
            raise PlanError(
                f"the plan is for {plan.num_devices} devices but {dist.get_world_size()} processes were launched; "
                f"launch {plan.num_devices} or plan again for {dist.get_world_size()}"
            )
        self.plan = plan
        self.layout = RankLayout(plan.num_devices, plan.pp)
        self.rank = dist.get_rank()
        self._groups = {ranks: dist.new_group(list(ranks), backend=backend) for ranks in plan_group_ranks(plan)}

    def get(self, ranks: tuple[int, ...]):
        if len(ranks) == 1:
            return None
        try:
            return self._groups[tuple(sorted(ranks))]
        except KeyError:
            raise PlanError(f"ranks {ranks} are not a group of this plan") from None

    def stage_group(self):
        """All ranks of this rank's pipeline stage (None for a one-device stage)."""
        stage = self.layout.stage_of(self.rank)
        size = self.layout.stage_size
        return self.get(tuple(range(stage * size, (stage + 1) * size)))

    def tensor_group(self, strategy: Strategy):
        return self.get(self.layout.tensor_group(self.rank, strategy))

    def data_group(self, strategy: Strategy):
        return self.get(self.layout.data_group(self.rank, strategy))

    def __len__(self) -> int:
        return len(self._groups)
