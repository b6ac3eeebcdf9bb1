"""The stage DP on a memory grid (Eq. (4); Algorithm 3, Appendix A), compiled with numba.

The DP keeps C(l, E) — the least time of the first l layers whose forward memory E_f (model states plus
stashed activations, Eq. (3)) is E — on a memory grid of `cell_bytes` cells. Its state also holds the
activation layout of the last layer's strategy, because the transition cost R of Eq. (4) depends on it;
strategies that share a layout share R, so the layout — not the strategy — is the state, and the best
predecessor of each (layout, memory) cell is found once per target layout before the layer's strategies
are tried (O(C² E + S E) per layer for C layouts, S strategies, E memory cells, instead of O(S² E)).

Algorithm 3 then raises E_fwd until the plan's overall memory E_all (Eq. (2): forward memory plus the
backward peak of CKPT recomputation and SDP gathers) exceeds the budget. Here each cell carries its plan's
forward memory and backward excess X in bytes (E_all = E_f + X, updated as X' = max(X − O_f, O_b)); a plan
that would exceed the budget is never stored, and the answer is the fastest stored plan — one pass for the
whole E_fwd sweep, never worse than Algorithm 3. Because memory is carried in bytes, cells only decide
which alternatives survive (one per cell), never whether a plan fits. gbmw.search.stage_dp.pareto solves the same problem
without cells.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from gbmw.search.stage_dp.layer_options import LayerOptions

MIB = 2**20
GRID_CELLS = 4096
"""Default grid: the budget in 4096 cells (4 MiB for 16 GiB, 20 MiB for 80 GiB), at least 1 MiB;
benchmarks/search_speed.py checks it finds plans as fast as 1 MiB cells on the bundled jobs."""
MAX_GRID_CELLS = 2**18
"""Cells per layout the grid may use (memory and time grow with it)."""


INCUMBENT_GRID_CELLS = 1024
"""The grid of the pass that only finds the exact search's incumbent (a feasible plan whose speed prunes): a quarter
of GRID_CELLS. Any feasible incumbent keeps the exact search exact; a coarser grid finds it sooner (GPT-3 175B on
1024 devices: benchmarks/search_scale.py)."""


def default_granularity_bytes(budget_bytes: float, cells: int = GRID_CELLS) -> int:
    return max(MIB, int(np.ceil(budget_bytes / cells / MIB)) * MIB)



@njit(cache=True)
def extend_grid(
    time: np.ndarray, stash: np.ndarray, excess: np.ndarray, low: np.ndarray, high: np.ndarray,
    option_time: np.ndarray, option_stash: np.ndarray, option_forward: np.ndarray, option_backward: np.ndarray,
    option_layout: np.ndarray, transition: np.ndarray, budget: float, cell_bytes: float,
):
    """One layer of Eq. (4) on the grid. Cell (c, e) holds the fastest plan found whose last layer has
    layout c and whose forward memory falls in [e, e+1) cells, with that plan's exact forward memory
    `stash` and backward excess `excess` in bytes; cells of layout c outside [low[c], high[c]] are
    empty. Returns the new (time, stash, excess, option, previous layout, previous cell, low, high)."""
    layouts, cells = time.shape
    new_time = np.full((layouts, cells), np.inf)
    # the other arrays are read only where new_time is finite, i.e. where they were written
    new_stash = np.empty((layouts, cells))
    new_excess = np.empty((layouts, cells))
    new_option = np.empty((layouts, cells), np.int32)
    new_previous = np.empty((layouts, cells), np.int32)
    new_parent = np.empty((layouts, cells), np.int32)
    new_low = np.full(layouts, cells, np.int64)
    new_high = np.full(layouts, -1, np.int64)
    best = np.empty(cells)
    best_previous = np.empty(cells, np.int32)
    best_stash = np.empty(cells)
    best_excess = np.empty(cells)
    reached = np.empty(cells, np.int64)
    per_cell = 1.0 / cell_bytes
    first, last = cells, -1
    for previous in range(layouts):
        if high[previous] >= low[previous]:
            first = min(first, low[previous])
            last = max(last, high[previous])
    if last < first:
        return new_time, new_stash, new_excess, new_option, new_previous, new_parent, new_low, new_high
    # the cells each previous layout holds a plan in (often a small share of its range): only those are read below
    held = np.empty((layouts, cells), np.int64)
    held_count = np.zeros(layouts, np.int64)
    for previous in range(layouts):
        for e in range(low[previous], high[previous] + 1):
            if time[previous, e] != np.inf:
                held[previous, held_count[previous]] = e
                held_count[previous] += 1
    for target in range(layouts):
        has_option = False
        for o in range(option_time.shape[0]):
            if option_layout[o] == target:
                has_option = True
        if not has_option:
            continue
        # The best predecessor of every memory cell for this target layout (R depends on layouts only).
        best[first:last + 1] = np.inf
        for previous in range(layouts):
            cost = transition[previous, target]
            for k in range(held_count[previous]):
                e = held[previous, k]
                value = time[previous, e] + cost
                if value < best[e]:
                    best[e] = value
                    best_previous[e] = previous
                    best_stash[e] = stash[previous, e]
                    best_excess[e] = excess[previous, e]
        # the cells some plan reaches (often a small share of them): each option is tried on those alone
        count = 0
        for e in range(first, last + 1):
            if best[e] != np.inf:
                reached[count] = e
                count += 1
        for o in range(option_time.shape[0]):
            if option_layout[o] != target:
                continue
            # a plan in cell e has at least e cells of forward memory: beyond this bound it cannot fit
            limit = min(last, int((budget - option_stash[o]) * per_cell))
            for k in range(count):
                e = reached[k]
                if e > limit:
                    break
                value = best[e]
                filled = best_stash[e] + option_stash[o]
                x = best_excess[e] - option_forward[o]
                if x < option_backward[o]:
                    x = option_backward[o]
                if filled + x > budget:
                    continue
                cell = int(filled * per_cell)
                value += option_time[o]
                if value < new_time[target, cell]:
                    new_time[target, cell] = value
                    new_stash[target, cell] = filled
                    new_excess[target, cell] = x
                    new_option[target, cell] = o
                    new_previous[target, cell] = best_previous[e]
                    new_parent[target, cell] = e
                    if cell < new_low[target]:
                        new_low[target] = cell
                    if cell > new_high[target]:
                        new_high[target] = cell
    return new_time, new_stash, new_excess, new_option, new_previous, new_parent, new_low, new_high


class GridFrontier:
    """C(l, ·) after some layers of a stage, per layout and memory cell, with back-pointers."""

    __slots__ = ("time", "stash", "excess", "option", "previous_layout", "parent_cell", "low", "high", "strategy",
                 "previous", "depth", "cell_bytes")

    def __init__(self, time, stash, excess, option, previous_layout, parent_cell, low, high, strategy,
                 previous: "GridFrontier | None", depth: int, cell_bytes: float):
        self.time, self.stash, self.excess, self.option = time, stash, excess, option
        self.previous_layout, self.parent_cell, self.low, self.high = previous_layout, parent_cell, low, high
        self.strategy, self.previous, self.depth, self.cell_bytes = strategy, previous, depth, cell_bytes

    @classmethod
    def empty(cls, layouts: int, budget_bytes: float, cell_bytes: float) -> "GridFrontier":
        """Before the first layer: the empty plan in cell (layout 0, 0); R from it is 0."""
        cells = int(budget_bytes // cell_bytes) + 1
        time = np.full((layouts, cells), np.inf)
        time[0, 0] = 0.0
        low, high = np.full(layouts, cells, np.int64), np.full(layouts, -1, np.int64)
        low[0] = high[0] = 0
        zeros = np.zeros(time.shape)
        return cls(time, zeros, zeros.copy(), None, None, None, low, high, None, None, 0, float(cell_bytes))

    def extend(self, options: LayerOptions, transition_s: np.ndarray, budget_bytes: float) -> "GridFrontier":
        """C(l + 1, ·) from C(l, ·) with the layer's `options`; `transition_s[a, b]` is R from layout a to b
        (zero for the first layer of a stage)."""
        options = options.pruned()
        time, stash, excess, option, previous_layout, parent, low, high = extend_grid(
            self.time, self.stash, self.excess, self.low, self.high, options.time_s, options.stash,
            options.forward, options.backward, options.layout, transition_s, float(budget_bytes),
            self.cell_bytes,
        )
        return GridFrontier(time, stash, excess, option, previous_layout, parent, low, high, options, self,
                            self.depth + 1, self.cell_bytes)

    @property
    def empty_of_plans(self) -> bool:
        return bool((self.high < self.low).all())

    def best(self, budget: float, exit_time_by_layout: np.ndarray | None = None) -> int:
        """Flat index (layout · cells + cell) of the fastest plan (every kept plan fits), or -1."""
        total = self.time if exit_time_by_layout is None else self.time + exit_time_by_layout[:, None]
        index = int(np.argmin(total))
        return index if np.isfinite(total.flat[index]) else -1

    def cells(self) -> int:
        return self.time.shape[1]

    def time_at(self, index: int) -> float:
        return float(self.time.flat[index])

    def layout_at(self, index: int) -> int:
        return index // self.cells()

    def memory_at(self, index: int) -> float:
        """E_all of the plan at `index`, in bytes."""
        return float(self.stash.flat[index] + self.excess.flat[index])

    def backtrack(self, index: int) -> list[int]:
        """Strategy indices of the plan at `index`, first layer first."""
        layout, cell = divmod(index, self.cells())
        chosen: list[int] = []
        node: GridFrontier | None = self
        while node is not None and node.depth > 0:
            option = int(node.option[layout, cell])
            chosen.append(int(node.strategy.strategy[option]))
            layout, cell = int(node.previous_layout[layout, cell]), int(node.parent_cell[layout, cell])
            node = node.previous
        return chosen[::-1]
