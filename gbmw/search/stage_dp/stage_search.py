"""The fastest strategies for a pipeline stage at one setting: the stage DP of Eq. (4) (Algorithm 3, Appendix A)
over the layers of any stage [first, end), with every prefix's DP shared between the partitions a search
tries. Each layer's options come from the stage cost model (gbmw.cost.stage_cost), so the value the DP finds
for a stage is what `stage_estimate` computes for the strategies it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gbmw.cost.stage_cost import StageCosts
from gbmw.errors import GbmwError
from gbmw.search.stage_dp.grid_frontier import MAX_GRID_CELLS, GridFrontier, default_granularity_bytes
from gbmw.search.stage_dp.layer_options import LayerOptions
from gbmw.search.stage_dp.pareto import Frontier, budget_units
from gbmw.specs.model_spec import ModelSpec


@dataclass(frozen=True)
class StageSolution:
    strategy_indices: tuple[int, ...]
    objective_s: float
    """(m - 1) · C_no_grad_sync + C of the stage (its Eq. (9) share if it is the slowest)."""
    memory_bytes: float
    """E_all (Eq. (2)) of the stage as the DP counted it."""


class StageSearch:
    """Fastest strategies for any stage [first, end) at one setting (group size, micro-batch size,
    micro-batch count, schedule, budget), among the strategies `allowed` per layer.

    The DP of a stage walks its layers from the first; every prefix's table is kept in a trie
    keyed by what determines a layer's options — the layer's cost class (identical Transformer
    blocks share one), the stage's in-flight micro-batch count k, whether a previous stage sends
    to it, and the stage-local facts (the first layer reading a side input, a tied weight whose
    twin is in the stage). Partitions that share a stage prefix — the bi-objective adjustment's
    neighbours, stages of equal length in a homogeneous model — reuse it instead of recomputing.
    `exact=True` uses gbmw.search.stage_dp.pareto's frontier (memory in units, rounded up) instead of the grid; the planner's
    exact mode for per-layer variants is gbmw.search.exact.whole_plan_search instead."""

    def __init__(self, costs: StageCosts, budget_bytes: float, granularity_bytes: int | None = None,
                 allowed: np.ndarray | None = None, exact: bool = False):
        tables = costs.tables
        self.costs, self.tables, self.exact = costs, tables, exact
        self.m, self.pp = costs.num_micro_batches, costs.pp
        self.budget = float(budget_bytes)
        self.granularity = granularity_bytes or default_granularity_bytes(budget_bytes)
        if exact:
            budget_units(budget_bytes, self.granularity)  # fails early if the units overflow
        elif budget_bytes / self.granularity > MAX_GRID_CELLS:
            raise GbmwError(
                f"--granularity {self.granularity} B gives {budget_bytes / self.granularity:.0f} memory cells for a "
                f"{budget_bytes / 2**30:.1f} GiB budget; the grid allows {MAX_GRID_CELLS} — use at least "
                f"{int(np.ceil(budget_bytes / MAX_GRID_CELLS / 2**20))} MiB"
            )
        self.objective = (self.m - 1) * tables.time_no_grad_sync_s + tables.time_s
        self.allowed = np.ones(tables.time_s.shape, bool) if allowed is None else allowed
        self.layer_class = cost_classes(costs.model)
        self.layouts = tables.transition_fraction.shape[0]
        self.layout_data_parallel = np.zeros(self.layouts)
        self.layout_data_parallel[tables.layout] = tables.data_parallel
        self.layout_tp = np.ones(self.layouts, dtype=int)
        self.layout_tp[tables.layout] = tables.tp
        self.layout_shards = np.ones(self.layouts, dtype=int)
        self.layout_shards[tables.layout] = tables.boundary_shards
        self._nodes: dict[tuple, object] = {}
        self._zero_transition = np.zeros((self.layouts, self.layouts))

    def _root(self):
        if self.exact:
            return Frontier.empty(self.granularity)
        return GridFrontier.empty(self.layouts, self.budget, self.granularity)

    def _options(self, layer: int, stage_index: int, first_layer: int, side_first: bool) -> LayerOptions:
        """The allowed strategies of `layer` as a layer of stage `stage_index` that starts at `first_layer`."""
        tables, costs = self.tables, self.costs
        allowed = np.nonzero(self.allowed[:, layer])[0]
        time = self.objective[allowed, layer].copy()
        forward = tables.forward_memory_bytes[allowed, layer].copy()
        states = tables.model_state_bytes[allowed, layer].copy()
        if layer == first_layer and stage_index > 0:  # receive the activation, send its gradient back
            time += self.m * costs.strategies_send_s(layer, allowed)
            forward += costs.received_input_bytes(layer, allowed)
        if side_first:
            forward += costs.side_input_bytes(layer, allowed)
        if costs.twin_in_stage(layer, first_layer):
            states -= costs.tied_state_bytes(layer, allowed)
        return LayerOptions(strategy=allowed, time_s=time, states=states, forward=forward,
                            backward=tables.backward_memory_bytes[allowed, layer], layout=tables.layout[allowed],
                            in_flight=costs.in_flight[stage_index])

    def frontier(self, stage_index: int, first: int, end: int):
        """The DP after layers [first, end) as stage `stage_index` (shallower if it ran out of plans)."""
        costs = self.costs
        key: tuple = ("root", costs.in_flight[stage_index], stage_index > 0)
        node = self._nodes.get(key)
        if node is None:
            node = self._nodes[key] = self._root()
        seen_side = False
        for layer in range(first, end):
            side_first = costs.side_bytes[layer] > 0 and not seen_side
            seen_side = seen_side or costs.side_bytes[layer] > 0
            element = (self.layer_class[layer], layer == first, side_first, costs.twin_in_stage(layer, first))
            key = (id(node), element)
            child = self._nodes.get(key)
            if child is None:
                options = self._options(layer, stage_index, first, side_first)
                transition = self._zero_transition if layer == first else self.m * costs.transition_s(layer)
                child = self._nodes[key] = node.extend(options, transition, self.budget)
            node = child
            if node.empty_of_plans:
                break
        return node

    def _exit_time(self, stage_index: int, end: int) -> np.ndarray | None:
        """Per layout of the stage's last layer: sending the output to the next stage, every micro-batch."""
        if stage_index == self.pp - 1:
            return None
        return self.m * self.costs.boundary_send_s(end, self.layout_data_parallel, self.layout_tp, self.layout_shards)

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


_CLASSES_KEPT = 64
"""Models whose cost classes `cost_classes` keeps (the searches of one process use a few)."""
_classes: dict[int, tuple[ModelSpec, np.ndarray]] = {}


def cost_classes(model: ModelSpec) -> np.ndarray:
    """Layers with identical costs (every field but the name) share a class id. Read-only, kept per model object
    (each stage DP and exact search of a setting asks; comparing every field of every layer took ~1 ms a call for
    GPT-3 65B): the entry holds the model, so no other object takes its id while it is kept."""
    entry = _classes.get(id(model))
    if entry is None or entry[0] is not model:
        if len(_classes) >= _CLASSES_KEPT:
            _classes.pop(next(iter(_classes)))
        entry = _classes[id(model)] = (model, _cost_classes(model))
    return entry[1]


def _cost_classes(model: ModelSpec) -> np.ndarray:
    kinds = {layer.name: layer.kind for layer in model.layers}
    classes: dict[tuple, int] = {}
    ids = []
    for layer in model.layers:
        # frozen pydantic models (LayerTimings) hash by value
        signature = tuple(getattr(layer, name) for name in type(layer).model_fields if name not in ("name", "tied_to"))
        signature += (kinds.get(layer.tied_to),)
        ids.append(classes.setdefault(signature, len(classes)))
    ids = np.array(ids)
    ids.setflags(write=False)
    return ids
