"""The bound the exact search prunes the partial plans of the first and middle stages by (gbmw.search.bounds.stage_segment_bound)
never prunes a plan of the brute force's frontier: for every such plan (on a budget equal to its peak, the tightest
memory it fits) and every prefix of each of its non-last stages, a partial plan at least as slow and as heavy as
that prefix is kept with the plan's own time as the incumbent's. The same check with the stash over-counted by one
micro-batch, or the send floor doubled, fails on some of the same jobs: the check can tell a bound that is too
high."""

import random

import numpy as np
import pytest
from whole_plan_oracle import WholePlanOracle, random_tiny_job, with_budget

from gbmw.cost.pipeline_schedules import pipeline_time_s
from gbmw.cost.stage_cost import stage_estimate
from gbmw.search.bounds.setting_bounds import least_state_bytes
from gbmw.search.bounds.stage_boundary_floor import boundary_floors_s
from gbmw.search.bounds.stage_knapsack_bound import partition_tables, stage_bound_tables
from gbmw.search.bounds.stage_segment_bound import StageCompletionBound
from gbmw.search.bounds.stage_suffix_bound import SuffixTimeBound
from gbmw.search.planner import Planner

pytestmark = pytest.mark.unit

SEEDS = range(12)

SLACK = 1e-12
"""The search's INCUMBENT_SLACK: the bound and Eq. (9) sum the same times in other orders (a few ulps, ≈1e-16
relative each); a bound above the plan's time by more than this is an error the check reports."""


def frontier_plans(seed: int):
    """(costs, allowed, chosen strategy indices, partition, stage estimates, T, budget) of every plan of the brute
    force's frontier of the random tiny job of `seed`, priced by the planner's own tables at the plan's peak."""
    tiny = random_tiny_job(random.Random(seed), "gbmw", work_cap=1500)
    oracle = WholePlanOracle(tiny.job, "gbmw")
    planner = Planner(with_budget(tiny.job, 2**50), "gbmw", explain_failure=False)
    settings = {(s.pp, s.micro_batch, s.num_micro_batches): s for s in planner._settings()}
    for plan in oracle.frontier:
        setting = settings.get((plan.setting.pp, plan.setting.micro_batch, plan.setting.num_micro_batches))
        if setting is None or setting.pp < 2:
            continue
        strategies = list(setting.tables.strategies)
        if not all(s in strategies for s in plan.strategies):
            continue
        chosen = [strategies.index(s) for s in plan.strategies]
        costs = planner._costs(setting.tables, setting.pp, setting.num_micro_batches)
        stages, first = [], 0
        for index, count in enumerate(plan.partition):
            stages.append(stage_estimate(costs, index, first, chosen[first:first + count]))
            first += count
        budget = max(stage.peak_memory_bytes for stage in stages)
        iteration_s = pipeline_time_s(stages, setting.num_micro_batches)
        yield costs, setting.allowed, chosen, plan.partition, stages, iteration_s, budget


def pruned_prefixes(seed: int, in_flight_extra: float = 0.0, send_factor: float = 1.0) -> tuple[int, int]:
    """(prefixes checked, prefixes the bound would prune) over the frontier plans of `seed`'s job, with the bound's
    stash counting `in_flight_extra` more micro-batches and its send floor times `send_factor` (1: as built)."""
    checked = pruned = 0
    for costs, allowed, chosen, partition, stages, iteration_s, budget in frontier_plans(seed):
        tables = costs.tables
        receive_floor, send_floor = boundary_floors_s(costs, allowed)
        bound = StageCompletionBound(costs, allowed, partition_tables(stage_bound_tables(costs, allowed, budget)),
                                     send_floor * send_factor)
        states = least_state_bytes(costs)
        boundaries = np.concatenate(([0], np.cumsum(partition)))
        for i in range(costs.pp - 1):
            first, end = int(boundaries[i]), int(boundaries[i + 1])
            in_flight = costs.in_flight[i]
            bound._suffix[float(in_flight)] = SuffixTimeBound(costs, allowed, in_flight + in_flight_extra)
            last = chosen[end - 1]
            send_s = costs.boundary_send_s(end, tables.data_parallel[last], tables.tp[last])
            stage = stages[i]
            for done in range(1, end - first + 1):
                rest = range(first + done, end)
                rest_s = sum(tables.time_no_grad_sync_s[chosen[j], j] for j in rest)
                rest_bytes = sum(states[chosen[j], j] + in_flight * tables.forward_memory_bytes[chosen[j], j]
                                 for j in rest)
                # at least the DP's prefix N (the rest's transitions are ≥ 0), S and U, and at most its memory left
                no_sync = stage.time_no_grad_sync_s - rest_s - send_s
                extra = stage.time_s - stage.time_no_grad_sync_s + stage.optimizer_time_s
                free = budget - (stage.peak_memory_bytes - rest_bytes)
                keep = bound.may_beat((i,), done, np.array([no_sync]), np.array([extra]), np.array([free]),
                                      costs.num_micro_batches, iteration_s * (1 + SLACK))
                checked += 1
                pruned += int(not keep[0])
    return checked, pruned


@pytest.mark.parametrize("seed", SEEDS)
def test_the_bound_keeps_every_prefix_of_every_frontier_plan(seed):
    checked, pruned = pruned_prefixes(seed)
    assert pruned == 0, f"seed {seed}: {pruned} of {checked} prefixes pruned"


def test_the_check_fails_on_a_bound_that_over_counts():
    """The stash over-counted by one micro-batch (the memory-aware part too high) and the send to the next stage
    doubled (the floor too high) each prune a prefix of some frontier plan of these jobs."""
    assert sum(pruned_prefixes(seed, in_flight_extra=1.0)[1] for seed in SEEDS) > 0
    assert sum(pruned_prefixes(seed, send_factor=2.0)[1] for seed in SEEDS) > 0
