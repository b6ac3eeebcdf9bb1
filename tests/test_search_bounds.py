"""The bounds and filters the planner skips settings by are valid (issue 13): no setting is skipped that holds a
plan faster than the plan found, tied weights included. Each is checked against the brute force over whole plans
of one setting (tests/whole_plan_oracle.py)."""

import random

import numpy as np
import pytest
from conftest import make_cluster, make_job, make_layer, make_model
from hypothesis import given, settings
from hypothesis import strategies as st
from whole_plan_oracle import Choices, Setting, WholePlanOracle, oracle_settings, random_tiny_job, with_budget

from gbmw.cost.stage_cost import stage_estimate
from gbmw.search.bounds.setting_bounds import _numpy_sum, cannot_fit, knapsack_lower_bound, least_state_bytes
from gbmw.search.exact.whole_plan_frontier import MemoryGrid
from gbmw.search.planner import Planner
from gbmw.search.stage_dp.step_reserve_search import StepReserveSearch

pytestmark = pytest.mark.unit


def tied_job(budget_bytes: int, devices: int = 2):
    """An embedding and a head sharing one large weight, and a small block: a stage holding both ends holds the
    weight once."""
    vocabulary = 2**16
    layers = [make_layer("embedding", kind="embedding", parameter_count=vocabulary, tp_split_parameter_count=vocabulary,
                         attention_heads=0),
              make_layer("block", parameter_count=1024, tp_split_parameter_count=512, attention_heads=2),
              make_layer("head", kind="head", parameter_count=vocabulary, tp_split_parameter_count=vocabulary,
                         tied_to="embedding", tied_parameter_count=vocabulary, attention_heads=0)]
    job = make_job(make_model(layers), make_cluster(nodes=1, devices_per_node=devices), budget=budget_bytes)
    return job.model_copy(update={"global_batch": 2})


def setting_best(oracle: WholePlanOracle, setting: Setting, budget_bytes: float) -> float:
    """The brute force's best samples/s within one setting (0 if nothing fits)."""
    plans = [plan for plan in oracle._stagewise(setting) if plan.peak_bytes <= budget_bytes]
    return max((plan.samples_per_s for plan in plans), default=0.0)


def test_least_state_bytes_counts_a_tied_weight_once():
    planner = Planner(tied_job(2**30), "gbmw", max_pp=1)
    setting = planner._settings()[0]
    costs = planner._costs(setting.tables, setting.pp, setting.num_micro_batches)
    states = least_state_bytes(costs)
    tables = setting.tables
    head = 2
    shared = tables.shares_tied_weights
    assert (states[shared, head] < tables.model_state_bytes[shared, head]).all()
    assert (states[:, :head] == tables.model_state_bytes[:, :head]).all()
    # one stage with all three layers: its states are the sum of least_state_bytes under one shared strategy
    strategy = int(np.nonzero(shared)[0][0])
    estimate = stage_estimate(costs, 0, 0, [strategy] * 3)
    assert estimate.model_state_bytes == pytest.approx(states[strategy].sum(), rel=1e-12)


def test_cannot_fit_keeps_a_setting_whose_fitting_plan_holds_the_tied_weight_once():
    """The budget fits the plan holding the tied weight once, not a layer counting it twice: cannot_fit must not
    exclude the setting (it did, counting the head's copy of the weight on its own)."""
    probe = tied_job(2**40)
    oracle = WholePlanOracle(probe, "gbmw")
    lightest = oracle.frontier[0]
    budget = int(np.ceil(lightest.peak_bytes))
    planner = Planner(with_budget(probe, budget), "gbmw", explain_failure=False)
    for setting in planner._settings():
        costs = planner._costs(setting.tables, setting.pp, 1)
        if setting_best(oracle, Setting(setting.pp, setting.micro_batch, setting.num_micro_batches), budget) > 0:
            assert not cannot_fit(costs, setting.allowed, budget)
    plan = Planner(with_budget(probe, budget), "gbmw", exact=True, explain_failure=False).run()
    assert plan.estimate.samples_per_s == oracle.best(budget).samples_per_s


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_throughput_bound_is_above_every_fitting_plan_of_its_setting(data):
    """For random tiny jobs (tied and untied) and budgets, each setting's bound is at least the brute force's best
    samples/s in that setting, and a setting cannot_fit excludes holds no fitting plan."""
    choose = Choices(data.draw)
    tiny = random_tiny_job(choose, "gbmw", work_cap=4000)
    oracle = WholePlanOracle(tiny.job, "gbmw")
    peaks = oracle.peaks()
    budget = int(np.ceil(choose.choice(peaks))) if peaks else 2**20
    planner = Planner(with_budget(tiny.job, budget), "gbmw", explain_failure=False)
    searched = {(s.pp, s.micro_batch, s.num_micro_batches): s for s in planner._settings()}
    for pp, micro_batch, count in {(s.pp, s.micro_batch, s.num_micro_batches) for s in
                                   [Setting(*key) for key in searched]}:
        best = setting_best(oracle, Setting(pp, micro_batch, count), budget)
        assert searched[pp, micro_batch, count].throughput_bound >= best, tiny.summary
    for key in planner.exclusions:
        if key.startswith("memory:"):
            _, pp, micro_batch = key.split(":")
            for plan in oracle.frontier:
                assert not (plan.setting.pp == int(pp) and plan.setting.micro_batch == int(micro_batch)
                            and plan.peak_bytes <= budget), tiny.summary


def test_a_micro_batch_where_nothing_fits_does_not_end_the_sweep():
    """With one sample per micro-batch only TP (which cannot split this layer's states) is usable and nothing fits;
    two samples allow sharded data parallelism, which fits. The sweep used to stop at the first size that did not
    fit ("memory only grows with the micro-batch size"), and found nothing."""
    layers = [make_layer("block", parameter_count=2**20, tp_split_parameter_count=0, attention_heads=2)]
    cluster = make_cluster(nodes=1, devices_per_node=2)
    job = make_job(make_model(layers), cluster).model_copy(update={"global_batch": None, "max_global_batch": 2})
    oracle = WholePlanOracle(job, "gbmw")
    light = [plan for plan in oracle.frontier if plan.setting.micro_batch == 2]
    # every plan of one sample per micro-batch, not only the frontier's (a slower b = 1 plan is off the frontier)
    heavy = [plan for setting in oracle_settings(job) if setting.micro_batch == 1 for plan in oracle._stagewise(setting)]
    budget = int(np.ceil(min(plan.peak_bytes for plan in light)))
    assert heavy and min(plan.peak_bytes for plan in heavy) > budget  # b = 1 cannot fit
    for exact in (False, True):
        plan = Planner(with_budget(job, budget), "gbmw", exact=exact, explain_failure=False).run()
        assert plan.micro_batch == 2 and plan.estimate.fits


def test_a_stage_straddling_an_optimizer_chunk_takes_the_faster_safe_reserve():
    """Two layers of 10M parameters: unsharded, the stage steps 20M (more than the 2^24 chunk: the reserve is the
    chunk's); ZeRO-sharded over two, 10M (the reserve is per parameter). Both regimes are solved and the faster
    answer kept, and it fits by stage_estimate."""
    layers = [make_layer(f"block{i}", parameter_count=10**7, tp_split_parameter_count=0, attention_heads=2)
              for i in range(2)]
    job = make_job(make_model(layers), make_cluster(nodes=1, devices_per_node=2), budget=2**40)
    planner = Planner(job.model_copy(update={"global_batch": 2}), "gbmw", max_pp=1)
    setting = next(s for s in planner._settings() if s.micro_batch == 2)
    costs = planner._costs(setting.tables, 1, setting.num_micro_batches)
    for budget in (2**40, 380 * 2**20, 300 * 2**20):
        search = StepReserveSearch(costs, budget, None, setting.allowed, False)
        assert search.regimes(0, 2) == ("per-layer", "constant")
        answers = [search._search(regime).solve(0, 0, 2) for regime in ("per-layer", "constant")]
        answers = [answer for answer in answers if answer is not None]
        solution = search.solve(0, 0, 2)
        assert (solution is None) == (not answers)
        if solution is not None:
            assert solution.objective_s == min(answer.objective_s for answer in answers)
            assert stage_estimate(costs, 0, 0, list(solution.strategy_indices)).peak_memory_bytes <= budget


def test_memory_grid_keeps_terms_on_it_and_rounds_others_up():
    grid = MemoryGrid(2.0**40)
    assert grid.step_bytes == 2.0**-12
    values = np.array([0.0, 3.0, 2.0**39 + 0.5, 1.0 + 2.0**-12])
    assert (grid.up(values) == values).all() and not grid.rounded
    third = grid.up([1 / 3])[0]
    assert grid.rounded and 1 / 3 < third <= 1 / 3 + 2.0**-12
    # sums of terms on the grid are exact in float64 in any order
    rng = random.Random(0)
    terms = [rng.randrange(2**40) * 2.0**-12 for _ in range(8)]
    assert sum(terms) == sum(reversed(terms)) == sum(sorted(terms))


def test_the_sweeps_shared_bound_parts_equal_what_each_setting_computes_alone():
    """Under 1F1B the throughput bound's knapsack part and the stage-bound tables depend on the micro-batch count only
    through the stages' in-flight counts, so the planner computes them once per micro-batch size and P (and per
    in-flight counts) — the bounds must be bit for bit those each setting computes alone (a shared part keyed too
    loosely, e.g. by m ≥ 1 for the stage tables, would differ at m < P)."""
    from gbmw.search.bounds.setting_bounds import throughput_upper_bound
    from gbmw.search.bounds.stage_knapsack_bound import memory_aware_throughput_bound

    # activations that make the stash, so the in-flight counts change the stage bounds (with the tables shared by m
    # alone, about a sixth of this sweep's memory-aware bounds differ)
    job = make_job(make_model([make_layer(f"b{i}", parameter_count=1000 * (1 + i % 3),
                                          intermediate_activation_bytes_per_sample=20_000.0) for i in range(8)]),
                   make_cluster(), budget=2**22)
    planner = Planner(job, "gbmw", explain_failure=False, sweep=True)
    settings = planner._settings()
    assert len({s.num_micro_batches for s in settings if s.pp == 4}) > 2  # counts below and at or above P
    for setting in settings:
        costs = planner._costs(setting.tables, setting.pp, setting.num_micro_batches, setting.virtual_stages)
        assert setting.throughput_bound == throughput_upper_bound(costs, setting.allowed, planner.budget)
        assert planner._memory_bound(setting) == memory_aware_throughput_bound(costs, setting.allowed, planner.budget)


def _numpy_knapsack_lower_bound(time, memory, capacity, iterations=40):
    """The numpy form `knapsack_lower_bound` had before it was compiled: the reference it must equal bit for bit."""
    allowed = np.isfinite(time)
    if np.where(allowed, memory, np.inf).min(axis=0).sum() > capacity:
        return np.inf

    def dual(weight):
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


@pytest.mark.parametrize("seed", range(40))
def test_knapsack_lower_bound_equals_its_numpy_form(seed):
    """Bit for bit, on tables like a search's (1–300 layers: numpy's pairwise sums of every length class; forbidden
    strategies; capacities that bind, do not bind, and fit nothing) — and numpy's sum itself on random vectors."""
    rng = np.random.default_rng(seed)
    strategies, layers = int(rng.integers(1, 40)), int(rng.choice([1, 5, 8, 9, 17, 64, 127, 128, 129, 300]))
    time = rng.random((strategies, layers)) * 10.0 ** rng.integers(-4, 1, layers)
    memory = rng.random((strategies, layers)) * 10.0 ** rng.integers(6, 11, layers)
    time = np.where(rng.random((strategies, layers)) < 0.3, np.inf, time)
    time[0] = np.where(np.isfinite(time).any(axis=0), time[0], 1.0)  # every layer allows a strategy
    lightest = np.where(np.isfinite(time), memory, np.inf).min(axis=0).sum()
    for capacity in (lightest * 0.9, lightest, lightest * 1.5, memory.sum() * 2):
        assert knapsack_lower_bound(time, memory, capacity) == _numpy_knapsack_lower_bound(time, memory, capacity)
    for count in range(1, 300):
        values = rng.random(count) * 10.0 ** rng.integers(-3, 9, count)
        assert _numpy_sum(values) == values.sum()
