"""Rank math, once and torch-free: where each rank sits, which ranks form each group a plan uses, and which
slice of a micro-batch each rank holds (paper Sec. 6, "communication group pool").

Global ranks are laid out with the pipeline outermost (Takeaway #1: PP across the slowest links): stage s
owns ranks [s·G, (s+1)·G) with G = N / pp. Inside a stage, a layer's strategy numbers the G local ranks in
mixed radix over its dims, innermost first (`tp2-dp4`: local rank = tp_index + 2·dp_index), so the ranks of
one group along an axis are `Strategy.stride(axis)` apart. The cost model (gbmw.cost.comm, the transition cost R)
and the runtime (its process-group pool, Slice-Gather, tied weights) both read their layouts from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gbmw.errors import PlanError
from gbmw.plan import Plan
from gbmw.space.strategy import DATA_PARALLEL_AXES, SEQUENCE_AXES, Strategy


def axis_digits(local_rank: int, strategy: Strategy) -> dict[str, int]:
    """A stage-local rank's index along every axis of `strategy` (mixed radix, innermost first)."""
    remainder, digits = local_rank, {}
    for axis, degree in strategy.dims:
        digits[axis] = remainder % degree
        remainder //= degree
    return digits


def batch_shard(local_rank: int, strategy: Strategy) -> tuple[int, int]:
    """(index, count): a stage-local rank holds the index-th of `count` equal slices of each micro-batch — its
    data-parallel digits combined with the outer axis most significant; TP ranks share a slice."""
    digits = axis_digits(local_rank, strategy)
    index, count = 0, 1
    for axis, degree in strategy.dims:
        if axis in DATA_PARALLEL_AXES:
            index += digits[axis] * count
            count *= degree
    return index, count


def sequence_shard(local_rank: int, strategy: Strategy) -> tuple[int, int]:
    """(index, count): a stage-local rank's digit on the strategy's sequence axis (cp, ulysses) and that axis' degree;
    (0, 1) without one. Which tokens the digit stands for is `sequence_pieces`."""
    axis = strategy.sequence_axis
    return (axis_digits(local_rank, strategy)[axis], strategy.degree(axis)) if axis else (0, 1)


def sequence_pieces(local_rank: int, strategy: Strategy) -> tuple[tuple[int, int], ...]:
    """The contiguous pieces of every sample's tokens a stage-local rank holds, in token order, each (index, count):
    the index-th of `count` equal parts. Ulysses rank j of u: part j of u, one piece. Ring context parallelism rank j
    of c: chunks j and 2c − 1 − j of 2c — megatron-core's load-balanced causal split
    (megatron.core.utils.get_batch_on_this_cp_rank), so every rank holds as many early queries (few keys before them)
    as late ones and does the same causal attention work. ((0, 1),) without a sequence axis."""
    index, count = sequence_shard(local_rank, strategy)
    if strategy.sequence_axis != "cp":
        return ((index, count),)
    return ((index, 2 * count), (2 * count - 1 - index, 2 * count))


def data_layout(strategy: Strategy) -> tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]:
    """(batch index, batch count, sequence pieces) of every local rank of the stage: which samples of a micro-batch
    (`batch_shard`) and which of their tokens (`sequence_pieces`) each rank holds. What the transition cost R compares
    and Slice-Gather moves (gbmw.adapters.runtime.redistribute). It depends on the axes only: strategies that differ
    in recomputation, +sp or +ep share one entry."""
    return _data_layout_of_dims(strategy.dims)


@lru_cache(maxsize=None)
def _data_layout_of_dims(dims: tuple[tuple[str, int], ...]) -> tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]:
    strategy = Strategy(dims)
    return tuple(batch_shard(local, strategy) + (sequence_pieces(local, strategy),)
                 for local in range(strategy.group_size))


_layout_numbers: dict[tuple, int] = {}


@lru_cache(maxsize=None)
def data_layout_number(strategy: Strategy) -> int:
    """A number per distinct `data_layout` (equal layouts, equal numbers) — cheaper to compare and hash than the
    layout itself, whose entries grow with the stage's ranks."""
    return _layout_numbers.setdefault(data_layout(strategy), len(_layout_numbers))


@lru_cache(maxsize=None)
def activation_layout(strategy: Strategy) -> tuple[tuple[int, int], ...]:
    """`batch_shard` of every local rank of the stage, in rank order. Strategies with the same layout
    (tp2-dp4 and tp2-sdp4; any two with CKPT on and off) need no Slice-Gather between them."""
    return tuple(batch_shard(local, strategy) for local in range(strategy.group_size))


def transition_fraction(previous: Strategy, current: Strategy) -> float:
    """Largest fraction of the micro-batch's boundary activation one rank must receive in the Slice-Gather
    from `previous`'s layout to `current`'s: forward (the slice it lacks) plus backward (gradients of the
    slice it held but no longer computes). What the transition cost R of Eq. (4) sends. It depends on the dims
    alone (not on recomputation, +sp, +ep or +etp), and is computed once per pair of dims."""
    if previous.group_size != current.group_size:
        raise ValueError("strategies of one stage share the group size")
    return _transition_fraction_of_dims(previous.dims, current.dims)


@lru_cache(maxsize=None)
def _transition_fraction_of_dims(previous_dims: tuple, current_dims: tuple) -> float:
    if not any(axis in SEQUENCE_AXES for axis, _ in previous_dims + current_dims):
        return _whole_sample_transition_fraction(previous_dims, current_dims)
    worst = 0.0
    # ranks with the same (held, needed) entries (TP peers, say) receive the same: each distinct pair once
    for held, needed in set(zip(data_layout(Strategy(previous_dims)), data_layout(Strategy(current_dims)))):
        # a rank holds (samples × token pieces); what it lacks of the needed ones comes from the others
        tokens_in_common = sum(_overlap(*held_piece, *needed_piece)
                               for held_piece in held[2] for needed_piece in needed[2])
        overlap = _overlap(held[0], held[1], needed[0], needed[1]) * tokens_in_common
        forward = _held_fraction(needed) - overlap
        backward = _held_fraction(held) - overlap
        worst = max(worst, forward + backward)
    return worst


def _whole_sample_transition_fraction(previous_dims: tuple, current_dims: tuple) -> float:
    """`_transition_fraction_of_dims` where every rank holds whole samples (no sequence axis), over all ranks at once:
    the same float operations, rank by rank, as the general loop (one token piece (0, 1), whose overlap is 1.0)."""
    held_index, held_count = _batch_shards(previous_dims)
    needed_index, needed_count = _batch_shards(current_dims)
    overlap = np.maximum(0.0, np.minimum((held_index + 1) / held_count, (needed_index + 1) / needed_count)
                         - np.maximum(held_index / held_count, needed_index / needed_count))
    return float(max(0.0, ((1 / needed_count - overlap) + (1 / held_count - overlap)).max()))


@lru_cache(maxsize=None)
def _batch_shards(dims: tuple[tuple[str, int], ...]) -> tuple[np.ndarray, int]:
    """`batch_shard` of every local rank, as (indices, count): the count is the same for every rank."""
    layout = _data_layout_of_dims(dims)
    return np.array([index for index, _, _ in layout], dtype=np.int64), layout[0][1]


def _held_fraction(shard: tuple[int, int, tuple[tuple[int, int], ...]]) -> float:
    """The fraction of a micro-batch's activation a `data_layout` entry holds."""
    return sum(1 / count for _, count in shard[2]) / shard[1]


def _overlap(index_a: int, count_a: int, index_b: int, count_b: int) -> float:
    """The common length of the index_a-th of count_a and the index_b-th of count_b equal parts of [0, 1)."""
    return max(0.0, min((index_a + 1) / count_a, (index_b + 1) / count_b) - max(index_a / count_a, index_b / count_b))


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

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        return tuple(range(stage * self.stage_size, (stage + 1) * self.stage_size))

    def next_stage_rank(self, rank: int) -> int | None:
        """The rank this one sends activations to (same local rank, next stage), None on the last stage."""
        stage = self.stage_of(rank)
        return None if stage == self.pp - 1 else rank + self.stage_size

    def previous_stage_rank(self, rank: int) -> int | None:
        stage = self.stage_of(rank)
        return None if stage == 0 else rank - self.stage_size

    def digits(self, rank: int, strategy: Strategy) -> dict[str, int]:
        """This rank's index along every axis of `strategy`."""
        self._check(strategy)
        return axis_digits(self.local_rank(rank), strategy)

    def group(self, rank: int, strategy: Strategy, axes: tuple[str, ...]) -> tuple[int, ...]:
        """The global ranks that share every digit of `rank` except those of `axes` (sorted)."""
        digits = self.digits(rank, strategy)
        members = [self.stage_of(rank) * self.stage_size]
        for axis, degree in strategy.dims:
            stride = strategy.stride(axis)
            if axis in axes:
                members = [member + index * stride for member in members for index in range(degree)]
            else:
                members = [member + digits[axis] * stride for member in members]
        return tuple(sorted(members))

    def tensor_group(self, rank: int, strategy: Strategy) -> tuple[int, ...]:
        return self.group(rank, strategy, ("tp",))

    def ulysses_group(self, rank: int, strategy: Strategy) -> tuple[int, ...]:
        """The Ulysses group: the ranks with the same digit as `rank` on every axis but `ulysses` — they hold the
        same samples' other parts of the sequence, in sequence order ((rank,) without a ulysses axis)."""
        return self.group(rank, strategy, ("ulysses",))

    def sequence_group(self, rank: int, strategy: Strategy) -> tuple[int, ...]:
        """The ranks with the same digit as `rank` on every axis but the strategy's sequence axis (cp or ulysses):
        they hold the same samples' other tokens, in the order of their sequence digits ((rank,) without one)."""
        return self.group(rank, strategy, SEQUENCE_AXES)

    def gradient_group(self, rank: int, strategy: Strategy) -> tuple[int, ...]:
        """Ranks holding the same weights, whose gradients are summed: the data-parallel group of the strategy's
        `gradient_view` (its data-parallel and sequence axes together; the data group without a sequence axis)."""
        return self.group(rank, strategy, DATA_PARALLEL_AXES + SEQUENCE_AXES)

    def data_group(self, rank: int, strategy: Strategy) -> tuple[int, ...]:
        """Ranks holding the same weights but different samples: gradients are summed over them."""
        return self.group(rank, strategy, DATA_PARALLEL_AXES)

    def expert_group(self, rank: int, strategy: Strategy) -> tuple[int, ...]:
        """The expert-parallel group: the ranks that exchange tokens for a mixture-of-experts layer's experts (each
        holds 1/ep of them). Same TP index; data-parallel indices that agree except their lowest ep-ary digit —
        `ep` consecutive data-parallel indices (EP innermost among the data-parallel ranks, megatron-core's tp-ep-dp
        order); with a sequence axis, indices of `gradient_view`'s data-parallel axis (sequence ranks first, as
        megatron-core's expert grid folds cp into EP and EDP). Under `+etpN` (gbmw.space.expert_tensor_parallel):
        the stage's local ranks r = a + ETP·(e + EP·d) with the same a and d. (rank,) for ep = 1."""
        return self._expert_split(rank, strategy, within=True)

    def expert_data_group(self, rank: int, strategy: Strategy) -> tuple[int, ...]:
        """The expert-data-parallel group: the ranks holding the same experts, whose expert gradients are summed —
        data-parallel indices with the same position inside their EP group (dp / ep of them, ep apart); under
        `+etpN`, the local ranks with the same a and e (W / (ETP·EP) of them, ETP·EP apart)."""
        return self._expert_split(rank, strategy, within=False)

    def expert_tensor_group(self, rank: int, strategy: Strategy) -> tuple[int, ...]:
        """The experts' TP group: the layer's TP group, or under `+etpN` the ETP consecutive ranks that split each
        expert (the local ranks with the same e and d)."""
        if strategy.expert_tp is None:
            return self.tensor_group(rank, strategy)
        self._check(strategy)
        first = rank - rank % strategy.expert_tp
        return tuple(range(first, first + strategy.expert_tp))

    def _expert_split(self, rank: int, strategy: Strategy, within: bool) -> tuple[int, ...]:
        if strategy.expert_tp is not None and strategy.ep > 1:  # megatron-core's expert grid: ETP, EP, EDP
            self._check(strategy)
            local, etp, ep = self.local_rank(rank), strategy.expert_tp, strategy.ep
            base = rank - local
            if within:
                first = local % etp + local // (etp * ep) * etp * ep
                return tuple(base + first + index * etp for index in range(ep))
            return tuple(base + local % (etp * ep) + index * etp * ep for index in range(strategy.expert_data_parallel))
        if strategy.ep == 1:
            return (rank,) if within else self.data_group(rank, strategy)
        strategy = strategy.gradient_view  # a sequence axis merged into the data-parallel one, sequence ranks first
        (axis,) = [axis for axis, _ in strategy.dims if axis in DATA_PARALLEL_AXES]  # Strategy checks there is one
        index, stride, ep = self.digits(rank, strategy)[axis], strategy.stride(axis), strategy.ep
        base = rank - index * stride
        if within:
            indices = [index // ep * ep + position for position in range(ep)]
        else:
            indices = [index % ep + group * ep for group in range(strategy.data_parallel // ep)]
        return tuple(base + data_index * stride for data_index in indices)

    def batch_shard(self, rank: int, strategy: Strategy) -> tuple[int, int]:
        """(index, count) of the micro-batch slice a global rank holds under `strategy`."""
        self._check(strategy)
        return batch_shard(self.local_rank(rank), strategy)

    def _check(self, strategy: Strategy) -> None:
        if strategy.group_size != self.stage_size:
            raise PlanError(
                f"strategy {strategy.name} spans {strategy.group_size} devices but a stage has "
                f"world_size({self.world_size}) / pp({self.pp}) = {self.stage_size}"
            )


# ----------------------------------------------------------------------------------------------
# Tied embedding and head (GPT-2/3, BERT): the first stage holds one copy, the last stage the other
# ----------------------------------------------------------------------------------------------


def tie_group_ranks(plan: Plan) -> tuple[int, ...]:
    """The ranks of the first and the last stage (the stages holding the embedding and the head)."""
    layout = RankLayout(plan.num_devices, plan.pp)
    return tuple(sorted(set(layout.stage_ranks(0)) | set(layout.stage_ranks(plan.pp - 1))))


def tie_partner_pairs(plan: Plan) -> list[tuple[int, int]]:
    """(first-stage rank, the last-stage rank with the same local rank), for pp > 1."""
    size = plan.num_devices // plan.pp
    offset = plan.num_devices - size
    return [(rank, rank + offset) for rank in range(size)] if plan.pp > 1 else []


def plan_group_ranks(plan: Plan) -> list[tuple[int, ...]]:
    """Every group of two or more ranks the plan uses — TP and data-parallel groups of each layer's
    strategy, per-axis groups of multi-axis data parallelism and of a sequence axis (Ulysses groups), the gradient
    groups of strategies with a sequence axis (its ranks and the data-parallel ones together), expert-parallel and
    expert-data-parallel groups (+epN) and the experts' TP groups (+etpN), each stage (Slice-Gather), the first and last stages together and their rank pairs (tied weights), and
    pipeline neighbours — once each, in a deterministic order (torch.distributed.new_group must be called in the
    same order on every rank)."""
    layout = RankLayout(plan.num_devices, plan.pp)
    seen: dict[tuple[int, ...], None] = {}
    for stage, (first, end) in enumerate(plan.stage_bounds):
        for strategy in dict.fromkeys(plan.strategies[first:end]):
            axis_sets = [("tp",), DATA_PARALLEL_AXES] + [(axis,) for axis, _ in strategy.dims if axis != "tp"]
            for axes in axis_sets:
                for rank in layout.stage_ranks(stage):
                    group = layout.group(rank, strategy, axes)
                    if len(group) > 1:
                        seen.setdefault(group, None)
            for rank in layout.stage_ranks(stage) if strategy.sequence_axis else ():
                seen.setdefault(layout.gradient_group(rank, strategy), None)  # data-parallel and sequence axes
            for rank in layout.stage_ranks(stage) if strategy.ep > 1 else ():
                for group in (layout.expert_group(rank, strategy), layout.expert_data_group(rank, strategy),
                              layout.expert_tensor_group(rank, strategy)):
                    if len(group) > 1:
                        seen.setdefault(group, None)
    for stage in range(plan.pp):
        if layout.stage_size > 1:
            seen.setdefault(layout.stage_ranks(stage), None)
    first_and_last = tie_group_ranks(plan)
    if len(first_and_last) > 1:
        seen.setdefault(first_and_last, None)
    for pair in tie_partner_pairs(plan):
        seen.setdefault(pair, None)
    for rank in range(plan.num_devices):
        following = layout.next_stage_rank(rank)
        if following is not None:
            seen.setdefault((rank, following), None)
    return list(seen)
