"""The bound the exact search prunes a last stage's partial plans by (gbmw.search.bounds.stage_suffix_bound) is below the no-sync
time of every completion whose stash fits the memory left: checked against every choice of strategies for the
remaining layers of random tiny jobs, at each choice's own stash (the tightest memory it fits)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from whole_plan_oracle import Choices, random_tiny_job, with_budget

from gbmw.search.bounds.setting_bounds import least_optimizer_parameters, least_state_bytes
from gbmw.search.bounds.stage_suffix_bound import SuffixTimeBound, _best_row
from gbmw.search.planner import Planner

pytestmark = pytest.mark.unit


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(st.data())
@pytest.mark.parametrize("joint", [False, True])
def test_suffix_bound_is_below_every_completion_that_fits(joint, data):
    choose = Choices(data.draw)
    tiny = random_tiny_job(choose, "gbmw", work_cap=3000, layer_range=(3, 5))
    planner = Planner(with_budget(tiny.job, 2**50), "gbmw", explain_failure=False)
    for setting in planner._settings():
        costs = planner._costs(setting.tables, setting.pp, setting.num_micro_batches)
        choices = [np.nonzero(setting.allowed[:, layer])[0] for layer in range(costs.model.num_layers)]
        if np.prod([len(c) for c in choices], dtype=float) > 5000:
            continue
        in_flight, tables = costs.in_flight[-1], setting.tables
        # the no-sync time, or the last stage's joint m · c_no_sync + c_sync + c_step (whole_plan_search prunes by both)
        time_s = tables.time_no_grad_sync_s if not joint else (
            costs.num_micro_batches * tables.time_no_grad_sync_s + (tables.time_s - tables.time_no_grad_sync_s)
            + tables.optimizer_step_s_per_parameter * least_optimizer_parameters(costs))
        bound = SuffixTimeBound(costs, setting.allowed, in_flight, None if not joint else time_s)
        memory = least_state_bytes(costs) + in_flight * tables.forward_memory_bytes
        for start in range(costs.model.num_layers + 1):
            layers = list(range(start, costs.model.num_layers))
            completions = [(sum(memory[s, l] for s, l in zip(pick, layers)),
                            sum(time_s[s, l] for s, l in zip(pick, layers)))
                           for pick in itertools.product(*choices[start:])]
            completions.sort()
            stash = np.array([m for m, _ in completions])
            fastest = np.minimum.accumulate(np.array([t for _, t in completions]))  # fastest fitting that stash
            assert (bound.lower_s(start, stash) <= fastest).all(), (tiny.summary, setting.pp, start)


@pytest.mark.parametrize("seed", range(20))
def test_compiled_rows_equal_their_numpy_form(seed):
    """`lower_s`'s compiled max over λ is the numpy expression its docstring gives, float for float (plans with
    memory left and plans already over it)."""
    rng = np.random.default_rng(seed)
    costs_layers, plans = 30, int(rng.integers(1, 60))
    lambdas = np.concatenate(([0.0], np.geomspace(1e-12, 1e-6, 24)))
    suffix_s = rng.random(len(lambdas)) * 10
    suffix_abs = suffix_s + rng.random(len(lambdas))
    free = (rng.random(plans) - 0.2) * 1e10
    coefficient = (4 * costs_layers + 16) * np.finfo(float).eps
    penalty = lambdas[None, :] * free[:, None]
    numpy_form = ((suffix_s[None] - penalty) - coefficient * (suffix_abs[None] + np.abs(penalty))).max(axis=1)
    assert np.array_equal(_best_row(suffix_s, suffix_abs, lambdas, free, coefficient), numpy_form)
