"""The planner against an independent brute force over whole plans (tests/whole_plan_oracle.py, issue 13).

Random tiny jobs — 2, 4 or 8 devices, 4–8 layers, tied and untied embeddings, encoder–decoder side inputs, uneven
layers, heads TP cannot always divide, budgets from tight to loose and on a plan's exact peak — under the per-layer
variants. The exact mode must give the brute force's samples/s, or nothing fits for both; the default mode (the
paper's partitions on a memory grid) is approximate, and must return a plan of the space that fits and is never
faster than the brute force's, and nothing when nothing fits. benchmarks/search_vs_brute_force.py runs the same
comparison on 200 seeded cases and prints a diagnosis per disagreement.
"""

import itertools

import pytest
from conftest import make_cluster
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from whole_plan_oracle import (AGREE, MISSED, ORACLE_SPACES, SLOWER, Choices, WholePlanOracle, check_planner,
                               compositions, describe_plan, draw_budget, exact_peak_budgets, oracle_strategies,
                               random_case, random_tiny_job, with_budget)

from gbmw.space.spaces import search_space

pytestmark = pytest.mark.unit

# No shrinking: each example runs a brute force, and the failing example's draws (printed) are enough to rebuild it.
CASES = dict(deadline=None, derandomize=True, database=None, phases=(Phase.explicit, Phase.generate),
             suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large))


@pytest.mark.parametrize("variant", sorted(ORACLE_SPACES))
@pytest.mark.parametrize("devices", [2, 4, 8])
def test_oracle_enumerates_the_variants_strategies(variant, devices):
    """The oracle's hand-written per-layer choices are gbmw.space.spaces' for every group size."""
    cluster = make_cluster(nodes=1, devices_per_node=devices)
    space = search_space(variant)
    for pp, experts in itertools.product(space.pipeline_degrees(cluster, None), (False, True)):
        expected = space.strategies(cluster, pp, experts=experts)
        found = oracle_strategies(ORACLE_SPACES[variant], devices // pp, experts, cluster.devices_per_node)
        assert sorted(s.name for s in found) == sorted(s.name for s in expected)
        assert len(set(found)) == len(found)
        assert space.schedule == ORACLE_SPACES[variant].schedule
        assert set(space.partitioning) <= {"time", "bi-objective"}  # the exact mode's free partitioning


def test_oracle_counts_the_papers_space_and_every_partition():
    # DESIGN.md: 44 candidates over pp ∈ {1, 2, 4, 8} on 8 devices with Takeaway #3 (22 without CKPT)
    assert sum(len(oracle_strategies(ORACLE_SPACES["1f1b+bi-obj"], 8 // pp)) for pp in (1, 2, 4, 8)) == 22
    assert sum(len(oracle_strategies(ORACLE_SPACES["bmw"], 8 // pp)) for pp in (1, 2, 4, 8)) == 44
    for layers, parts in itertools.product(range(1, 9), (1, 2, 4, 8)):
        found = compositions(layers, parts)
        expected = [p for p in itertools.product(range(1, layers - parts + 2), repeat=parts) if sum(p) == layers]
        assert sorted(found) == sorted(expected) and len(set(found)) == len(found)


@settings(max_examples=25, **CASES)
@given(st.data())
def test_stagewise_oracle_equals_estimate_plan_on_every_whole_plan(data):
    """The oracle's stage-wise enumeration gives the same frontier, to the bit, as estimate_plan on every whole
    Plan of the space (small spaces: at most 600 whole plans)."""
    choose = Choices(data.draw)
    variant = choose.choice(sorted(ORACLE_SPACES))
    tiny = random_tiny_job(choose, variant, layer_range=(4, 5), whole_plan_cap=600)
    stagewise = WholePlanOracle(tiny.job, variant)
    literal = WholePlanOracle(tiny.job, variant, literal=True)
    assert [(p.peak_bytes, p.samples_per_s) for p in stagewise.frontier] == [
        (p.peak_bytes, p.samples_per_s) for p in literal.frontier], tiny.summary
    for budget in exact_peak_budgets(tiny.job, variant, stagewise):
        best, expected = stagewise.best(budget), literal.best(budget)  # each checked with estimate_plan
        assert (best and best.samples_per_s) == (expected and expected.samples_per_s)


@settings(max_examples=200, **CASES)
@given(st.data())
def test_exact_search_equals_brute_force_over_whole_plans(data):
    case = random_case(Choices(data.draw))
    verdict = check_planner(case, exact=True)
    oracle = "nothing fits" if verdict.oracle is None else describe_plan(verdict.oracle.plan(case.job))
    planner = "nothing fits" if verdict.plan is None else describe_plan(verdict.plan)
    assert verdict.kind == AGREE, f"{verdict.kind}: {case.summary}\nbrute force: {oracle}\nplanner: {planner}"


@settings(max_examples=100, **CASES)
@given(st.data())
def test_default_search_plans_fit_and_are_never_faster_than_brute_force(data):
    """The default mode's guarantee, and no more: its plan is in the space, fits, and is no faster than the brute
    force's (it may be slower, or miss a plan that fits: the grid and the paper's partitions are approximate);
    where nothing fits, it finds nothing. benchmarks/search_vs_brute_force.py reports how often it is slower."""
    case = random_case(Choices(data.draw))
    verdict = check_planner(case, exact=False)
    assert verdict.kind in (AGREE, SLOWER, MISSED), f"{verdict.kind}: {case.summary}"


def test_exact_peak_budgets_are_the_boundaries_of_the_answer():
    """On a budget equal to a frontier plan's peak (rounded up to a whole byte) that plan fits; one byte under, it
    does not, and the answer is slower. Hand-made layers count whole bytes, so there the budget is the peak itself."""
    import math
    import random

    kinds = set()
    for seed in range(8):
        tiny = random_tiny_job(random.Random(seed), "gbmw", work_cap=5000)
        oracle = WholePlanOracle(tiny.job, "gbmw")
        budgets = exact_peak_budgets(tiny.job, "gbmw", oracle)
        for plan in oracle.frontier:
            budget = math.ceil(plan.peak_bytes)
            assert budget in budgets and budget - 1 in budgets
            assert oracle.best(budget).samples_per_s >= plan.samples_per_s
            below = oracle.best(budget - 1)
            assert below is None or below.samples_per_s < plan.samples_per_s
            if tiny.summary.startswith("hand-made"):
                assert budget == plan.peak_bytes
                kinds.add("hand-made")
        budget, _ = draw_budget(Choices(random.Random(seed)), oracle)
        assert with_budget(tiny.job, budget).memory_budget_bytes == budget
    assert kinds == {"hand-made"}


def test_exact_search_one_byte_under_the_fastest_plans_peak_on_a_gib_budget():
    """A plan one byte over the budget must not evict the fitting, slower one (memory is compared exactly, never
    within a tolerance): the case where a relative 1e-9 slack lost the fitting plan."""
    import random

    case = random_case(random.Random(1154), variants=("gbmw", "gbmw+ulysses", "bmw", "1f1b+bi-obj"))  # drawn before base joined
    fastest, fitting = case.oracle.frontier[-1], case.oracle.frontier[-2]
    assert fastest.peak_bytes > 2**30 and fitting.peak_bytes < fastest.peak_bytes - 1, case.summary
    case.budget_bytes, case.budget_kind = int(fastest.peak_bytes) - 1, "one byte under the fastest plan's peak"
    verdict = check_planner(case, exact=True)
    assert verdict.kind == AGREE and verdict.oracle.samples_per_s == fitting.samples_per_s, case.summary


@pytest.mark.parametrize("seed", range(6))
def test_exact_search_on_every_boundary_budget(seed):
    """On every budget where the brute-force answer changes — each frontier plan's exact peak, and one byte under
    it — the exact mode gives the brute force's samples/s (or nothing, where nothing fits)."""
    import random

    from whole_plan_oracle import Case

    tiny = random_tiny_job(random.Random(1000 + seed), "gbmw", work_cap=4000)
    oracle = WholePlanOracle(tiny.job, "gbmw")
    for budget in exact_peak_budgets(tiny.job, "gbmw", oracle):
        verdict = check_planner(Case(tiny, "gbmw", budget, "boundary", oracle), exact=True)
        assert verdict.kind == AGREE, f"{verdict.kind}: {tiny.summary}, budget {budget} B"
