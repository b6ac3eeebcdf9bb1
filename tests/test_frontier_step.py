"""gbmw.search.exact.frontier_step: one compiled pass keeps exactly the rows, values and keys that
`nondominated_plans(*extend_candidates(...))` keeps — on random stage DP steps with many ties (equal stashes, equal
rows, options sharing a layout) and with the memory and incumbent tests pruning some rows."""

import numpy as np
import pytest
from frontier_step_reference import extend_candidates, nondominated_plans

from gbmw.cost.framework_memory import ADAM_CHUNK_ELEMENTS
from gbmw.search.exact.frontier_order import stash_order
from gbmw.search.exact.frontier_step import extend_and_filter

pytestmark = pytest.mark.unit


def _random_step(seed: int):
    """Arguments of one stage DP step: kept plans, the next layer's options, a transition matrix and the bounds."""
    rng = np.random.default_rng(seed)
    points, options, layouts = int(rng.integers(1, 400)), int(rng.integers(1, 12)), int(rng.integers(1, 5))
    unit = 2.0**20
    stash = rng.integers(0, 40, points) * unit
    excess = rng.integers(0, 6, points) * unit
    no_sync, sync = rng.integers(0, 30, points) * 0.125, rng.integers(0, 4, points) * 0.25
    params = rng.choice([0.0, 2.0**22, float(ADAM_CHUNK_ELEMENTS)], points) + rng.integers(0, 3, points) * 2.0**20
    layout = rng.integers(0, layouts, points)
    o_no_sync, o_sync = rng.integers(0, 6, options) * 0.125, rng.integers(0, 3, options) * 0.25
    o_stash, o_forward = rng.integers(0, 6, options) * unit, rng.integers(0, 3, options) * unit
    o_backward, o_params = rng.integers(0, 4, options) * unit, rng.integers(0, 3, options) * 2.0**21
    o_layout = rng.integers(0, layouts, options)
    transition = rng.integers(0, 3, (layouts, layouts)) * 0.0625
    budget = float(rng.integers(20, 60)) * unit
    sharing = int(rng.choice([0, 0, 2, 4]))
    limit_s = float(rng.choice([np.inf, rng.integers(20, 80) * 0.25]))
    return (stash, excess, no_sync, sync, params, layout, stash_order(stash), np.argsort(o_layout, kind="stable"),
            o_no_sync, o_sync, o_stash, o_forward, o_backward, o_params, o_layout, transition, budget, 4.0,
            float(ADAM_CHUNK_ELEMENTS), float(rng.integers(1, 9)), 2.0**-30, 0.5, limit_s,
            float(rng.integers(0, 3)) * unit, 0.0, 0.0, float(rng.integers(0, 4)) * 0.5, sharing)


@pytest.mark.parametrize("single_stage", [False, True])
@pytest.mark.parametrize("seed", range(60))
def test_extend_and_filter_keeps_what_the_two_passes_keep(seed, single_stage):
    arguments = _random_step(seed)
    single_stage_m = arguments[19] if single_stage else None
    made = extend_candidates(*arguments)
    kept = nondominated_plans(*made[:6], made[8], arguments[20], single_stage_m)
    fused = extend_and_filter(*arguments, -1.0 if single_stage_m is None else single_stage_m)
    by_key = np.argsort(fused[8])
    assert all(np.array_equal(ours[by_key], theirs[kept]) for ours, theirs in zip(fused, made))
