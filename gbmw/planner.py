"""The outer search: batch sizes × pipeline degrees × micro-batch counts × partitions → the best Plan.

Galvatron-Base (Alg. 1) tries each power-of-two PP degree, partitions the layers and runs the
stage DP (gbmw.search) for every stage; Galvatron-BMW (Alg. 3) adds the bi-objective partition
adjustment (gbmw.balance). The result is the fitting plan with the highest samples/s.

Settings are visited best-first with a bound, so the search is exact but skips most of the space:

* A setting is (pp, micro-batch size b, micro-batch count m); the global batch is B = b · m.
  Its throughput cannot exceed B / T_lower, where T_lower is Eq. (9) with every layer at its
  fastest strategy and no transitions or memory limit, and the stages perfectly balanced. Settings
  are searched in decreasing order of that bound, and the search stops when the bound falls to
  the best plan found.
* With 1F1B, once m ≥ P the memory no longer grows with m while B / T grows (Eq. 9:
  d/dm [m·b / ((m-1)·a + c)] > 0 as c = Σ C_i ≥ a = max C_no_sync), so a batch sweep only needs
  m < P and the largest m the batch limit allows. GPipe keeps all m micro-batches, so its sweep
  tries every power of two.
* A micro-batch size whose lightest possible stage exceeds the budget ends the sweep for that PP
  degree: memory only grows with b.
"""

from __future__ import annotations

import time as clock
from dataclasses import dataclass, field, replace

import numpy as np

from gbmw.version import __version__
from gbmw.balance import StageOutcome, bi_objective_adjustment, memory_balanced_partition, time_balanced_partition
from gbmw.comm import CommModel
from gbmw.cost import (
    CostSettings, LayerCosts, StrategyTables, estimate_plan, in_flight_micro_batches, pipeline_time_s,
    stage_estimate, strategy_tables,
)
from gbmw.errors import GbmwError
from gbmw.plan import Plan
from gbmw.search import StageSearch, default_granularity_bytes
from gbmw.stock_partitions import PARTITION_RULES
from gbmw.jobs import JobSpec
from gbmw.spaces import DEFAULT_VARIANT, SearchSpace, search_space
from gbmw.space import Strategy

GIB = 2**30


class NothingFitsError(GbmwError):
    """No plan of the searched space fits the memory budget (the message says what would)."""


@dataclass
class SearchStats:
    settings_total: int = 0
    settings_searched: int = 0
    partitions_searched: int = 0
    search_s: float = 0.0


@dataclass
class _Setting:
    pp: int
    micro_batch: int
    num_micro_batches: int
    tables: StrategyTables
    allowed: np.ndarray
    throughput_bound: float

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.num_micro_batches


@dataclass
class _Candidate:
    samples_per_s: float
    iteration_s: float
    setting: _Setting
    partition: tuple[int, ...]
    strategies: tuple[Strategy, ...]


@dataclass
class Planner:
    """Finds the best plan for one job; `progress(done, total)` is called as settings are searched."""

    job: JobSpec
    variant: str = DEFAULT_VARIANT
    """A variant of gbmw.spaces.VARIANTS or a baseline of BASELINES (for the runtime target)."""
    batch: int | None = None
    """A fixed global batch; None uses the job's `global_batch`, or sweeps up to `max_global_batch`."""
    sweep: bool = False
    """Sweep the global batch up to the job's `max_global_batch` even if the job fixes one."""
    granularity_bytes: int | None = None
    """Memory grid of the stage DP; None: the budget in search.GRID_CELLS cells."""
    exact: bool = False
    """Use the exact Pareto-frontier DP (gbmw.pareto) instead of the grid."""
    max_pp: int | None = None
    target: str = "runtime"
    """What will run the plan (gbmw.spaces.TARGETS add their constraints)."""
    progress: object = None
    explain_failure: bool = True
    """On failure, bisect for the smallest budget that fits (off inside that bisection)."""
    stats: SearchStats = field(default_factory=SearchStats)

    def __post_init__(self) -> None:
        self.spec: SearchSpace = search_space(self.variant, self.target)
        self.settings = CostSettings(self.job.cluster, self.job.precision, self.job.optimizer)
        self.comm = CommModel(self.job.cluster)
        self.budget = float(self.job.memory_budget_bytes)
        if self.sweep and self.batch is not None:
            raise GbmwError("give a fixed --batch or --sweep, not both")
        self.fixed_batch = None if self.sweep else (self.batch if self.batch is not None else self.job.global_batch)

    # ------------------------------------------------------------------ settings

    def _micro_batch_sizes(self) -> list[int]:
        if self.fixed_batch is not None:
            return [b for b in range(1, self.fixed_batch + 1) if self.fixed_batch % b == 0]
        limit = self.job.max_global_batch
        sizes = sorted({2**e for e in range(limit.bit_length())} | {3 * 2**e for e in range(limit.bit_length())})
        return [b for b in sizes if b <= limit]

    def _micro_batch_counts(self, micro_batch: int, pp: int) -> list[int]:
        if self.fixed_batch is not None:
            return [self.fixed_batch // micro_batch]
        largest = self.job.max_global_batch // micro_batch
        if largest < 1:
            return []
        counts = {2**e for e in range(largest.bit_length()) if 2**e <= largest}
        if self.spec.schedule == "1f1b":
            counts = {m for m in counts if m < pp} | {largest}
        return sorted(counts)

    def _settings(self) -> list[_Setting]:
        model, cluster = self.job.model, self.job.cluster
        result = []
        self.exclusions: dict[str, None] = {}
        for pp in self.spec.pipeline_degrees(cluster, self.max_pp):
            if pp > model.num_layers:
                self.exclusions[f"pp={pp} exceeds the model's {model.num_layers} layers"] = None
                break
            strategies = self.spec.strategies(cluster, pp)
            heads_ok = _tp_allowed(model, strategies)
            if strategies and not heads_ok.any(axis=0).all():
                names = ", ".join(dict.fromkeys(s.name.removesuffix("+ckpt") for s in strategies))
                self.exclusions[f"pp={pp}: no candidate ({names}) has a TP degree dividing every layer's heads"] = None
                continue
            for micro_batch in self._micro_batch_sizes():
                usable = [s for s in strategies if micro_batch % s.data_parallel == 0]
                if not usable:
                    continue
                tables = strategy_tables(model, usable, micro_batch, self.settings, self.comm)
                allowed = _tp_allowed(model, usable)
                if not allowed.any(axis=0).all():
                    continue
                if self._cannot_fit(tables, allowed, pp):
                    self.exclusions[f"memory:{pp}:{micro_batch}"] = None
                    break  # memory only grows with the micro-batch size
                for count in self._micro_batch_counts(micro_batch, pp):
                    bound = self._throughput_bound(tables, allowed, pp, micro_batch, count)
                    result.append(_Setting(pp, micro_batch, count, tables, allowed, bound))
        return result

    def _cannot_fit(self, tables: StrategyTables, allowed: np.ndarray, pp: int) -> bool:
        """True if no partition can fit: some layer alone, or the stages' average, exceeds the budget."""
        masked = np.where(allowed, 1.0, np.inf)
        alone = (tables.model_state_bytes + tables.forward_memory_bytes + tables.backward_memory_bytes) * masked
        lightest = ((tables.model_state_bytes + tables.forward_memory_bytes) * masked).min(axis=0)
        return bool(alone.min(axis=0).max() > self.budget or lightest.sum() > pp * self.budget)

    def _throughput_bound(self, tables, allowed, pp, micro_batch, count) -> float:
        """B / (a lower bound of Eq. 9 over every plan of this setting that fits).

        Eq. 9 ≥ (m - 1) · Σ_i C_no_sync(M_i) / P + Σ_l min c(l): the stages' no-sync times sum to at
        least the least total no-sync time of plans whose memory fits all stages together —
        Σ_l (O_ms + O_f) ≤ P · E, since every stage holds at least one micro-batch — which the
        Lagrangian dual of that knapsack bounds from below.
        """
        no_sync = np.where(allowed, tables.time_no_grad_sync_s, np.inf)
        sync = np.where(allowed, tables.time_s, np.inf).min(axis=0)
        k = count if self.spec.schedule == "gpipe" else 1
        memory = tables.model_state_bytes + k * tables.forward_memory_bytes
        total_no_sync = knapsack_lower_bound(no_sync, memory, pp * self.budget)
        slowest_stage = max(total_no_sync / pp, no_sync.min(axis=0).max())
        lower = (count - 1) * slowest_stage + sync.sum()
        return micro_batch * count / lower if np.isfinite(lower) else 0.0

    # ------------------------------------------------------------------ one setting

    def _search_setting(self, setting: _Setting, best_samples_per_s: float) -> list[_Candidate]:
        candidates: list[_Candidate] = []
        for group in self.spec.groups(list(setting.tables.strategies), self.job.model):
            allowed = setting.allowed & group
            if not allowed.any(axis=0).all():
                continue
            if self.spec.uniform:  # one strategy per layer: bound it on its own
                bound = self._throughput_bound(setting.tables, allowed, setting.pp, setting.micro_batch,
                                               setting.num_micro_batches)
                if bound <= max([best_samples_per_s] + [c.samples_per_s for c in candidates]):
                    continue
            candidates += self._search_group(setting, allowed)
        return candidates

    def _search_group(self, setting: _Setting, allowed: np.ndarray) -> list[_Candidate]:
        model, pp, m = self.job.model, setting.pp, setting.num_micro_batches
        tables = setting.tables
        fixed = allowed.sum(axis=0) == 1
        if fixed.all():  # every layer has one choice: no DP, just check the memory
            stage_search, fixed_choice = None, allowed.argmax(axis=0)
        else:
            stage_search = StageSearch(
                model, tables, m, pp, self.budget, self.comm, self.spec.schedule, self.granularity_bytes, allowed,
                self.exact,
            )
        in_flight = [in_flight_micro_batches(self.spec.schedule, i, pp, m) for i in range(pp)]
        costs = {
            strategy: LayerCosts(tables.time_s[i], tables.time_no_grad_sync_s[i], tables.forward_memory_bytes[i],
                                 tables.backward_memory_bytes[i], tables.model_state_bytes[i],
                                 setting.micro_batch / strategy.data_parallel, tables.optimizer_parameters[i])
            for i, strategy in enumerate(tables.strategies)
        }
        candidates: list[_Candidate] = []
        searched: dict[tuple[int, ...], StageOutcome] = {}
        stage_cache: dict[tuple, object] = {}

        def search(partition: tuple[int, ...]) -> StageOutcome:
            if partition in searched:
                return searched[partition]
            self.stats.partitions_searched += 1
            chosen: list[int] = []
            first = 0
            for index, count in enumerate(partition):
                if stage_search is None:
                    chosen += [int(i) for i in fixed_choice[first:first + count]]
                else:
                    solution = stage_search.solve(index, first, first + count)
                    if solution is None:
                        searched[partition] = StageOutcome(partition, None, None)
                        return searched[partition]
                    chosen += solution.strategy_indices
                first += count
            strategies = [tables.strategies[i] for i in chosen]
            stages, first = [], 0
            for index, count in enumerate(partition):
                key = (index, first, tuple(chosen[first:first + count]))
                if key not in stage_cache:
                    stage_cache[key] = stage_estimate(
                        model, strategies[first:first + count], first, index, pp, setting.micro_batch, m,
                        self.settings, self.comm, costs, self.spec.schedule,
                    )
                stages.append(stage_cache[key])
                first += count
            if stage_search is None and any(stage.peak_memory_bytes > self.budget for stage in stages):
                searched[partition] = StageOutcome(partition, None, None)
                return searched[partition]
            iteration = pipeline_time_s(stages, m)
            candidates.append(_Candidate(setting.global_batch / iteration, iteration, setting, partition, tuple(strategies)))
            searched[partition] = StageOutcome(
                partition,
                tuple(stage.time_no_grad_sync_s for stage in stages),
                tuple(stage.peak_memory_bytes for stage in stages),
            )
            return searched[partition]

        layers = model.num_layers
        masked = np.where(allowed, 1.0, np.inf)
        if pp == 1:
            search((layers,))
            return candidates
        time_balanced = tuple(time_balanced_partition(np.where(allowed, tables.time_no_grad_sync_s, np.inf).min(axis=0), pp))
        for method in self.spec.partitioning:
            if method == "time":
                search(time_balanced)
            elif method == "bi-objective":
                time_outcome = search(time_balanced)
                states = (tables.model_state_bytes * masked).min(axis=0)
                activations = (tables.forward_memory_bytes * masked).min(axis=0)
                memory_balanced = tuple(memory_balanced_partition(states, activations, in_flight))
                limit = max(time_outcome.stage_memory_bytes) if time_outcome.fits else None
                bi_objective_adjustment(search, memory_balanced, limit, self.budget)
            else:  # a stock framework's closed-form partitions
                for partition in PARTITION_RULES[method](model, pp):
                    search(partition)
        return candidates

    # ------------------------------------------------------------------ the search

    def run(self) -> Plan:
        started = clock.perf_counter()
        settings = sorted(self._settings(), key=lambda s: -s.throughput_bound)
        self.stats.settings_total = len(settings)
        best: _Candidate | None = None
        for done, setting in enumerate(settings):
            if self.progress is not None:
                self.progress(done, len(settings))
            if best is not None and setting.throughput_bound <= best.samples_per_s:
                break
            self.stats.settings_searched += 1
            for candidate in self._search_setting(setting, best.samples_per_s if best else 0.0):
                if best is None or candidate.samples_per_s > best.samples_per_s:
                    best = candidate
        if self.progress is not None:
            self.progress(len(settings), len(settings))
        self.stats.search_s = clock.perf_counter() - started
        if best is None:
            raise NothingFitsError(self._nothing_fits_message(settings) if self.explain_failure else "nothing fits")
        return self._plan_from(best)

    def _plan_from(self, best: _Candidate) -> Plan:
        setting = best.setting
        plan = Plan(
            model=self.job.model.name,
            cluster=self.job.cluster.name,
            num_devices=self.job.cluster.num_devices,
            precision=self.job.precision,
            global_batch=setting.global_batch,
            micro_batch=setting.micro_batch,
            num_micro_batches=setting.num_micro_batches,
            pp=setting.pp,
            partition=best.partition,
            strategies=best.strategies,
            target=self.spec.target,
            schedule=self.spec.schedule,
            provenance={
                "gbmw_version": __version__,
                "variant": self.variant if self.spec.target == "runtime" else None,
                "search_space": self.spec.label,
                "memory_budget_bytes": int(self.budget),
                "granularity_bytes": int(self.granularity_bytes or default_granularity_bytes(self.budget)),
                "exact": self.exact,
                "batch": "fixed" if self.fixed_batch is not None else f"sweep up to {self.job.max_global_batch}",
                "settings_searched": self.stats.settings_searched,
                "settings_total": self.stats.settings_total,
                "partitions_searched": self.stats.partitions_searched,
                "search_s": round(self.stats.search_s, 4),
            },
        )
        return replace(plan, estimate=estimate_plan(self.job, plan))

    def _nothing_fits_message(self, settings: list[_Setting]) -> str:
        job = self.job
        where = f"{job.model.name} on {job.cluster.num_devices} × {job.cluster.device.name}"
        batch = f"global batch {self.fixed_batch}" if self.fixed_batch is not None else "any batch size"
        if not settings:
            memory = [key.split(":")[1:] for key in self.exclusions if key.startswith("memory:")]
            reasons = [key for key in self.exclusions if not key.startswith("memory:")]
            if memory:
                degrees = ", ".join(pp for pp, _ in memory)
                smallest = min(int(micro) for _, micro in memory)
                reasons.append(
                    f"even a micro-batch of {smallest} needs more than {self.budget / GIB:.2f} GiB per device "
                    f"at every pipeline degree tried ({degrees})"
                )
            reasons = "; ".join(reasons) or "no micro-batch size divides the batch evenly for any strategy"
            if not memory:
                return f"nothing fits: {where} ({self.spec.label}): {reasons}"
            return (
                f"nothing fits: {where} with {batch} ({self.spec.label}): {reasons}; {self._smallest_budget_hint()}"
            )
        return (
            f"nothing fits: no plan for {where} with {batch} fits {self.budget / GIB:.2f} GiB per device "
            f"({self.spec.label}); {self._smallest_budget_hint()}"
        )

    def _smallest_budget_hint(self) -> str:
        """Bisect the budget (to 1%) for the smallest one where the search finds a plan."""
        low, high = self.budget, max(self.budget * 2, GIB)
        for _ in range(12):
            if self._fits_with(high):
                break
            low, high = high, high * 2
        else:
            return "even 4096× the budget does not fit; check the batch settings and the model"
        while high - low > 0.01 * high:
            middle = (low + high) / 2
            if self._fits_with(middle):
                high = middle
            else:
                low = middle
        return f"the smallest per-device memory that fits is about {high / GIB:.2f} GiB (--memory {np.ceil(high / GIB * 100) / 100:.2f}GiB)"

    def _fits_with(self, budget_bytes: float) -> bool:
        job = self.job.model_copy(update={"memory_budget_bytes": int(budget_bytes)})
        planner = Planner(job, variant=self.variant, batch=self.batch, sweep=self.sweep, max_pp=self.max_pp,
                          target=self.target, explain_failure=False)
        try:
            planner.run()
            return True
        except NothingFitsError:
            return False


def knapsack_lower_bound(time: np.ndarray, memory: np.ndarray, capacity: float, iterations: int = 40) -> float:
    """A lower bound of min Σ_l time[s_l, l] subject to Σ_l memory[s_l, l] ≤ capacity (one choice s_l
    per layer; inf time = not allowed): the Lagrangian dual max_λ Σ_l min_s (time + λ·memory) − λ·capacity,
    maximised by bisection on its subgradient. inf when even the lightest choices exceed the capacity."""
    allowed = np.isfinite(time)
    if np.where(allowed, memory, np.inf).min(axis=0).sum() > capacity:
        return np.inf

    def dual(weight: float) -> tuple[float, float]:
        combined = np.where(allowed, time + weight * memory, np.inf)
        pick = combined.argmin(axis=0)
        columns = np.arange(time.shape[1])
        used = memory[pick, columns].sum()
        return combined[pick, columns].sum() - weight * capacity, used - capacity

    value, excess = dual(0.0)
    if excess <= 0:
        return value
    low, high = 0.0, 1e-12
    while dual(high)[1] > 0:
        low, high = high, high * 4
    best = max(value, dual(high)[0])
    for _ in range(iterations):
        middle = (low + high) / 2
        value, excess = dual(middle)
        best = max(best, value)
        if excess > 0:
            low = middle
        else:
            high = middle
    return best


def _tp_allowed(model, strategies: list[Strategy]) -> np.ndarray:
    """[strategy, layer]: TP degree divides the layer's attention (and key/value) heads."""
    tp = np.array([strategy.tp for strategy in strategies])[:, None]
    allowed = np.ones((len(strategies), model.num_layers), bool)
    for heads in (np.array([layer.attention_heads for layer in model.layers]),
                  np.array([layer.kv_heads for layer in model.layers])):
        allowed &= (heads[None, :] == 0) | (heads[None, :] % tp == 0)
    return allowed


def plan_job(job: JobSpec, variant: str = DEFAULT_VARIANT, batch: int | None = None, **options) -> Plan:
    """The best plan for `job` (see Planner)."""
    return Planner(job, variant, batch, **options).run()
