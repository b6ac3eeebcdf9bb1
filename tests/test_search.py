"""The stage DP equals exhaustive enumeration (up to 6 layers, 4 strategies, with transition costs)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gbmw.search import Frontier, LayerOptions


def evaluate(plan, time, stash, forward, backward, layout, transition):
    """(time, E_all) of one plan: E_all = Σ stash − Σ f + max_j (Σ_{i≤j} f + b_j) (Eq. 4 with the 1F1B stash)."""
    total = sum(time[l, s] for l, s in enumerate(plan))
    total += sum(transition[l, layout[plan[l - 1]], layout[plan[l]]] for l in range(1, len(plan)))
    prefix, peak = 0, 0
    for l, s in enumerate(plan):
        prefix += forward[l, s]
        peak = max(peak, prefix + backward[l, s])
    return total, sum(stash[l, s] for l, s in enumerate(plan)) - prefix + peak


def brute_force(time, stash, forward, backward, layout, transition, budget):
    """The fastest of all plans whose E_all is within the budget."""
    layers, options = time.shape
    best_time, best_plan = np.inf, None
    for plan in itertools.product(range(options), repeat=layers):
        total, memory = evaluate(plan, time, stash, forward, backward, layout, transition)
        if memory <= budget and total < best_time - 1e-12:
            best_time, best_plan = total, plan
    return best_time, best_plan


def dp(time, stash, forward, backward, layout, transition, budget, prune):
    layers, options = time.shape
    frontier = Frontier.empty()
    n_layouts = int(layout.max()) + 1
    for l in range(layers):
        layer = LayerOptions(np.arange(options), time[l], stash[l], forward[l], backward[l], layout.copy())
        if prune:
            layer = layer.pruned()
        r = np.zeros((n_layouts, n_layouts)) if l == 0 else transition[l]
        frontier = frontier.extend(layer, r, budget)
    index = frontier.best(budget)
    if index < 0:
        return np.inf, None
    return float(frontier.time[index]), tuple(frontier.backtrack(index))


@settings(max_examples=300, deadline=None)
@given(
    layers=st.integers(1, 6), options=st.integers(1, 4), n_layouts=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1), prune=st.booleans(),
)
def test_stage_dp_equals_exhaustive_enumeration(layers, options, n_layouts, seed, prune):
    rng = np.random.default_rng(seed)
    time = rng.uniform(0.0, 10.0, (layers, options)).round(2)
    forward = rng.integers(0, 8, (layers, options))
    stash = forward * rng.integers(1, 3) + rng.integers(0, 8, (layers, options))  # ms + k·f with k in {1, 2}
    backward = rng.integers(0, 10, (layers, options)) * rng.integers(0, 2, (layers, options))
    layout = rng.integers(0, n_layouts, options)
    transition = rng.uniform(0.0, 3.0, (layers, n_layouts, n_layouts)).round(2)
    for l in range(layers):
        np.fill_diagonal(transition[l], 0.0)
    budget = int(rng.integers(0, int(stash.sum(axis=1).max() * layers // 2 + 20)))
    expected_time, expected_plan = brute_force(time, stash, forward, backward, layout, transition, budget)
    got_time, got_plan = dp(time, stash, forward, backward, layout, transition, budget, prune)
    if expected_plan is None:
        assert got_plan is None
    else:
        assert got_time == pytest.approx(expected_time, abs=1e-9)
        # The plan the DP returns really has that time and fits.
        plan_time, plan_memory = evaluate(got_plan, time, stash, forward, backward, layout, transition)
        assert plan_time == pytest.approx(got_time, abs=1e-9) and plan_memory <= budget


def test_backward_peak_makes_the_forward_only_optimum_infeasible():
    # Two layers, two options each. Option 1 is fast with low stash but a big backward extra (CKPT).
    time = np.array([[5.0, 1.0], [5.0, 1.0]])
    stash = np.array([[4, 1], [4, 1]])
    forward = np.array([[4, 1], [4, 1]])
    backward = np.array([[0, 9], [0, 9]])
    layout = np.array([0, 0])
    transition = np.zeros((2, 1, 1))
    # Forward memory alone (2) fits a budget of 8, but E_all = 2 - 2 + max(1+9, 2+9) = 11 does not.
    best, plan = dp(time, stash, forward, backward, layout, transition, budget=8, prune=False)
    assert plan == (0, 0) and best == 10.0
    best, plan = dp(time, stash, forward, backward, layout, transition, budget=11, prune=False)
    assert plan == (1, 1) and best == 2.0
