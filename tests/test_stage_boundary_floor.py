"""The least send/receive time of a stage boundary (gbmw.search.bounds.stage_boundary_floor), added to each stage's lower bound
(gbmw.search.bounds.stage_knapsack_bound), keeps the bound below the no-sync time of every stage of every plan of the brute
force's frontier (on a budget equal to the plan's peak); with the floors doubled the same check fails on some of
these jobs, so it can tell floors that are too high."""

import numpy as np
import pytest
from test_stage_segment_bound import SEEDS, frontier_plans

import gbmw.search.bounds.stage_knapsack_bound as knapsack
from gbmw.search.bounds.stage_boundary_floor import with_boundary_floors

pytestmark = pytest.mark.unit


def stages_above_their_bound(seed: int) -> tuple[int, int]:
    """(stages checked, stages whose no-sync time is below their bound) over the frontier plans of `seed`'s job."""
    checked = above = 0
    for costs, allowed, chosen, partition, stages, iteration_s, budget in frontier_plans(seed):
        tables = knapsack.stage_bound_tables(costs, allowed, budget)
        boundaries = np.concatenate(([0], np.cumsum(partition)))
        for i, stage in enumerate(stages):
            checked += 1
            above += int(tables[i][boundaries[i], boundaries[i + 1]] > stage.time_no_grad_sync_s)
    return checked, above


@pytest.mark.parametrize("seed", SEEDS)
def test_every_stage_is_at_least_its_bound_with_the_floors(seed):
    checked, above = stages_above_their_bound(seed)
    assert above == 0, f"seed {seed}: {above} of {checked} stages below their bound"


def test_doubled_floors_are_caught(monkeypatch):
    def doubled(bounds, stage_index, pp, receive_floor_s, send_floor_s):
        return with_boundary_floors(bounds, stage_index, pp, 2 * receive_floor_s, 2 * send_floor_s)

    monkeypatch.setattr(knapsack, "with_boundary_floors", doubled)
    assert sum(stages_above_their_bound(seed)[1] for seed in SEEDS) > 0
