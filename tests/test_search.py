"""The stage DPs against exhaustive enumeration (up to 6 layers, 4 strategies, with transition costs).

gbmw.search.stage_dp.pareto is exact: it equals the fastest plan whose E_all fits. gbmw.search.stage_dp.grid_frontier (the grid, the
paper's Eq. (4)) equals exhaustive enumeration of C(L, E_fwd) for every forward budget, and its answer
after the overall-memory check always fits and is optimal when no layer has a backward extra.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbmw.search.stage_dp.grid_frontier import GridFrontier
from gbmw.search.stage_dp.layer_options import LayerOptions
from gbmw.search.stage_dp.pareto import Frontier


def evaluate(plan, case):
    """(time, forward memory E_f, overall memory E_all) of one plan (Eq. (2)–(4) with the 1F1B stash)."""
    time, stash, forward, backward, layout, transition = (case[k] for k in ("time", "stash", "forward", "backward",
                                                                             "layout", "transition"))
    total = sum(time[l, s] for l, s in enumerate(plan))
    total += sum(transition[l, layout[plan[l - 1]], layout[plan[l]]] for l in range(1, len(plan)))
    prefix, peak = 0, 0
    for l, s in enumerate(plan):
        prefix += forward[l, s]
        peak = max(peak, prefix + backward[l, s])
    forward_memory = sum(stash[l, s] for l, s in enumerate(plan))
    return total, forward_memory, forward_memory - prefix + peak


def all_plans(case):
    layers, options = case["time"].shape
    return [(plan, *evaluate(plan, case)) for plan in itertools.product(range(options), repeat=layers)]


def run_dp(case, root):
    time = case["time"]
    layers, options = time.shape
    frontier = root
    n_layouts = int(case["layout"].max()) + 1
    for l in range(layers):
        layer = LayerOptions(np.arange(options), time[l], case["states"][l], case["forward"][l], case["backward"][l],
                             case["layout"].copy(), case["in_flight"])
        r = np.zeros((n_layouts, n_layouts)) if l == 0 else case["transition"][l]
        frontier = frontier.extend(layer, r, case["budget"])
    return frontier


def random_case(layers, options, n_layouts, seed, with_backward=True):
    rng = np.random.default_rng(seed)
    time = rng.uniform(0.0, 10.0, (layers, options)).round(2)
    forward = rng.integers(0, 8, (layers, options))
    states, in_flight = rng.integers(0, 8, (layers, options)), int(rng.integers(1, 3))
    stash = states + in_flight * forward  # O_ms + k·O_f with k in {1, 2}
    backward = rng.integers(0, 10, (layers, options)) * rng.integers(0, 2, (layers, options))
    if not with_backward:
        backward[:] = 0
    layout = rng.integers(0, n_layouts, options)
    transition = rng.uniform(0.0, 3.0, (layers, n_layouts, n_layouts)).round(2)
    for l in range(layers):
        np.fill_diagonal(transition[l], 0.0)
    budget = int(rng.integers(0, int(stash.sum(axis=1).max() * layers // 2 + 20)))
    return dict(time=time, states=states, in_flight=in_flight, stash=stash, forward=forward, backward=backward,
                layout=layout, transition=transition, budget=budget)


case_strategy = dict(layers=st.integers(1, 6), options=st.integers(1, 4), n_layouts=st.integers(1, 3),
                     seed=st.integers(0, 2**31 - 1))


@settings(max_examples=250, deadline=None)
@given(**case_strategy)
def test_exact_engine_equals_exhaustive_enumeration(layers, options, n_layouts, seed):
    case = random_case(layers, options, n_layouts, seed)
    fitting = [(t, plan) for plan, t, _, memory in all_plans(case) if memory <= case["budget"]]
    frontier = run_dp(case, Frontier.empty())
    index = frontier.best(case["budget"])
    if not fitting:
        assert index < 0
        return
    assert index >= 0
    plan = tuple(frontier.backtrack(index))
    plan_time, _, plan_memory = evaluate(plan, case)
    assert frontier.time_at(index) == pytest.approx(min(fitting)[0], abs=1e-9)
    assert plan_time == pytest.approx(frontier.time_at(index), abs=1e-9) and plan_memory <= case["budget"]


@settings(max_examples=250, deadline=None)
@given(**case_strategy)
def test_grid_equals_exhaustive_enumeration_for_every_forward_budget(layers, options, n_layouts, seed):
    case = random_case(layers, options, n_layouts, seed, with_backward=False)
    plans = all_plans(case)
    grid = run_dp(case, GridFrontier.empty(n_layouts, case["budget"], 1.0))
    best_by_memory = np.minimum.accumulate(grid.time.min(axis=0))  # C(L, E_fwd) for E_fwd = 0 … budget
    for e_fwd in range(case["budget"] + 1):
        expected = min((t for _, t, forward_memory, _ in plans if forward_memory <= e_fwd), default=np.inf)
        assert best_by_memory[e_fwd] == pytest.approx(expected, abs=1e-9)


@settings(max_examples=250, deadline=None)
@given(**case_strategy)
def test_grid_answer_fits_and_is_never_better_than_the_optimum(layers, options, n_layouts, seed):
    case = random_case(layers, options, n_layouts, seed)
    fitting = [t for _, t, _, memory in all_plans(case) if memory <= case["budget"]]
    grid = run_dp(case, GridFrontier.empty(n_layouts, case["budget"], 1.0))
    index = grid.best(case["budget"])
    if index < 0:
        return  # the grid may miss a fitting plan whose forward memory is dominated (paper semantics)
    plan = tuple(grid.backtrack(index))
    plan_time, _, plan_memory = evaluate(plan, case)
    assert plan_memory <= case["budget"] and grid.memory_at(index) == plan_memory
    assert plan_time == pytest.approx(grid.time_at(index), abs=1e-9)
    assert plan_time >= min(fitting) - 1e-9


def test_backward_peak_makes_the_forward_only_optimum_infeasible():
    # Two layers, two options each. Option 1 is fast with low stash but a big backward extra (CKPT).
    case = dict(time=np.array([[5.0, 1.0], [5.0, 1.0]]), states=np.zeros((2, 2), int), in_flight=1,
                forward=np.array([[4, 1], [4, 1]]), backward=np.array([[0, 9], [0, 9]]), layout=np.array([0, 0]),
                transition=np.zeros((2, 1, 1)))
    # Forward memory alone (2) fits a budget of 8, but E_all = 2 - 2 + max(1+9, 2+9) = 11 does not.
    for root in (lambda: Frontier.empty(), lambda: GridFrontier.empty(1, case["budget"], 1.0)):
        for budget, plan, best in ((8, (0, 0), 10.0), (11, (1, 1), 2.0)):
            case["budget"] = budget
            frontier = run_dp(case, root())
            index = frontier.best(budget)
            assert tuple(frontier.backtrack(index)) == plan and frontier.time_at(index) == best
