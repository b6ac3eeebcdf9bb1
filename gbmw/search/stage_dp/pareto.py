"""The stage DP without a memory grid: Pareto frontiers over memory units. The planner's exact mode uses it only for a
space whose layers choose among several strategies on fixed partition rules — none of gbmw.space.spaces' (the per-layer
variants' exact mode is gbmw.search.exact.whole_plan_search; the uniform spaces, stock targets and fixed baselines, give each layer
one strategy per layout and need no stage DP: gbmw.search.planner).

gbmw.search.stage_dp.grid_frontier solves the stage problem on a memory grid as the paper does. This engine solves the same
problem without cells. The paper's DP keeps C(l, E_fwd) — the least time of the first l layers whose forward
memory (model states plus stashed activations, Eq. (3)) is at most E_fwd — with the previous layer's
strategy in the state because of the transition cost R (Eq. (4)), then raises E_fwd until the overall memory
E_all (Eq. (2)), which adds the backward peak, exceeds the budget (Algorithm 3).

We compute the same thing without a memory axis and without the E_fwd sweep. After each layer we
keep, per activation layout of the last layer's strategy (strategies that share a layout share R,
so the layout — not the strategy — is the state), the Pareto frontier of partial plans over

    stash   S = Σ (O_ms + k · O_f)          the forward memory E_f of Eq. (3), with the 1F1B
                                            stash of k in-flight micro-batches folded in
    excess  X = max_j (Σ_{i≤j} O_f + O_b(j)) − Σ O_f      how far the backward peak of Eq. (2)
                                            reaches above the stash; X' = max(X − O_f, O_b)
    time    T = Σ c(l, S_l) + Σ R(l, S_{l-1}, S_l)

so that E_all = S + X exactly. A partial plan is dropped only if another with the same layout is
no worse in all three (or if S + X already exceeds the budget: E_all never falls as layers are
added). The frontier after the last layer holds C(L, E_fwd) for every E_fwd at once, so Algorithm 3's
sweep is one pass over it, and carrying X makes its overall-memory check exact: the result is the
fastest plan with E_all ≤ E, equal to exhaustive enumeration (tests/test_search.py), where the
paper's sweep can stop early at a plan whose backward peak is high.

Interfaces are in bytes, as the grid's; inside, memory terms are whole units of `unit_bytes`, each term
rounded up (LayerOptions.in_units) and the budget rounded down: a plan it returns fits, but one whose peak is within
a few units of the budget can be missed, so it is exact in bytes only with `unit_bytes` = 1 on whole-byte terms. The inner step is compiled with numba:
the frontier merge is a sequential sweep with a Fenwick tree that numpy cannot vectorise. Its cost
grows with the frontier (thousands of points for 80 GB budgets), which is why the grid is the default.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from gbmw.errors import GbmwError
from gbmw.search.stage_dp.layer_options import LayerOptions

MAX_MEMORY_UNITS = 2**24
"""Memory units the packed sort key allows."""


def budget_units(budget_bytes: float, unit_bytes: int) -> int:
    """The budget in whole units, rounded down; one GbmwError if the units overflow the sort key."""
    units = int(np.floor(budget_bytes / unit_bytes))
    if units > MAX_MEMORY_UNITS:
        raise GbmwError(
            f"memory granularity {unit_bytes} B gives {units} units for a {budget_bytes:.0f} B budget; "
            f"use a granularity of at least {int(np.ceil(budget_bytes / MAX_MEMORY_UNITS))} B"
        )
    return units


@njit(cache=True)
def _fenwick_min_query(tree: np.ndarray, position: int) -> float:
    best = np.inf
    i = position + 1
    while i > 0:
        if tree[i] < best:
            best = tree[i]
        i -= i & (-i)
    return best


@njit(cache=True)
def _fenwick_min_update(tree: np.ndarray, position: int, value: float) -> None:
    i = position + 1
    size = tree.shape[0]
    while i < size:
        if value < tree[i]:
            tree[i] = value
        i += i & (-i)


@njit(cache=True)
def extend_frontier(
    stash: np.ndarray, excess: np.ndarray, time: np.ndarray, layout: np.ndarray,
    option_time: np.ndarray, option_stash: np.ndarray, option_forward: np.ndarray, option_backward: np.ndarray,
    option_layout: np.ndarray, transition: np.ndarray, budget: int,
):
    """One layer of the DP: every kept partial plan × every option of the new layer, then the
    per-layout 3-D Pareto frontier. Returns (stash, excess, time, layout, option, parent) arrays.

    `transition[a, b]` is R from layout a to layout b for this layer (Eq. (4)).

    Dominance uses E = stash + excess rather than the excess: the final E_all of any completion is
    max(E + A, stash + B) for A, B fixed by the completion, so a plan with no more stash, no more E
    and no more time is never worse — which keeps fewer points than comparing excesses.
    """
    points, options = stash.shape[0], option_time.shape[0]
    capacity = points * options
    new_stash = np.empty(capacity, np.int64)
    new_excess = np.empty(capacity, np.int64)
    new_time = np.empty(capacity, np.float64)
    new_layout = np.empty(capacity, np.int64)
    new_option = np.empty(capacity, np.int64)
    new_parent = np.empty(capacity, np.int64)
    count = 0
    for o in range(options):
        target = option_layout[o]
        for p in range(points):
            s = stash[p] + option_stash[o]
            if s > budget:
                continue
            x = excess[p] - option_forward[o]
            if x < option_backward[o]:
                x = option_backward[o]
            if s + x > budget:
                continue
            t = time[p] + option_time[o] + transition[layout[p], target]
            new_stash[count] = s
            new_excess[count] = x
            new_time[count] = t
            new_layout[count] = target
            new_option[count] = o
            new_parent[count] = p
            count += 1
    if count == 0:
        return (new_stash[:0], new_excess[:0], new_time[:0], new_layout[:0], new_option[:0], new_parent[:0])
    new_stash, new_excess, new_time = new_stash[:count], new_excess[:count], new_time[:count]
    new_layout, new_option, new_parent = new_layout[:count], new_option[:count], new_parent[:count]

    # Sort by (layout, stash, E, time): a dominating point always comes before what it dominates.
    span = budget + 1
    total = new_stash + new_excess
    key = (new_layout * span + new_stash) * span + total
    order = np.argsort(new_time, kind="mergesort")
    order = order[np.argsort(key[order], kind="mergesort")]

    keep = np.zeros(count, np.bool_)
    start = 0
    while start < count:
        group_layout = new_layout[order[start]]
        end = start
        while end < count and new_layout[order[end]] == group_layout:
            end += 1
        group = order[start:end]
        ranks = np.searchsorted(np.unique(total[group]), total[group])
        tree = np.full(ranks.max() + 2, np.inf)
        for position in range(group.shape[0]):
            index = group[position]
            if _fenwick_min_query(tree, ranks[position]) <= new_time[index]:
                continue  # some plan with no more stash and no more E is no slower
            keep[index] = True
            _fenwick_min_update(tree, ranks[position], new_time[index])
        start = end
    selected = np.nonzero(keep)[0]
    return (new_stash[selected], new_excess[selected], new_time[selected], new_layout[selected],
            new_option[selected], new_parent[selected])


class Frontier:
    """The Pareto frontier of partial plans after some layers of a stage, with back-pointers."""

    __slots__ = ("stash", "excess", "time", "layout", "strategy", "parent", "previous", "depth", "unit_bytes")

    def __init__(self, stash, excess, time, layout, strategy, parent, previous: "Frontier | None", depth: int,
                 unit_bytes: int):
        self.stash, self.excess, self.time, self.layout = stash, excess, time, layout
        self.strategy, self.parent, self.previous, self.depth = strategy, parent, previous, depth
        self.unit_bytes = unit_bytes

    @classmethod
    def empty(cls, unit_bytes: int = 1) -> "Frontier":
        """Before the first layer: one empty plan (its layout, 0, has no transition cost)."""
        zero = np.zeros(1, np.int64)
        return cls(zero, zero.copy(), np.zeros(1), zero.copy(), np.full(1, -1), np.full(1, -1), None, 0, unit_bytes)

    def extend(self, options: LayerOptions, transition_s: np.ndarray, budget_bytes: float) -> "Frontier":
        """The frontier after one more layer with `options` (memory in bytes); `transition_s[a, b]` is R from
        layout a to b (row 0 must be zero for the first layer of a stage)."""
        units = options.in_units(self.unit_bytes).pruned()
        stash, excess, time, layout, option, parent = extend_frontier(
            self.stash, self.excess, self.time, self.layout,
            units.time_s, units.stash, units.forward, units.backward,
            units.layout, transition_s, budget_units(budget_bytes, self.unit_bytes),
        )
        return Frontier(stash, excess, time, layout, units.strategy[option], parent, self, self.depth + 1,
                        self.unit_bytes)

    def __len__(self) -> int:
        return int(self.time.shape[0])

    @property
    def empty_of_plans(self) -> bool:
        return len(self) == 0

    def time_at(self, index: int) -> float:
        return float(self.time[index])

    def layout_at(self, index: int) -> int:
        return int(self.layout[index])

    def memory_at(self, index: int) -> float:
        """E_all of the plan at `index` in bytes, its terms rounded up to whole units."""
        return float((self.stash[index] + self.excess[index]) * self.unit_bytes)

    def best(self, budget_bytes: float, exit_time_by_layout: np.ndarray | None = None) -> int:
        """Index of the fastest plan with E_all = stash + excess within the budget (-1 if none);
        `exit_time_by_layout` adds a cost that depends on the last layer's layout (the p2p send)."""
        if len(self) == 0:
            return -1
        total = self.time if exit_time_by_layout is None else self.time + exit_time_by_layout[self.layout]
        feasible = (self.stash + self.excess) <= budget_units(budget_bytes, self.unit_bytes)
        if not feasible.any():
            return -1
        return int(np.argmin(np.where(feasible, total, np.inf)))

    def backtrack(self, index: int) -> list[int]:
        return backtrack(self, index)


def backtrack(frontier, index: int) -> list[int]:
    """Strategy indices of the plan at `index` of a frontier whose nodes hold, per plan, its last `strategy` and
    its `parent` index in the `previous` node (`depth` layers deep), first layer first."""
    chosen: list[int] = []
    while frontier is not None and frontier.depth > 0:
        chosen.append(int(frontier.strategy[index]))
        index = int(frontier.parent[index])
        frontier = frontier.previous
    return chosen[::-1]
