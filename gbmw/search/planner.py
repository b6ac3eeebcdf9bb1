"""The outer search: batch sizes × pipeline degrees × micro-batch counts × partitions → the best Plan.

Galvatron-Base (Algorithm 1) tries each power-of-two PP degree, partitions the layers and runs the
stage DP (gbmw.search.stage_dp.stage_search) for every stage; Galvatron-BMW (Algorithm 2) adds the bi-objective partition
adjustment (gbmw.search.balance). The result is the fitting plan with the highest samples/s; its estimate comes from
the stage cost model (gbmw.cost.stage_cost) the search priced it with.

Two modes (docs/search.md):

* EXACT, the default (gbmw.search.exact.whole_plan_search): the estimator's optimum over every partition and
  per-layer strategy, starting from the approximate plan; equal to a brute force over whole plans
  (tests/test_search_exact.py, benchmarks/search_vs_brute_force.py). Uniform spaces (stock targets, baselines) keep
  their partition rules and compare memory in bytes; `exact` adds interleaved m = P to batch sweeps
  (tests/test_search_exact_uniform.py). "Nothing fits" is proved, the smallest budget bisected the same way.
* `exact=False` (`--approximate`): the paper's partitions only, each stage solved on a memory grid for its own
  (m − 1)·N + C (Eq. (9) only for the slowest stage): a plan of the space that fits and is never faster than the
  optimum, but can be slower, or nothing where a plan fits.

Settings are visited best-first with a bound, in both modes:

* A setting is (pp, micro-batch size b, micro-batch count m); the global batch is B = b · m.
  Its throughput cannot exceed B / T_lower, where T_lower is Eq. (9) with every layer at its
  fastest strategy and no transitions, under a relaxed memory limit, and the stages perfectly balanced
  (gbmw.search.bounds.setting_bounds, a tied weight counted once).
* A second, memory-aware bound (gbmw.search.bounds.stage_knapsack_bound: each stage's time under its own budget and
  1F1B stash, over every partition) orders the visits: settings are searched in decreasing order of it, each computed
  only when the first bound says it could come first (gbmw.search.setting_order), until it falls to the best found.
* With 1F1B, once m ≥ P the memory no longer grows with m while B / T grows (Eq. (9):
  d/dm [m·b / ((m-1)·a + c)] > 0 as c = Σ C_i ≥ a = max C_no_sync), so a batch sweep only needs m < P and the
  largest m the batch limit allows (`--exact` with interleaving: also m = P, gbmw.search.units.interleaved_only_counts).
  GPipe keeps all m micro-batches, so its sweep tries every power of two (and the largest m with `exact`).
* A micro-batch size whose lightest possible stage exceeds the budget is skipped; it ends the sweep for that PP
  degree only if that holds with every strategy of the degree (a larger size can allow lighter strategies).
"""

from __future__ import annotations

import time as clock
from dataclasses import dataclass, field, replace

import numpy as np

from gbmw.cost.comm import CommModel
from gbmw.cost.estimate import estimate_plan
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.pipeline_schedules import pipeline_time_s
from gbmw.cost.stage_cost import StageCosts, StrategyTables, stage_estimate
from gbmw.errors import GbmwError
from gbmw.plan import Plan
from gbmw.search.balance import (StageOutcome, bi_objective_adjustment, lightest_memory_balanced_partition,
                                 time_balanced_partition)
from gbmw.search.bounds.setting_bounds import cannot_fit, least_total_no_sync_s, throughput_upper_bound
from gbmw.search.bounds.stage_knapsack_bound import memory_aware_throughput_bound, shared_stage_bound_tables
from gbmw.search.exact.whole_plan_search import WholePlanSearch
from gbmw.search.layer_cost_cache import cached_strategy_tables, cost_key
from gbmw.search.nothing_fits import NothingFitsError, nothing_fits_message
from gbmw.search.setting_order import SettingsBestFirst
from gbmw.search.stage_dp.grid_frontier import INCUMBENT_GRID_CELLS, default_granularity_bytes
from gbmw.search.stage_dp.step_reserve_search import StepReserveSearch
from gbmw.search.units import (Candidate, SearchStats, Setting, counts_to_try, micro_batch_sizes, tp_allowed,
                               used_somewhere, virtual_stage_choices)
from gbmw.space.launch_settings import runs_with_adam_moments
from gbmw.space.spaces import DEFAULT_VARIANT, SearchSpace, search_space
from gbmw.space.stock_partitions import PARTITION_RULES, blocks_per_stage, interleaved_split
from gbmw.space.strategy import Strategy
from gbmw.space.targets import get_target
from gbmw.specs.jobs import JobSpec
from gbmw.specs.models import model_as_run
from gbmw.version import __version__

__all__ = ["NothingFitsError", "Planner", "plan_job"]


@dataclass
class Planner:
    """Finds the best plan for one job; `progress(done, total, best samples/s so far or None)` as it goes."""

    job: JobSpec
    variant: str = DEFAULT_VARIANT
    """A variant of gbmw.space.spaces.VARIANTS or a baseline of BASELINES (for the runtime target)."""
    batch: int | None = None
    """A fixed global batch; None uses the job's `global_batch`, or sweeps up to `max_global_batch`."""
    sweep: bool = False
    """Sweep the global batch up to the job's `max_global_batch` even if the job fixes one."""
    granularity_bytes: int | None = None
    """Memory grid of the stage DP; None: the budget in search.GRID_CELLS cells."""
    exact: bool = True
    """The estimator's optimum over whole plans; False: the approximate search alone (`--approximate`; module docstring)."""
    max_pp: int | None = None
    accumulate: bool = True
    """Run several micro-batches without a pipeline (gradient accumulation). The paper's Table 3 does not: its
    pp = 1 rows give the largest batch that fits as one micro-batch (benchmarks/paper_table3.py)."""
    target: str = "runtime"
    """What will run the plan (gbmw.space.spaces.TARGETS add their constraints)."""
    progress: object = None
    explain_failure: bool = True
    """On failure, bisect for the smallest budget that fits (off inside that bisection)."""
    attention_as_declared: bool = False
    """Cost the attention the model declares even where the target fuses it (gbmw.specs.models.model_as_run): for
    costing another system's runs, e.g. the paper's testbed (benchmarks/paper_table3.py)."""
    batch_multiple: int = 1
    """A sweep tries only global batches that are multiples of it (e.g. the paper's Table 3 grid: 8, 16, 24, ...)."""
    micro_batch_count_rule: object = None
    """(global batch, pp > 1) → the one micro-batch count that a framework sets (a sweep: the batches b·m for which it is
    m); None: the counts the search tries."""
    stats: SearchStats = field(default_factory=SearchStats)
    _stage_bound_cache: dict = field(default_factory=dict, init=False, repr=False)
    """gbmw.search.bounds.stage_knapsack_bound.shared_stage_bound_tables's, for the settings of one run."""

    def __post_init__(self) -> None:
        self.spec: SearchSpace = search_space(self.variant, self.target)
        target, job = get_target(self.spec.target), self.job
        target.check_precision(job.precision, job.gradient_reduce_dtype, job.tp_comm_overlap, job.adam_moments_dtype)
        fused = target.fused_attention and not self.attention_as_declared
        self.job = job = self.job.model_copy(update={"model": model_as_run(self.job.model, fused)})
        self.settings = CostSettings.for_job(job, target.framework)
        self.comm, self.budget = CommModel(job.cluster), float(job.memory_budget_bytes)
        self._cost_key = cost_key(job.model, self.settings)
        if self.sweep and self.batch is not None:
            raise GbmwError("give a fixed --batch or --sweep, not both")
        self.fixed_batch = None if self.sweep else (self.batch if self.batch is not None else self.job.global_batch)

    # ------------------------------------------------------------------ settings

    def _micro_batch_sizes(self) -> list[int]:
        return micro_batch_sizes(self.fixed_batch, self.job.max_global_batch)

    def _micro_batch_counts(self, micro_batch: int, pp: int) -> list[tuple[int, bool]]:  # (count, interleaved only)
        return counts_to_try(micro_batch, pp, self.fixed_batch, self.job.max_global_batch, self.accumulate,
                             self.spec.schedule, self.exact, self.exact and self._interleaves, self.batch_multiple,
                             self.micro_batch_count_rule)

    def _settings(self) -> list[Setting]:
        model, cluster, target = self.job.model, self.job.cluster, get_target(self.spec.target)
        result = []
        self.exclusions: dict[str, None] = {}
        blocks = int(model.is_block.sum())
        for pp in self.spec.pipeline_degrees(cluster, self.max_pp):
            if pp > model.num_layers:
                self.exclusions[f"pp={pp} exceeds the model's {model.num_layers} layers"] = None
                break
            strategies = [s for s in self.spec.strategies(cluster, pp, experts=model.is_mixture_of_experts)
                          if target.runs_recompute_of(s, model) and runs_with_adam_moments(s, self.job.adam_moments_dtype)]
            heads_ok = tp_allowed(model, strategies) & target.layers_allowed(model, strategies)
            if strategies and not heads_ok.any(axis=0).all():
                names = ", ".join(dict.fromkeys(s.layout_name for s in strategies))
                self.exclusions[f"pp={pp}: no candidate ({names}) has a TP degree dividing every layer's heads"] = None
                continue
            strategies, heads_ok = used_somewhere(strategies, heads_ok)
            for micro_batch in self._micro_batch_sizes():
                usable = self.spec.usable(strategies, micro_batch)  # (drops dominated Ulysses strategies)
                if not usable:
                    continue
                tables = self._tables(usable, micro_batch)
                allowed = tp_allowed(model, usable) & target.layers_allowed(model, usable)
                if not allowed.any(axis=0).all():
                    continue
                if cannot_fit(self._costs(tables, pp, 1), allowed, self.budget):
                    self.exclusions[f"memory:{pp}:{micro_batch}"] = None
                    # Every strategy's memory grows with the micro-batch size, but a larger size can allow strategies
                    # this one does not (more data-parallel ways dividing it): the sweep ends only if nothing fits
                    # even with every strategy of the degree.
                    if len(usable) == len(strategies) or cannot_fit(
                            self._costs(self._tables(strategies, micro_batch), pp, 1), heads_ok, self.budget):
                        break
                    continue
                total_no_sync_s = (None if self.spec.schedule == "gpipe" else  # m-free under 1F1B: once for all m
                                   least_total_no_sync_s(self._costs(tables, pp, 1), allowed, self.budget))
                for count, interleaved_only in self._micro_batch_counts(micro_batch, pp):
                    for chunks in virtual_stage_choices(self._interleaves, blocks, pp, count)[interleaved_only:]:
                        bound = self._throughput_bound(tables, allowed, pp, micro_batch, count, chunks, total_no_sync_s)
                        result.append(Setting(pp, micro_batch, count, tables, allowed, bound, chunks))
        return result

    def _tables(self, strategies: list[Strategy], micro_batch: int) -> StrategyTables:
        """The strategies' cost tables at this micro-batch size (cached: gbmw.search.layer_cost_cache)."""
        return cached_strategy_tables(self._cost_key, self.job.model, strategies, micro_batch, self.settings, self.comm)

    @property
    def _interleaves(self) -> bool:
        """The target interleaves 1F1B (Megatron's virtual pipeline stages; gbmw.search.units.virtual_stage_choices)."""
        return get_target(self.spec.target).interleaved_pipeline and self.spec.schedule == "1f1b"

    def _throughput_bound(self, tables: StrategyTables, allowed: np.ndarray, pp: int, micro_batch: int, count: int,
                          virtual_stages: int = 1, total_no_sync_s: float | None = None) -> float:
        return throughput_upper_bound(self._costs(tables, pp, count, virtual_stages), allowed, self.budget, total_no_sync_s)

    def _costs(self, tables: StrategyTables, pp: int, count: int, virtual_stages: int = 1) -> StageCosts:
        target = get_target(self.spec.target)
        return StageCosts(self.job.model, tables, pp, count, self.spec.schedule, self.comm, virtual_stages,
                          scatter_gather=target.pipeline_scatter_gather, blocking_p2p=target.pipeline_blocking_p2p)

    # ------------------------------------------------------------------ one setting

    def _search_setting(self, setting: Setting, best_samples_per_s: float) -> list[Candidate]:
        candidates: list[Candidate] = []
        for group in self.spec.groups(list(setting.tables.strategies), self.job.model):
            allowed = setting.allowed & group
            if not allowed.any(axis=0).all():
                continue
            if self.spec.uniform:  # one strategy per layer: bound it on its own
                bound = self._throughput_bound(setting.tables, allowed, setting.pp, setting.micro_batch,
                                               setting.num_micro_batches, setting.virtual_stages)
                if bound <= max([best_samples_per_s] + [c.samples_per_s for c in candidates]):
                    continue
            candidates += self._search_group(setting, allowed)
        return candidates

    def _search_group(self, setting: Setting, allowed: np.ndarray) -> list[Candidate]:
        model, pp, m, tables, chunks = self.job.model, setting.pp, setting.num_micro_batches, setting.tables, setting.virtual_stages
        costs, fixed, stage_search = self._costs(tables, pp, m, chunks), allowed.sum(axis=0) == 1, None
        if fixed.all():  # every layer has one choice: no DP, just check the memory
            fixed_choice = allowed.argmax(axis=0)
        else:
            # with whole plans to search exactly, this pass only finds the incumbent: a coarser grid is enough
            incumbent_only = self.exact and self.searches_whole_plans
            granularity = self.granularity_bytes or (
                default_granularity_bytes(self.budget, INCUMBENT_GRID_CELLS) if incumbent_only else None)
            stage_search = StepReserveSearch(costs, self.budget, granularity, allowed, self.exact and not incumbent_only)
        candidates: list[Candidate] = []
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
            stages, first = [], 0
            for index, count in enumerate(partition):
                key = (index, first, tuple(chosen[first:first + count]))
                if key not in stage_cache:
                    stage_cache[key] = stage_estimate(costs, index, first, chosen[first:first + count])
                stages.append(stage_cache[key])
                first += count
            strategies = [tables.strategies[i] for i in chosen]
            if stage_search is None and any(stage.peak_memory_bytes > self.budget for stage in stages):
                searched[partition] = StageOutcome(partition, None, None)
                return searched[partition]
            iteration = pipeline_time_s(stages, m, chunks)
            candidates.append(Candidate(setting.global_batch / iteration, iteration, setting, partition, tuple(strategies)))
            searched[partition] = StageOutcome(partition, tuple(stage.time_no_grad_sync_s for stage in stages),
                                               tuple(stage.peak_memory_bytes for stage in stages))
            return searched[partition]

        layers = model.num_layers
        if pp == 1:
            search((layers,))
            return candidates
        time_balanced = tuple(time_balanced_partition(np.where(allowed, tables.time_no_grad_sync_s, np.inf).min(axis=0), pp))
        for method in self.spec.partitioning:
            if chunks > 1 and method not in ("even", "accounted"):  # megatron-core interleaves equal chunks only
                continue
            if method == "time":
                search(time_balanced)
            elif method in ("memory", "bi-objective"):  # p_m alone (the paper's 1F1B+Mem ablation), or Algorithm 2
                memory_balanced = lightest_memory_balanced_partition(tables, allowed, costs.in_flight)
                if method == "memory":
                    search(memory_balanced)
                    continue
                time_outcome = search(time_balanced)
                limit = max(time_outcome.stage_memory_bytes) if time_outcome.fits else None
                bi_objective_adjustment(search, memory_balanced, limit, self.budget)
            else:  # a stock framework's closed-form partitions
                for partition in PARTITION_RULES[method](model, pp):
                    if chunks == 1 or interleaved_split(blocks_per_stage(model, partition), chunks):
                        search(partition)
        return candidates

    # ------------------------------------------------------------------ the search

    def run(self) -> Plan:
        started = clock.perf_counter()
        settings = sorted(self._settings(), key=lambda s: -s.throughput_bound)
        self.stats.settings_total = len(settings)
        best = self._best_of(settings, self._search_setting)
        if self.exact and self.searches_whole_plans:
            # the approximate search's plan is the incumbent: the exact search only looks for faster ones (the
            # stats count the exact pass)
            self.stats = SearchStats(settings_total=len(settings))
            best = self._best_of(settings, self._search_whole_plans, best)
        if self.progress is not None:
            self.progress(len(settings), len(settings), best.samples_per_s if best else None)
        self.stats.search_s = clock.perf_counter() - started
        if best is None:
            raise NothingFitsError(self._nothing_fits_message(bool(settings)) if self.explain_failure else "nothing fits")
        return self._plan_from(best)

    @property
    def searches_whole_plans(self) -> bool:
        """Whether the exact mode searches whole plans (gbmw.search.exact.whole_plan_search): per-layer variants whose
        partitioning is free (time-balanced and bi-objective). Uniform spaces keep their partition rules (one
        strategy per layer and layout: no stage DP, see the module docstring)."""
        return not self.spec.uniform and set(self.spec.partitioning) <= {"time", "bi-objective"}

    def _best_of(self, settings: list[Setting], search, best: Candidate | None = None) -> Candidate | None:
        """The fastest candidate `search(setting, best samples/s)` finds, settings visited by decreasing memory-aware
        bound while it exceeds the best found or `best`, an incumbent (gbmw.search.setting_order)."""
        order = SettingsBestFirst(settings, self._memory_bound, lambda: best.samples_per_s if best else 0.0)
        for setting in order:
            if self.progress is not None:
                self.progress(order.examined, len(settings), best.samples_per_s if best else None)
            self.stats.settings_searched += 1
            for candidate in search(setting, best.samples_per_s if best else 0.0):
                if best is None or candidate.samples_per_s > best.samples_per_s:
                    best = candidate
        return best

    def _memory_bound(self, setting: Setting) -> float:
        """The setting's memory-aware throughput bound (gbmw.search.bounds.stage_knapsack_bound), computed once."""
        if setting.memory_bound is None:
            costs = self._costs(setting.tables, setting.pp, setting.num_micro_batches, setting.virtual_stages)
            setting.memory_bound = min(setting.throughput_bound, memory_aware_throughput_bound(  # both bound it
                costs, setting.allowed, self.budget, None if (
                    setting.virtual_stages != 1) else self._stage_bounds(costs, setting.allowed)))
        return setting.memory_bound

    def _stage_bounds(self, costs: StageCosts, allowed: np.ndarray) -> list[np.ndarray]:
        return shared_stage_bound_tables(self._stage_bound_cache, costs, allowed, self.budget)

    def _search_whole_plans(self, setting: Setting, best_samples_per_s: float) -> list[Candidate]:
        """The exact search of one setting (gbmw.search.exact.whole_plan_search) for plans faster than `best_samples_per_s`."""
        model, tables, m = self.job.model, setting.tables, setting.num_micro_batches
        costs = self._costs(tables, setting.pp, m)
        limit_s = setting.global_batch / best_samples_per_s if best_samples_per_s > 0 else np.inf
        found = WholePlanSearch(costs, self.budget, setting.allowed, self._stage_bounds(costs, setting.allowed)).solve(limit_s)
        if found is None:
            return []
        _, partition, chosen = found
        self.stats.partitions_searched += 1
        stages, first = [], 0
        for index, count in enumerate(partition):
            stages.append(stage_estimate(costs, index, first, chosen[first:first + count]))
            first += count
        peaks = [stage.peak_memory_bytes for stage in stages]
        if max(peaks) > self.budget:
            raise GbmwError(f"internal: the exact search's plan needs {max(peaks):.0f} B on a stage, over the "
                            f"{self.budget:.0f} B budget (stage peaks {peaks})")
        iteration = pipeline_time_s(stages, m)
        return [Candidate(setting.global_batch / iteration, iteration, setting, partition,
                           tuple(tables.strategies[i] for i in chosen))]

    def _plan_from(self, best: Candidate) -> Plan:
        setting = best.setting
        plan = Plan(
            model=self.job.model.name, cluster=self.job.cluster.name, num_devices=self.job.cluster.num_devices,
            **self.job.launch_settings(), global_batch=setting.global_batch,
            micro_batch=setting.micro_batch, num_micro_batches=setting.num_micro_batches, pp=setting.pp,
            partition=best.partition, strategies=best.strategies, target=self.spec.target,
            schedule=self.spec.schedule, virtual_stages=setting.virtual_stages,
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
        return replace(plan, estimate=estimate_plan(self.job, plan,
                                                    attention_as_declared=self.attention_as_declared))

    def _nothing_fits_message(self, settings_found: bool) -> str:
        job = self.job
        where = f"{job.model.name} on {job.cluster.num_devices} × {job.cluster.device.name}"
        batch = f"global batch {self.fixed_batch}" if self.fixed_batch is not None else "any batch size"
        return nothing_fits_message(where, batch, self.spec.label, self.budget, self.exclusions, settings_found,
                                    self._peak_with, self.exact)

    def _peak_with(self, budget_bytes: float) -> float | None:
        """The peak bytes of the plan this search finds with `budget_bytes` (whole bytes, rounded down), or None."""
        job = self.job.model_copy(update={"memory_budget_bytes": int(budget_bytes)})
        planner = replace(self, job=job, explain_failure=False, progress=None, stats=SearchStats())
        try:
            return max(planner.run().estimate.stage_peak_memory_bytes)
        except NothingFitsError:
            return None


def plan_job(job: JobSpec, variant: str = DEFAULT_VARIANT, batch: int | None = None, **options) -> Plan:
    """The best plan for `job` (see Planner)."""
    return Planner(job, variant, batch, **options).run()
