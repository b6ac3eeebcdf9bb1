"""An independent brute force over WHOLE plans, to check that the planner's exact mode is exact (issue 13).

The space enumerated (`WholePlanOracle`) is the space `Planner(job, variant, exact=True)` claims to search for the
per-layer variants `gbmw` (the default), `bmw`, `base` and `1f1b+bi-obj` on the runtime target, restated here by
plain loops rather than read from the search:

* pipeline degrees: every power of two P dividing the device count N with P ≤ the number of layers L
  (gbmw.space.strategy.pipeline_degrees; Planner._settings stops at P > L);
* micro-batch size b and count m: with a fixed global batch B every divisor b of B and m = B / b (gradient
  accumulation allowed without a pipeline, Planner's default); with a batch sweep up to B_max every b in
  {2^e, 3·2^e} ≤ B_max and EVERY power of two m ≤ B_max // b, plus B_max // b itself. The planner tries only
  the powers of two m < P and the largest, arguing that 1F1B's memory stops growing at m ≥ P while the throughput
  keeps growing; the oracle does not take that argument for granted, so the sweep checks it;
* partitions: every composition of L into P stages of at least one layer (the exact mode's free partitioning);
* strategies: for each layer, every decision tree over the stage's N / P devices (each axis of the variant at most
  once, power-of-two degrees ≥ 2 whose product is the group size, every order; `gbmw`: at most one data-parallel
  axis beside TP; the paper's variants: never dp with sdp (Takeaway #3)), with and without CKPT where the variant
  recomputes, whose data-parallel degree divides b and whose TP degree divides the layer's attention and key/value
  heads; `gbmw` on a mixture-of-experts model: every tree with one data-parallel axis of degree d also with expert
  parallelism +epE for every power of two 2 ≤ E ≤ d, on the MoE blocks whose experts E divides (never on a dense
  layer), and every +sp tree whose innermost axis is TP (inside a node) with at most one data-parallel axis also with
  the experts whole beside it, +epE+etp1, for every power of two 2 ≤ E ≤ N / P; `gbmw+ulysses` also offers a `ulysses`
  axis, placed immediately inside the one data-parallel axis (or outermost without one), never with +sp; with +epE
  for every power of two E dividing u·d (u without a data-parallel axis: every rank holding other tokens), on layers whose attention and key/value heads tp·u divides and whose sequence
  u divides, and — the dominance rule of gbmw.space.spaces.SearchSpace.usable — only at micro-batch sizes that
  u·d does not divide (d the data-parallel degree). `ORACLE_SPACES` writes these rules out; tests/test_search_exact.py
  checks them against gbmw.space.spaces.

The objective is gbmw's own estimate: a whole plan's samples/s and its stages' peak memory are estimate_plan's
(gbmw.cost.estimate), and a plan fits when every stage's peak is at most the budget, as `Estimate.fits` says.
`literal=True` calls estimate_plan on every whole Plan of the space (slow: about 0.5 ms a plan). The default mode
computes the very same numbers faster and just as exactly:

1. estimate_plan prices a plan as `pipeline_time_s(stages, m)` over `stage_estimate(costs, i, first, strategies)`
   per stage, with StageCosts built from the plan's strategies (gbmw.cost.estimate.plan_stage_estimates). A stage's
   estimate depends on nothing outside the stage (its index, first layer, own strategies and the setting), and a
   strategy's per-layer costs do not depend on which other strategies a table holds, so the oracle builds one
   table per (P, b) over every usable strategy and prices each stage ONCE per (setting, index, first layer,
   strategies), by exhaustive itertools.product over the stage's layers.
2. Eq. (9) as gbmw.cost.pipeline_schedules writes it, T = (m − 1)·max N_i + Σ N_i + max S_i + max U_i, never falls when
   a stage's N, S or U falls, and a whole plan's peak is the largest stage peak. So a stage option that another
   option of the same stage position matches or beats in all of (peak, N, S, U) can be replaced by it without a
   slower or larger whole plan; such options are dropped before stages are crossed, and partial crossings matched
   or beaten in all of (max peak, max N, Σ N, max S, max U) likewise (IEEE sums and maxima are monotone too).
3. The result is budget-free: the plans no other plan matches or beats in both peak and samples/s
   (`frontier`). The best plan for a budget W is the fastest frontier plan with peak ≤ W; `best` rebuilds it as a
   Plan and checks that estimate_plan gives it the same samples/s and fits.

tests/test_search_exact.py checks the default mode against `literal=True` on small spaces. Nothing here calls the
search (stage_search, whole_plan_search, grid_frontier, pareto, bounds, balance, Planner internals).
"""

from __future__ import annotations

import itertools
import math
import random
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
from conftest import make_cluster, make_job, make_model

from gbmw.cost.comm import CommModel
from gbmw.cost.estimate import estimate_plan
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.pipeline_schedules import pipeline_time_s
from gbmw.cost.stage_cost import StageCosts, StageEstimate, stage_estimate, strategy_tables
from gbmw.plan import Plan
from gbmw.space.strategy import Strategy
from gbmw.space.targets import get_target
from gbmw.specs.architectures import GPTArchitecture, T5Architecture
from gbmw.specs.jobs import JobSpec
from gbmw.specs.model_spec import LayerSpec, LayerTimings, ModelSpec, ModelTimings
from gbmw.specs.models import build_model, model_as_run

PLACEHOLDER_BUDGET_BYTES = 2**50
"""The budget a job is built with before one is chosen from its frontier (`with_budget`)."""


# ---------------------------------------------------------------------------------------------------- the space


@dataclass(frozen=True)
class OracleSpace:
    """One variant's per-layer choices, restated from gbmw.space.spaces by hand."""

    axes: tuple[str, ...]
    ckpt: bool
    one_data_parallel_axis: bool
    """`gbmw`: at most one of dp, z1dp, z2dp, sdp in a tree (beside TP)."""
    no_dp_with_sdp: bool
    """The paper's Takeaway #3."""
    schedule: str = "1f1b"
    sequence_parallel: bool = False
    """`gbmw`: every tree with TP also with +sp (Korthikanti et al. Sec. 4.2.2), at each recomputation level; the
    runtime runs it in Transformer blocks whose sequence the TP degree divides (`_runtime_runs`)."""
    expert_parallel: bool = False
    """`gbmw`: on a mixture-of-experts model, every strategy with one data-parallel axis also with +epE, and every
    +sp strategy whose TP (inside a node) is innermost, with at most one data-parallel axis, also with +epE+etp1."""
    ulysses_where_undominated: bool = False
    """`gbmw+ulysses`: a strategy with a ulysses axis of degree u and data-parallel degree d only where u·d does not divide
    the micro-batch (elsewhere the same tree with the ulysses axis folded into data parallelism, d·u ways, costs
    no more per layer; `_usable`)."""


ORACLE_SPACES: dict[str, OracleSpace] = {
    "gbmw": OracleSpace(("dp", "z1dp", "z2dp", "sdp", "tp"), ckpt=True, one_data_parallel_axis=True,
                        no_dp_with_sdp=False, sequence_parallel=True, expert_parallel=True),
    "gbmw+ulysses": OracleSpace(("dp", "z1dp", "z2dp", "sdp", "tp", "ulysses"), ckpt=True, one_data_parallel_axis=True,
                                no_dp_with_sdp=False, sequence_parallel=True, expert_parallel=True,
                                ulysses_where_undominated=True),
    "bmw": OracleSpace(("dp", "sdp", "tp"), ckpt=True, one_data_parallel_axis=False, no_dp_with_sdp=True),
    "base": OracleSpace(("dp", "sdp", "tp"), ckpt=True, one_data_parallel_axis=False, no_dp_with_sdp=True,
                        schedule="gpipe"),
    "1f1b+bi-obj": OracleSpace(("dp", "sdp", "tp"), ckpt=False, one_data_parallel_axis=False, no_dp_with_sdp=True),
}
"""The per-layer variants whose exact mode searches every partition (their partitioning is `time` and/or
`bi-objective`), all on gbmw's runtime target with the 1F1B schedule but `base` (Galvatron's GPipe, as the paper's
Galvatron-Base ran)."""


def oracle_strategies(space: OracleSpace, group_size: int, experts: bool = False, devices_per_node: int | None = None
                      ) -> list[Strategy]:
    """Every decision tree over `group_size` devices the variant allows, without and with CKPT (and with each EP
    degree its one data-parallel axis allows, for a mixture-of-experts model, and the experts whole beside a TP of at
    most `devices_per_node` ranks, None: any)."""
    degrees = [2**e for e in range(1, group_size.bit_length()) if 2**e <= group_size]
    trees: list[tuple] = [()] if group_size == 1 else []
    for count in range(1, len(space.axes) + 1):
        for axes in itertools.permutations(space.axes, count):
            data_axes = [axis for axis in axes if axis not in ("tp", "ulysses")]
            if space.one_data_parallel_axis and len(data_axes) > 1:
                continue
            if "ulysses" in axes and axes.index("ulysses") != (axes.index(data_axes[0]) - 1 if data_axes
                                                               else len(axes) - 1):
                continue  # ulysses just inside the data-parallel axis, or outermost
            if space.no_dp_with_sdp and "dp" in axes and "sdp" in axes:
                continue
            for chosen in itertools.product(degrees, repeat=count):
                if math.prod(chosen) == group_size:
                    trees.append(tuple(zip(axes, chosen)))
    levels = (False, True) if space.ckpt else (False,)
    plain = [Strategy(tree, ckpt) for ckpt in levels for tree in trees]
    with_tp = [tree for tree in trees if any(axis == "tp" for axis, _ in tree)
               and not any(axis == "ulysses" for axis, _ in tree)]  # the runtime runs no +sp with Ulysses
    strategies = plain + ([Strategy(tree, ckpt, sp=True) for ckpt in levels for tree in with_tp]
                          if space.sequence_parallel else [])
    if not (experts and space.expert_parallel):
        return strategies
    with_ep = []
    for strategy in strategies:  # EP over the ranks holding other tokens: every axis but TP, one data axis at most
        others = [(axis, degree) for axis, degree in strategy.dims if axis != "tp"]
        if others and sum(axis != "ulysses" for axis, _ in others) <= 1:
            with_ep += [Strategy(strategy.dims, strategy.ckpt, sp=strategy.sp, ep=ep)
                        for ep in degrees if math.prod(degree for _, degree in others) % ep == 0]
    whole = [Strategy(strategy.dims, strategy.ckpt, sp=True, ep=ep, expert_tp=1)
             for strategy in strategies if strategy.sp and strategy.dims[0][0] == "tp"
             and (devices_per_node is None or strategy.tp <= devices_per_node) and len(strategy.dims) <= 2
             for ep in degrees]
    return strategies + with_ep + whole


def _tp_divides_heads(strategy: Strategy, layer: LayerSpec) -> bool:
    return all(heads == 0 or heads % strategy.tp == 0 for heads in (layer.attention_heads, layer.kv_heads))


def _usable(space: OracleSpace, strategy: Strategy, micro_batch: int) -> bool:
    """The data-parallel degree d divides the micro-batch; with a ulysses axis of degree u, u·d does not (where it
    does, the same tree with d·u data-parallel ways and no ulysses dominates it)."""
    u = strategy.degree("ulysses")
    return micro_batch % strategy.data_parallel == 0 and not (
        space.ulysses_where_undominated and u > 1 and micro_batch % (u * strategy.data_parallel) == 0)


def _runtime_runs(strategy: Strategy, layer: LayerSpec, sequence_length: int) -> bool:
    """TP divides the layer's heads; +sp only in a Transformer block (dense or MoE) whose sequence TP divides; +ep
    with TP, any data-parallel flavour and ulysses, in a mixture-of-experts block whose experts EP divides; ulysses u:
    tp·u divides the heads, u the sequence, and the layer reads no second sequence."""
    experts_ok = strategy.ep == 1 or (layer.num_experts > 0 and layer.num_experts % strategy.ep == 0)
    u = strategy.degree("ulysses")
    ulysses_ok = u == 1 or (sequence_length % u == 0 and not layer.side_input_bytes_per_sample and all(
        heads == 0 or heads % (strategy.tp * u) == 0 for heads in (layer.attention_heads, layer.kv_heads)))
    return _tp_divides_heads(strategy, layer) and experts_ok and ulysses_ok and (
        not strategy.sp or (layer.is_block and sequence_length % strategy.tp == 0))


def compositions(layers: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to cut `layers` layers into `parts` consecutive stages of at least one layer each."""
    return [tuple(b - a for a, b in zip((0,) + cuts, cuts + (layers,)))
            for cuts in itertools.combinations(range(1, layers), parts - 1)]


@dataclass(frozen=True)
class Setting:
    pp: int
    micro_batch: int
    num_micro_batches: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.num_micro_batches


def oracle_settings(job: JobSpec) -> list[Setting]:
    """(P, b, m) of the space (see the module docstring)."""
    devices, layers = job.cluster.num_devices, job.model.num_layers
    degrees = [2**e for e in range(devices.bit_length()) if devices % 2**e == 0 and 2**e <= layers]
    pairs: list[tuple[int, int]] = []
    if job.global_batch is not None:
        pairs = [(b, job.global_batch // b) for b in range(1, job.global_batch + 1) if job.global_batch % b == 0]
    else:
        limit = job.max_global_batch
        sizes = sorted({size for e in range(limit.bit_length()) for size in (2**e, 3 * 2**e) if size <= limit})
        for b in sizes:
            largest = limit // b
            pairs += [(b, m) for m in sorted({2**e for e in range(largest.bit_length())} | {largest})]
    return [Setting(pp, b, m) for pp in degrees for b, m in pairs]


def _stage_positions(layers: int, pp: int):
    """(stage index, first layer, layers) of every stage any partition into `pp` stages has."""
    for index in range(pp):
        last = index == pp - 1
        for first in range(index, layers - (pp - 1 - index)):
            for count in range(1, layers - (pp - 1 - index) - first + 1):
                if last and first + count != layers or index == 0 and first != 0:
                    continue
                yield index, first, count


def oracle_work(job: JobSpec, variant: str) -> tuple[int, int]:
    """(stage estimates the default mode computes, whole plans in the space) for `job`, without costing any."""
    space, model = ORACLE_SPACES[variant], job.model
    stage_work = whole_plans = 0
    for setting in oracle_settings(job):
        usable = [s for s in oracle_strategies(space, job.cluster.num_devices // setting.pp,
                                               model.is_mixture_of_experts)
                  if _usable(space, s, setting.micro_batch)]
        counts = [sum(1 for s in usable if _runtime_runs(s, layer, model.sequence_length)) for layer in model.layers]
        if 0 in counts:
            continue
        for _, first, count in _stage_positions(model.num_layers, setting.pp):
            stage_work += math.prod(counts[first:first + count])
        whole_plans += len(compositions(model.num_layers, setting.pp)) * math.prod(counts)
    return stage_work, whole_plans


# ---------------------------------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class OraclePlan:
    """A plan of the space with its estimate: samples/s and its largest stage peak (bytes)."""

    samples_per_s: float
    peak_bytes: float
    setting: Setting
    partition: tuple[int, ...]
    strategies: tuple[Strategy, ...]

    def plan(self, job: JobSpec) -> Plan:
        return Plan(model=job.model.name, cluster=job.cluster.name, num_devices=job.cluster.num_devices,
                    precision=job.precision, global_batch=self.setting.global_batch,
                    micro_batch=self.setting.micro_batch, num_micro_batches=self.setting.num_micro_batches,
                    pp=self.setting.pp, partition=self.partition, strategies=self.strategies)


def _nondominated(items: list, values: Callable[[object], tuple]) -> list:
    """The items no other item matches or beats (≤) in every value (of equal ones, one is kept)."""
    if len(items) <= 1:
        return list(items)
    table = np.array([values(item) for item in items], dtype=np.float64)
    order = np.lexsort(table.T[::-1])  # lexicographic: an item can only be matched or beaten by one before it
    kept_rows = np.empty_like(table)
    kept: list = []
    for index in order:
        row = table[index]
        if kept and (kept_rows[:len(kept)] <= row).all(axis=1).any():
            continue
        kept_rows[len(kept)] = row
        kept.append(items[index])
    return kept


@dataclass
class _StageOption:
    estimate: StageEstimate
    strategies: tuple[int, ...]

    @property
    def values(self) -> tuple[float, float, float, float]:
        e = self.estimate
        return (e.peak_memory_bytes, e.time_no_grad_sync_s, e.time_s - e.time_no_grad_sync_s, e.optimizer_time_s)


@dataclass
class WholePlanOracle:
    """Every whole plan of `job`'s space under `variant` (module docstring), reduced to its (peak, samples/s)
    frontier; `best(budget)` is the brute-force answer for any budget."""

    job: JobSpec
    variant: str = "gbmw"
    literal: bool = False
    """Price every whole Plan with estimate_plan (slow) instead of the stage-wise enumeration."""
    frontier: list[OraclePlan] = field(default_factory=list)
    """By increasing peak and samples/s: each plan is faster than every plan of a smaller peak."""
    stage_estimates: int = 0
    whole_plans: int = 0

    def __post_init__(self) -> None:
        self.space = ORACLE_SPACES[self.variant]
        target = get_target("runtime")
        self.model = model_as_run(self.job.model, target.fused_attention)  # as estimate_plan prices it
        self.cost_settings = CostSettings(self.job.cluster, self.job.precision, self.job.optimizer, target.framework)
        self.comm = CommModel(self.job.cluster)
        self.scatter_gather = target.pipeline_scatter_gather
        found: list[OraclePlan] = []
        for setting in oracle_settings(self.job):
            found += self._literal(setting) if self.literal else self._stagewise(setting)
        found.sort(key=lambda plan: (plan.peak_bytes, -plan.samples_per_s))
        for plan in found:
            if not self.frontier or plan.samples_per_s > self.frontier[-1].samples_per_s:
                self.frontier.append(plan)

    def _allowed(self, setting: Setting) -> tuple[list[Strategy], list[list[int]]] | None:
        group = self.job.cluster.num_devices // setting.pp
        usable = [s for s in oracle_strategies(self.space, group, self.model.is_mixture_of_experts,
                                               self.job.cluster.devices_per_node)
                  if _usable(self.space, s, setting.micro_batch)]
        allowed = [[i for i, s in enumerate(usable) if _runtime_runs(s, layer, self.model.sequence_length)]
                   for layer in self.model.layers]
        return None if not usable or not all(allowed) else (usable, allowed)

    def _literal(self, setting: Setting) -> list[OraclePlan]:
        choices = self._allowed(setting)
        if choices is None:
            return []
        usable, allowed = choices
        found = []
        for partition in compositions(self.model.num_layers, setting.pp):
            for chosen in itertools.product(*allowed):
                strategies = tuple(usable[i] for i in chosen)
                candidate = OraclePlan(0.0, 0.0, setting, partition, strategies)
                estimate = estimate_plan(self.job, candidate.plan(self.job), PLACEHOLDER_BUDGET_BYTES)
                self.whole_plans += 1
                found.append(replace(candidate, samples_per_s=estimate.samples_per_s,
                                     peak_bytes=max(estimate.stage_peak_memory_bytes)))
        return found

    def _stagewise(self, setting: Setting) -> list[OraclePlan]:
        choices = self._allowed(setting)
        if choices is None:
            return []
        usable, allowed = choices
        tables = strategy_tables(self.model, usable, setting.micro_batch, self.cost_settings, self.comm)
        costs = StageCosts(self.model, tables, setting.pp, setting.num_micro_batches, self.space.schedule, self.comm,
                           scatter_gather=self.scatter_gather)
        options: dict[tuple[int, int, int], list[_StageOption]] = {}
        for index, first, count in _stage_positions(self.model.num_layers, setting.pp):
            priced = []
            for chosen in itertools.product(*allowed[first:first + count]):
                priced.append(_StageOption(stage_estimate(costs, index, first, list(chosen)), chosen))
            self.stage_estimates += len(priced)
            options[index, first, count] = _nondominated(priced, lambda option: option.values)
        found = []
        for partition in compositions(self.model.num_layers, setting.pp):
            # partial crossings: ((max peak, max N, Σ N, max S, max U), stage options so far)
            partial: list[tuple[tuple, tuple]] = [((0.0, 0.0, 0.0, 0.0, 0.0), ())]
            first = 0
            for index, count in enumerate(partition):
                grown = []
                for (peak, max_n, sum_n, max_s, max_u), stages in partial:
                    for option in options[index, first, count]:
                        o_peak, o_n, o_s, o_u = option.values
                        grown.append(((max(peak, o_peak), max(max_n, o_n), sum_n + o_n, max(max_s, o_s),
                                       max(max_u, o_u)), stages + (option,)))
                partial = _nondominated(grown, lambda crossing: crossing[0])
                first += count
            for (peak, *_), stages in partial:
                iteration_s = pipeline_time_s([option.estimate for option in stages], setting.num_micro_batches)
                strategies = tuple(usable[i] for option in stages for i in option.strategies)
                found.append(OraclePlan(setting.global_batch / iteration_s, peak, setting, partition, strategies))
        return found

    def best(self, budget_bytes: float) -> OraclePlan | None:
        """The fastest plan whose every stage fits `budget_bytes` (None: nothing fits), checked with estimate_plan."""
        position = bisect_right([plan.peak_bytes for plan in self.frontier], budget_bytes)
        if position == 0:
            return None
        best = self.frontier[position - 1]
        estimate = estimate_plan(self.job, best.plan(self.job), budget_bytes)
        assert estimate.fits and estimate.samples_per_s == best.samples_per_s, (
            f"the oracle's plan re-estimated: fits {estimate.fits}, {estimate.samples_per_s!r} samples/s, "
            f"the oracle said {best.samples_per_s!r}")
        return best

    def peaks(self) -> list[float]:
        return [plan.peak_bytes for plan in self.frontier]


def brute_force_best(job: JobSpec, variant: str = "gbmw", literal: bool = False) -> tuple[float, Plan] | None:
    """(samples/s, Plan) of the fastest plan of the space that fits `job`'s budget, or None if none fits."""
    best = WholePlanOracle(job, variant, literal).best(job.memory_budget_bytes)
    return None if best is None else (best.samples_per_s, best.plan(job))


def exact_peak_budgets(job: JobSpec, variant: str = "gbmw", oracle: WholePlanOracle | None = None) -> list[int]:
    """Budgets on the boundaries where the brute-force answer changes: each frontier plan's exact peak (rounded up
    to whole bytes: a budget is an integer; the tiny jobs' peaks are whole numbers of bytes, so this is the peak
    itself) and one byte less, where that plan no longer fits."""
    oracle = oracle or WholePlanOracle(job, variant)
    budgets = set()
    for peak in oracle.peaks():
        budgets |= {math.ceil(peak), math.ceil(peak) - 1}
    return sorted(budget for budget in budgets if budget > 0)


def with_budget(job: JobSpec, budget_bytes: int) -> JobSpec:
    return job.model_copy(update={"memory_budget_bytes": int(budget_bytes)})


# ---------------------------------------------------------------------------------------------------- random jobs


class Choices:
    """Random choices from a `random.Random` (benchmarks) or a hypothesis `draw` (property tests)."""

    def __init__(self, source):
        self.rng = source if isinstance(source, random.Random) else None
        self.draw = None if self.rng is not None else source

    def choice(self, options):
        options = list(options)
        if self.rng is not None:
            return self.rng.choice(options)
        from hypothesis import strategies as st

        return self.draw(st.sampled_from(options))

    def integer(self, low: int, high: int) -> int:
        return self.choice(range(low, high + 1))

    def flag(self, chance: float = 0.5) -> bool:
        if self.rng is not None:
            return self.rng.random() < chance
        from hypothesis import strategies as st

        return self.draw(st.booleans())


@dataclass(frozen=True)
class TinyJob:
    job: JobSpec
    summary: str
    """One line: model kind, devices, layers, precision, batch."""


UNIT = 64
"""Every byte count of a hand-made layer is a multiple of 64, so every peak is a whole number of bytes."""


def _hand_made_model(choose: Choices, layers: int, precision: str) -> tuple[ModelSpec, str]:
    """Uneven layers: an optional embedding and head (tied or not), blocks of different sizes and head counts
    (some indivisible by 2, 4 or 8), an optional encoder–decoder side input, optional profiled timings."""
    ends = choose.flag(0.7)
    tied = ends and choose.flag()
    decoder_from = choose.integer(2, layers - 1) if choose.flag(0.35) else None  # layers reading a side input
    # Budgets from MiBs (the CPU demo's scale, where a 1 MiB memory cell is coarse) to GiBs, and stages whose
    # optimizer steps about one chunk (2**24 parameters, the step reserve's cap) at the large end.
    parameter_scale = choose.choice([1, 1, 64, 256])
    activation_scale = choose.choice([1, 1, 64])
    profiled = choose.flag(0.2)
    specs = []
    embedding_vocab = UNIT * choose.choice([64, 256, 1024]) * parameter_scale
    for index in range(layers):
        is_embedding, is_head = ends and index == 0, ends and index == layers - 1
        boundary = UNIT * choose.choice([4, 16, 64, 256]) * activation_scale
        if is_embedding or is_head:
            parameters = embedding_vocab + (UNIT * choose.choice([0, 1, 4]) if is_head else 0)
            split = embedding_vocab
            heads = kv_heads = 0
            kind = "embedding" if is_embedding else "head"
        else:
            parameters = UNIT * choose.choice([64, 256, 1024, 4096]) * parameter_scale
            split = parameters // 4 * choose.choice([0, 2, 3, 4])
            heads = choose.choice([0, 1, 2, 3, 4, 6, 8])
            kv_heads = choose.choice([0, heads, heads // 2 if heads % 2 == 0 else heads])
            kind = "cross_decoder" if decoder_from is not None and index >= decoder_from else "encoder"
        intermediate = boundary * choose.choice([0, 1, 2])
        split_activations = boundary * choose.choice([0, 2, 8]) if split else 0
        fields = dict(
            name=f"{kind}.{index}", kind=kind, parameter_count=parameters, tp_split_parameter_count=split,
            forward_flops_per_sample=float(2 * parameters * choose.choice([4, 32, 256])),
            boundary_activation_bytes_per_sample=float(boundary),
            intermediate_activation_bytes_per_sample=float(intermediate),
            intermediate_tp_split_activation_bytes_per_sample=float(split_activations),
            tp_allreduce_bytes_per_sample=float(boundary * choose.choice([1, 2])) if split else 0.0,
            backward_workspace_tp_split_bytes_per_sample=float(boundary * choose.choice([0, 1, 4])) if split else 0.0,
            largest_weight_gradient_tp_split_bytes=float(4 * split // choose.choice([1, 4])) if choose.flag() else 0.0,
            attention_heads=heads, kv_heads=kv_heads,
        )
        if decoder_from is not None and index >= decoder_from:
            fields["side_input_bytes_per_sample"] = float(UNIT * choose.choice([4, 64]) * activation_scale)
        if is_head and tied:
            fields.update(tied_to=specs[0].name, tied_parameter_count=embedding_vocab)
        if profiled:
            forward_s = choose.choice([1e-5, 1e-4, 1e-3])
            fields["timings"] = LayerTimings(forward_time_per_sample_s=forward_s,
                                             backward_time_per_sample_s=forward_s * choose.choice([1.5, 2.0, 3.0]),
                                             forward_overhead_s=choose.choice([0.0, 1e-5]),
                                             backward_overhead_s=choose.choice([0.0, 2e-5]))
        specs.append(LayerSpec(**fields))
    model = make_model(specs, precision)
    if profiled and choose.flag():
        model = model.model_copy(update={"timings": ModelTimings(
            optimizer_step_s_per_parameter=choose.choice([None, 1e-9]), slice_gather_time_s=1e-4,
            slice_gather_bytes=1e5, p2p_time_s=2e-4, p2p_bytes=1e5)})
    ties = "tied" if tied else ("untied" if ends else "no embedding")
    extras = [ties] + (["side input"] if decoder_from is not None else []) + (
        [f"parameters ×{parameter_scale}"] if parameter_scale > 1 else []) + (
        [f"activations ×{activation_scale}"] if activation_scale > 1 else []) + (["profiled"] if profiled else [])
    return model, f"hand-made ({', '.join(extras)})"


def _architecture_model(choose: Choices, layers: int, precision: str) -> tuple[ModelSpec, str]:
    """A tiny GPT (embedding, L − 2 blocks, head; tied or not) or, from 5 layers, a tiny T5 (its decoder embedding
    tied to the encoder's and carrying the encoder output as a side input to every decoder block)."""
    medium = choose.flag(0.4)  # GiB budgets rather than MiBs
    hidden = choose.choice([384, 768] if medium else [48, 96])
    heads = choose.choice([1, 2, 3, 4, 6, 8])
    tied = choose.flag()
    sequence = [128, 512] if medium else [8, 32]
    common = dict(hidden_size=hidden, num_heads=heads, vocab_size=choose.choice([8192, 32000] if medium else [64, 512]),
                  dropout=choose.flag(), attention=choose.choice(["standard", "flash"]), tie_embeddings=tied)
    if layers >= 5 and choose.flag(0.4):
        encoder = choose.integer(1, layers - 4)
        arch = T5Architecture(name="t5-tiny", family="t5", num_encoder_layers=encoder,
                              num_decoder_layers=layers - 3 - encoder, ffn_hidden_size=2 * hidden,
                              encoder_seq_length=choose.choice(sequence), decoder_seq_length=choose.choice(sequence),
                              **common)
        ties = "head tied" if tied else "head untied"
        kind = f"t5 ({encoder}+{layers - 3 - encoder} blocks, h={hidden}, {heads} heads, {ties})"
    else:
        moe = None
        if choose.flag(0.4):  # a mixture of experts: 2, 4 or 8 experts, some blocks dense
            experts = choose.choice([2, 4, 8])
            moe = dict(num_experts=experts, top_k=choose.integer(1, min(2, experts)),
                       expert_ffn_hidden_size=choose.choice([hidden, 2 * hidden]),
                       shared_experts=choose.choice([0, 0, 1]),
                       dense_blocks=[block for block in range(layers - 2) if choose.flag(0.3)],
                       load_imbalance=choose.choice([1.0, 1.25]))
        arch = GPTArchitecture.model_validate(dict(name="gpt-tiny", family="gpt", num_layers=layers - 2,
                                                   seq_length=choose.choice(sequence), moe=moe, **common))
        kind = f"gpt (h={hidden}, {heads} heads, {'tied' if tied else 'untied'}" + (
            f", {moe['num_experts']} experts top-{moe['top_k']}, dense blocks {moe['dense_blocks']}" if moe else "") + ")"
    return build_model(arch, precision), kind


MODEL_DRAWS = 50
"""Models drawn for one tiny job before giving up: a mixture of experts under `gbmw+ulysses` on 8 devices can exceed
the cap at every batch, even 1 (seed 361: 4·10⁸ stage estimates, more memory than the machine's), so the model is
drawn again rather than costed at batch 1 regardless."""


def random_tiny_job(source, variant: str = "gbmw", work_cap: int = 20_000, layer_range: tuple[int, int] = (4, 8),
                    whole_plan_cap: int | None = None) -> TinyJob:
    """A random tiny job (2, 4 or 8 devices, 4–8 layers) whose space under `variant` the oracle enumerates with at
    most `work_cap` stage estimates (and, if given, at most `whole_plan_cap` whole plans): the batch is drawn among
    those that keep it so (a batch of 1 nearly always does: only pure-TP trees split one sample). `source`: a
    random.Random, or a hypothesis draw function."""
    choose = source if isinstance(source, Choices) else Choices(source)
    devices = choose.choice([2, 4, 8])
    per_node = choose.choice([d for d in (1, 2, 4, 8) if d <= devices and d >= devices // 2])
    cluster = make_cluster(nodes=devices // per_node, devices_per_node=per_node,
                           intra_gb_per_s=choose.choice([1.0, 10.0, 100.0]), inter_gb_per_s=choose.choice([0.5, 5.0]),
                           latency_us=choose.choice([0.0, 5.0]), overlap=choose.choice([1.0, 1.3]),
                           memory_gb_per_s=choose.choice([100.0, 1000.0]))
    for _ in range(MODEL_DRAWS):  # a model whose space some batch keeps within the cap (or empty at batch 1)
        layers = choose.integer(*layer_range)
        precision = choose.choice(["fp32", "bf16"])
        model, kind = (_hand_made_model if choose.flag(0.6) else _architecture_model)(choose, layers, precision)
        job = make_job(model, cluster, precision=precision, budget=PLACEHOLDER_BUDGET_BYTES)
        job = job.model_copy(update={"optimizer": choose.choice(["adam", "adam", "sgd"])})
        sweep = choose.flag(0.25)
        batches = [1, 2, 3, 4, 6, 8] if not sweep else [2, 3, 4, 6, 8]
        fitting = []  # (stage estimates, job) of the batches whose space is not empty and within the cap
        for batch in batches:
            candidate = job.model_copy(update={"global_batch": None, "max_global_batch": batch} if sweep
                                       else {"global_batch": batch})
            work, plans = oracle_work(candidate, variant)
            if plans and work <= work_cap and (whole_plan_cap is None or plans <= whole_plan_cap):
                fitting.append((work, candidate))
        if fitting or oracle_work(job.model_copy(update={"global_batch": 1}), variant)[0] <= work_cap:
            break
    else:
        raise ValueError(f"no model of {MODEL_DRAWS} drawn keeps the {variant} space on {devices} devices within "
                         f"{work_cap} stage estimates")
    if fitting:  # the largest space half the time: it mixes the most strategies
        largest = max(fitting, key=lambda pair: pair[0])[1]
        job = largest if choose.flag() else fitting[choose.integer(0, len(fitting) - 1)][1]
    else:
        job = job.model_copy(update={"global_batch": 1})
    batch = f"sweep ≤ {job.max_global_batch}" if job.global_batch is None else f"batch {job.global_batch}"
    topology = f"{cluster.nodes}×{cluster.devices_per_node}"
    return TinyJob(job, f"{kind}, {devices} devices ({topology}), {layers} layers, {precision}, {job.optimizer}, "
                        f"{batch}")


def draw_budget(choose: Choices, oracle: WholePlanOracle) -> tuple[int, str]:
    """A budget from tight to loose: a frontier plan's exact peak or one byte under it, or a random point from
    below the lightest plan to above the fastest."""
    peaks = oracle.peaks()
    if not peaks:
        return 2**30, "any (nothing in the space)"
    kind = choose.choice(["exact peak", "exact peak", "one byte under a peak", "between", "between", "loose", "tight"])
    if kind == "exact peak":
        return math.ceil(choose.choice(peaks)), kind
    if kind == "one byte under a peak":
        return max(1, math.ceil(choose.choice(peaks)) - 1), kind
    if kind == "loose":
        return math.ceil(peaks[-1] * 2), kind
    if kind == "tight":
        return max(1, math.floor(peaks[0] * choose.choice([0.5, 0.9]))), kind
    low, high = peaks[0] * 0.95, peaks[-1] * 1.05
    return max(1, round(low + (high - low) * choose.integer(0, 100) / 100)), kind


def describe_plan(plan: Plan) -> str:
    """pp, partition, b × m and the strategies per layer, on one line."""
    return (f"pp={plan.pp} partition={list(plan.partition)} b={plan.micro_batch}×m={plan.num_micro_batches} "
            f"[{' '.join(s.name for s in plan.strategies)}]")


# ---------------------------------------------------------------------------------------------------- cases


ORACLE_VARIANTS = ("gbmw", "gbmw+ulysses", "bmw", "1f1b+bi-obj", "base")
"""Variants a random case is drawn from (base: Galvatron-Base on GPipe, every micro-batch in flight)."""


@dataclass
class Case:
    """A random tiny job under a variant, with a budget drawn from its brute-force frontier."""

    tiny: TinyJob
    variant: str
    budget_bytes: int
    budget_kind: str
    oracle: WholePlanOracle

    @property
    def job(self) -> JobSpec:
        return with_budget(self.tiny.job, self.budget_bytes)

    @property
    def summary(self) -> str:
        return f"{self.variant}: {self.tiny.summary}, budget {self.budget_bytes} B ({self.budget_kind})"


def random_case(source, work_cap: int = 20_000, variants: tuple[str, ...] = ORACLE_VARIANTS) -> Case:
    """A case from a random.Random or a hypothesis draw: variant, job, oracle, budget."""
    choose = source if isinstance(source, Choices) else Choices(source)
    variant = choose.choice(variants)
    tiny = random_tiny_job(choose, variant, work_cap)
    oracle = WholePlanOracle(tiny.job, variant)
    budget, kind = draw_budget(choose, oracle)
    return Case(tiny, variant, budget, kind, oracle)


AGREE = "agree"
MISSED = "nothing fits, a plan fits"
SLOWER = "slower"
FASTER = "faster than brute force"
OVER_BUDGET = "plan does not fit"
INVENTED = "a plan where nothing fits"
OUTSIDE = "plan outside the space"


@dataclass(frozen=True)
class Verdict:
    """The planner's answer for a case against the brute force's (samples/s agree within a relative 1e-9)."""

    kind: str
    oracle: OraclePlan | None
    plan: Plan | None

    @property
    def ratio(self) -> float | None:
        """The planner's samples/s over the brute force's."""
        if self.oracle is None or self.plan is None:
            return None
        return self.plan.estimate.samples_per_s / self.oracle.samples_per_s


def in_space(job: JobSpec, variant: str, plan: Plan) -> bool:
    """Whether `plan` is one the oracle enumerates for `job` under `variant`."""
    setting = Setting(plan.pp, plan.micro_batch, plan.num_micro_batches)
    if setting not in oracle_settings(job) or plan.partition not in compositions(job.model.num_layers, plan.pp):
        return False
    usable = set(oracle_strategies(ORACLE_SPACES[variant], job.cluster.num_devices // plan.pp,
                                   job.model.is_mixture_of_experts))
    return all(s in usable and _usable(ORACLE_SPACES[variant], s, plan.micro_batch)
               and _runtime_runs(s, layer, job.model.sequence_length)
               for s, layer in zip(plan.strategies, job.model.layers))


def check_planner(case: Case, exact: bool, **planner_options) -> Verdict:
    """Run gbmw's search (the thing under test) on the case and classify its answer against the oracle's."""
    from gbmw.search.planner import NothingFitsError, Planner

    job = case.job
    oracle = case.oracle.best(case.budget_bytes)
    try:
        plan = Planner(job, case.variant, exact=exact, explain_failure=False, **planner_options).run()
    except NothingFitsError:
        return Verdict(AGREE if oracle is None else MISSED, oracle, None)
    if not estimate_plan(job, plan).fits:
        return Verdict(OVER_BUDGET, oracle, plan)
    if not in_space(job, case.variant, plan):
        return Verdict(OUTSIDE, oracle, plan)
    if oracle is None:
        return Verdict(INVENTED, oracle, plan)
    got, want = plan.estimate.samples_per_s, oracle.samples_per_s
    if abs(got - want) <= 1e-9 * want:
        return Verdict(AGREE, oracle, plan)
    return Verdict(SLOWER if got < want else FASTER, oracle, plan)
