"""The bound the exact search prunes a last stage's partial plans by (gbmw.search.bounds.stage_suffix_bound) is below the no-sync
time of every completion whose stash fits the memory left: checked against every choice of strategies for the
remaining layers of random tiny jobs, at each choice's own stash (the tightest memory it fits)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from whole_plan_oracle import Choices, random_tiny_job, with_budget

from gbmw.search.bounds.setting_bounds import least_state_bytes
from gbmw.search.bounds.stage_suffix_bound import SuffixTimeBound
from gbmw.search.planner import Planner

pytestmark = pytest.mark.unit


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_suffix_bound_is_below_every_completion_that_fits(data):
    choose = Choices(data.draw)
    tiny = random_tiny_job(choose, "gbmw", work_cap=3000, layer_range=(3, 5))
    planner = Planner(with_budget(tiny.job, 2**50), "gbmw", explain_failure=False)
    for setting in planner._settings():
        costs = planner._costs(setting.tables, setting.pp, setting.num_micro_batches)
        choices = [np.nonzero(setting.allowed[:, layer])[0] for layer in range(costs.model.num_layers)]
        if np.prod([len(c) for c in choices], dtype=float) > 5000:
            continue
        in_flight = costs.in_flight[-1]
        bound = SuffixTimeBound(costs, setting.allowed, in_flight)
        memory = least_state_bytes(costs) + in_flight * setting.tables.forward_memory_bytes
        time_s = setting.tables.time_no_grad_sync_s
        for start in range(costs.model.num_layers + 1):
            layers = list(range(start, costs.model.num_layers))
            completions = [(sum(memory[s, l] for s, l in zip(pick, layers)),
                            sum(time_s[s, l] for s, l in zip(pick, layers)))
                           for pick in itertools.product(*choices[start:])]
            completions.sort()
            stash = np.array([m for m, _ in completions])
            fastest = np.minimum.accumulate(np.array([t for _, t in completions]))  # fastest fitting that stash
            assert (bound.lower_s(start, stash) <= fastest).all(), (tiny.summary, setting.pp, start)
