"""Dynamic programming over the layers of one pipeline stage (paper Sec. 4.1.2, Eq. 6; Appendix A, Alg. 2).

The DP keeps C(l, E) — the least time of the first l layers whose forward memory E_f (model
states plus stashed activations, Eq. 5) is E — on a memory grid of `granularity_bytes` cells. Its
state also holds the activation layout of the last layer's strategy, because the transition cost
R (Eq. 6) depends on it; strategies that share a layout share R, so the layout — not the strategy —
is the state, and the best predecessor of each (layout, memory) cell is found once per target
layout before the layer's strategies are tried (O(C² E + S E) per layer for C layouts, S
strategies, E memory cells, instead of O(S² E)).

Alg. 2 then raises E_fwd until the plan's overall memory E_all (Eq. 4: forward memory plus the
backward peak of CKPT recomputation and SDP gathers) exceeds the budget. Here each cell carries
its plan's exact forward memory and backward excess X in bytes (E_all = E_f + X, updated as
X' = max(X − O_f, O_b)); a plan that would exceed the budget is never stored, and the answer is the
fastest stored plan — one pass for the whole E_fwd sweep, never worse than Alg. 2. Because memory
is carried exactly, cells only decide which alternatives survive (one per cell), never whether a
plan fits: no rounding error accumulates over layers.

The 1F1B stash is folded into the forward memory: a stage with k micro-batches in flight stashes
O_ms + k · O_f per layer. `gbmw.pareto` holds an exact variant without cells (slower; for
checking). The layer loop is compiled with numba.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from gbmw.errors import GbmwError

MIB = 2**20
GRID_CELLS = 4096
"""Default grid: the budget in 4096 cells (4 MiB for 16 GiB, 20 MiB for 80 GiB), at least 1 MiB;
benchmarks/search_speed.py checks it finds plans as fast as 1 MiB cells on the bundled jobs."""
MAX_MEMORY_UNITS = 2**24
"""Memory units the exact engine's packed sort key allows."""
MAX_GRID_CELLS = 2**18
"""Cells per layout the grid may use (memory and time grow with it)."""


def default_granularity_bytes(budget_bytes: float) -> int:
    return max(MIB, int(np.ceil(budget_bytes / GRID_CELLS / MIB)) * MIB)


@njit(cache=True)
def extend_grid(
    time: np.ndarray, stash: np.ndarray, excess: np.ndarray, low: np.ndarray, high: np.ndarray,
    option_time: np.ndarray, option_stash: np.ndarray, option_forward: np.ndarray, option_backward: np.ndarray,
    option_layout: np.ndarray, transition: np.ndarray, budget: float, cell_bytes: float,
):
    """One layer of Eq. (6) on the grid. Cell (c, e) holds the fastest plan found whose last layer has
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
    per_cell = 1.0 / cell_bytes
    first, last = cells, -1
    for previous in range(layouts):
        if high[previous] >= low[previous]:
            first = min(first, low[previous])
            last = max(last, high[previous])
    if last < first:
        return new_time, new_stash, new_excess, new_option, new_previous, new_parent, new_low, new_high
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
            for e in range(low[previous], high[previous] + 1):
                value = time[previous, e] + cost
                if value < best[e]:
                    best[e] = value
                    best_previous[e] = previous
                    best_stash[e] = stash[previous, e]
                    best_excess[e] = excess[previous, e]
        for o in range(option_time.shape[0]):
            if option_layout[o] != target:
                continue
            # a plan in cell e has at least e cells of forward memory: beyond this bound it cannot fit
            limit = min(last, int((budget - option_stash[o]) * per_cell))
            for e in range(first, limit + 1):
                value = best[e]
                if value == np.inf:
                    continue
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


@njit(cache=True)
def dominated_options(time, stash, forward, backward, layout) -> np.ndarray:
    """Options another option of the same layout beats in every respect (no slower, no more stash or
    backward extra, at least as much forward stash — which lowers the excess). Ties keep the first."""
    n = time.shape[0]
    dropped = np.zeros(n, np.bool_)
    for i in range(n):
        for j in range(n):
            if i == j or dropped[j] or layout[i] != layout[j]:
                continue
            if (time[j] <= time[i] and stash[j] <= stash[i] and backward[j] <= backward[i]
                    and forward[j] >= forward[i]):
                dropped[i] = True
                break
    return dropped


@dataclass
class LayerOptions:
    """The candidate strategies of one layer at one stage position: time, and memory in bytes (the
    grid) or in whole units rounded up (the exact engine)."""

    strategy: np.ndarray
    """Index into the stage's strategy list."""
    time_s: np.ndarray
    stash: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    layout: np.ndarray

    def pruned(self) -> "LayerOptions":
        """Without the options another option of the same layout beats in every respect."""
        keep = ~dominated_options(self.time_s, self.stash, self.forward, self.backward, self.layout)
        return LayerOptions(*(getattr(self, f)[keep] for f in ("strategy", "time_s", "stash", "forward",
                                                                "backward", "layout")))


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


def to_units(values_bytes: np.ndarray, granularity_bytes: int) -> np.ndarray:
    """Round memory up to whole units (a plan the DP accepts never exceeds its budget)."""
    return np.ceil(np.asarray(values_bytes, dtype=np.float64) / granularity_bytes - 1e-9).astype(np.int64).clip(min=0)


def budget_units(budget_bytes: float, granularity_bytes: int) -> int:
    units = int(np.floor(budget_bytes / granularity_bytes))
    if units > MAX_MEMORY_UNITS:
        raise GbmwError(
            f"memory granularity {granularity_bytes} B gives {units} units for a {budget_bytes:.0f} B budget; "
            f"use a granularity of at least {int(np.ceil(budget_bytes / MAX_MEMORY_UNITS))} B"
        )
    return units


# ----------------------------------------------------------------------------------------------
# Stage problems at a pipeline setting, with every prefix's DP shared
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageSolution:
    strategy_indices: tuple[int, ...]
    objective_s: float
    """(m - 1) · C_no_grad_sync + C of the stage (its Eq. 9 share if it is the slowest)."""
    memory: float
    """E_all in bytes (grid) or units (exact engine)."""


class StageSearch:
    """Fastest strategies for any stage [first, end) at one setting (group size, micro-batch size,
    micro-batch count, schedule, budget).

    The DP of a stage walks its layers from the first; every prefix's table is kept in a trie
    keyed by what determines a layer's options — the layer's cost class (identical Transformer
    blocks share one), the stage's in-flight micro-batch count k, whether a previous stage sends
    to it, and the stage-local facts (the first layer reading a side input, a tied weight whose
    twin is in the stage). Partitions that share a stage prefix — the bi-objective adjustment's
    neighbours, stages of equal length in a homogeneous model — reuse it instead of recomputing.
    `exact=True` uses gbmw.pareto's frontier instead of the grid.
    """

    def __init__(self, model, tables, num_micro_batches: int, pp: int, budget_bytes: float, comm,
                 schedule: str = "1f1b", granularity_bytes: int | None = None,
                 allowed: np.ndarray | None = None, exact: bool = False):
        from gbmw.cost import in_flight_micro_batches, slice_gather_overhead_s

        self.model, self.tables, self.comm = model, tables, comm
        self.m, self.pp, self.schedule, self.exact = num_micro_batches, pp, schedule, exact
        self.granularity = granularity_bytes or default_granularity_bytes(budget_bytes)
        # the grid works in bytes with cells of `granularity`; the exact engine in whole units
        if not exact and budget_bytes / self.granularity > MAX_GRID_CELLS:
            raise GbmwError(
                f"--granularity {self.granularity} B gives {budget_bytes / self.granularity:.0f} memory cells for a "
                f"{budget_bytes / 2**30:.1f} GiB budget; the grid allows {MAX_GRID_CELLS} — use at least "
                f"{int(np.ceil(budget_bytes / MAX_GRID_CELLS / 2**20))} MiB"
            )
        self.budget = budget_units(budget_bytes, self.granularity) if exact else float(budget_bytes)
        self.group_size = tables.strategies[0].group_size
        self.in_flight = [in_flight_micro_batches(schedule, i, pp, num_micro_batches) for i in range(pp)]
        arrays = model.arrays
        self.objective = (num_micro_batches - 1) * tables.time_no_grad_sync_s + tables.time_s
        self.allowed = np.ones(tables.time_s.shape, bool) if allowed is None else allowed
        self.layer_class = cost_classes(model)
        self.boundary_bytes = arrays.boundary_activation_bytes_per_sample
        self.side_bytes = arrays.side_input_bytes_per_sample
        self.samples_per_device = tables.micro_batch / tables.data_parallel
        self.layouts = tables.transition_fraction.shape[0]
        self.transition_overhead_s = slice_gather_overhead_s(model, comm)
        self.layout_data_parallel = np.zeros(self.layouts)
        self.layout_data_parallel[tables.layout] = tables.data_parallel
        self._nodes: dict[tuple, object] = {}
        self._zero_transition = np.zeros((self.layouts, self.layouts))

    def _root(self):
        if self.exact:
            from gbmw.pareto import Frontier

            return Frontier.empty()
        return GridFrontier.empty(self.layouts, self.budget, self.granularity)

    # ------------------------------------------------------------------ one layer's options

    def _options(self, layer: int, k: int, first_with_previous: bool, side_first: bool, tied_in_stage: bool):
        tables = self.tables
        allowed = np.nonzero(self.allowed[:, layer])[0]
        time = self.objective[allowed, layer].copy()
        forward = tables.forward_memory_bytes[allowed, layer].copy()
        states = tables.model_state_bytes[allowed, layer].copy()
        samples = self.samples_per_device[allowed]
        if first_with_previous:  # receive the activation, send its gradient back: every micro-batch
            message = (self.boundary_bytes[layer] + self.side_bytes[layer]) * samples
            time += self.m * np.array([self._send_s(b) for b in message])
        if side_first:
            forward += self.side_bytes[layer] * samples
        if tied_in_stage:
            states -= (self.model.arrays.tied_parameter_count[layer] / tables.tp[allowed]
                       * tables.state_bytes_per_parameter[allowed])
        backward = tables.backward_memory_bytes[allowed, layer]
        if self.exact:
            forward, states, backward = (to_units(v, self.granularity) for v in (forward, states, backward))
        options = LayerOptions(
            strategy=allowed,
            time_s=time,
            stash=states + k * forward,
            forward=forward,
            backward=backward,
            layout=tables.layout[allowed],
        )
        return options.pruned()

    def _send_s(self, message_bytes: float) -> float:
        """One stage-to-stage transfer, as the estimator prices it (cost.pipeline_send_s)."""
        from gbmw.cost import pipeline_send_s

        return pipeline_send_s(self.model, self.comm, message_bytes, self.group_size)

    def _transition(self, layer: int) -> np.ndarray:
        message = self.tables.transition_fraction * self.boundary_bytes[layer] * self.tables.micro_batch
        if self.group_size == 1:
            return np.zeros_like(message)
        bandwidth, latency = self.comm.exchange_rate(self.group_size)
        # cost.transition_time_s, vectorised
        return self.m * np.where(message > 0, message / bandwidth + latency + self.transition_overhead_s, 0.0)

    # ------------------------------------------------------------------ stages

    def frontier(self, stage_index: int, first: int, end: int):
        """The DP after layers [first, end) as stage `stage_index` (shallower if it ran out of plans)."""
        k = self.in_flight[stage_index]
        has_previous = stage_index > 0
        key: tuple = ("root", k, has_previous)
        node = self._nodes.get(key)
        if node is None:
            node = self._nodes[key] = self._root()
        tied_targets = self.model.arrays.tied_to_index
        seen_side = False
        for layer in range(first, end):
            side_first = self.side_bytes[layer] > 0 and not seen_side
            seen_side = seen_side or self.side_bytes[layer] > 0
            tied_in_stage = bool(tied_targets[layer] >= first) if tied_targets[layer] >= 0 else False
            element = (self.layer_class[layer], layer == first, side_first, tied_in_stage)
            key = (id(node), element)
            child = self._nodes.get(key)
            if child is None:
                options = self._options(layer, k, layer == first and has_previous, side_first, tied_in_stage)
                transition = self._zero_transition if layer == first else self._transition(layer)
                child = self._nodes[key] = node.extend(options, transition, self.budget)
            node = child
            if node.empty_of_plans:
                break
        return node

    def _exit_time(self, stage_index: int, end: int) -> np.ndarray | None:
        if stage_index == self.pp - 1:
            return None
        message = (self.boundary_bytes[end] + self.side_bytes[end]) * self.tables.micro_batch / self.layout_data_parallel
        return self.m * np.array([self._send_s(b) for b in message])

    def solve(self, stage_index: int, first: int, end: int) -> StageSolution | None:
        """The fastest strategies for layers [first, end) as stage `stage_index` that fit, or None."""
        node = self.frontier(stage_index, first, end)
        if node.depth != end - first:
            return None
        exit_time = self._exit_time(stage_index, end)
        index = node.best(self.budget, exit_time)
        if index < 0:
            return None
        objective = node.time_at(index) + (exit_time[node.layout_at(index)] if exit_time is not None else 0.0)
        return StageSolution(tuple(node.backtrack(index)), objective, node.memory_at(index))


def cost_classes(model) -> np.ndarray:
    """Layers with identical costs (every field but the name) share a class id."""
    kinds = {layer.name: layer.kind for layer in model.layers}
    classes: dict[tuple, int] = {}
    ids = []
    for layer in model.layers:
        # frozen pydantic models (LayerTimings) hash by value
        signature = tuple(getattr(layer, name) for name in type(layer).model_fields if name not in ("name", "tied_to"))
        signature += (kinds.get(layer.tied_to),)
        ids.append(classes.setdefault(signature, len(classes)))
    return np.array(ids)
