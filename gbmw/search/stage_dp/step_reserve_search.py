"""The stage DP with the optimizer step's reserve kept free (gbmw.cost.framework_memory.step_reserve_bytes), as the
default mode's planner runs it for every stage (gbmw.search.planner)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gbmw.cost.framework_memory import ADAM_CHUNK_ELEMENTS
from gbmw.cost.stage_cost import StageCosts
from gbmw.search.stage_dp.stage_search import StageSearch


class StepReserveSearch:
    """The stage DP with the optimizer step's reserve (gbmw.cost.framework_memory.step_reserve_bytes: 4 bytes × the
    parameters the stage steps, one chunk at most) kept free. Where every choice of strategies for the stage's
    layers steps at most a chunk, the reserve is a per-layer term, priced exactly as held memory; where every
    choice steps at least a chunk, it is the chunk's, a constant taken off the budget. Between the two (a stage
    whose choices straddle a chunk) both are solved and the faster answer kept: each over-counts the reserve only
    where it is wrong (the per-layer term where the stage steps more than a chunk, the chunk where it steps less),
    so either answer fits, and the plan is the faster of two safe ones (the exact mode, gbmw.search.exact.whole_plan_search,
    counts the reserve exactly)."""

    def __init__(self, costs: StageCosts, budget_bytes: float, granularity_bytes, allowed: np.ndarray, exact: bool):
        self.costs, self.budget, self.granularity, self.allowed, self.exact = (
            costs, budget_bytes, granularity_bytes, allowed, exact)
        tables = costs.tables
        self.per_parameter = tables.step_temporary_bytes_per_parameter
        self.most = np.where(allowed, tables.optimizer_parameters, 0.0).max(axis=0)
        self._searches: dict[str, StageSearch | None] = {}

    def _search(self, regime: str) -> StageSearch | None:
        if regime not in self._searches:
            tables, costs = self.costs.tables, self.costs
            budget, searched = self.budget, tables
            if regime == "per-layer":
                searched = replace(
                    tables, model_state_bytes=tables.model_state_bytes + self.per_parameter * tables.optimizer_parameters,
                    state_bytes_per_parameter=tables.state_bytes_per_parameter + self.per_parameter / tables.optimizer_shards)
            else:
                budget -= self.per_parameter * ADAM_CHUNK_ELEMENTS
            search_costs = StageCosts(costs.model, searched, costs.pp, costs.num_micro_batches, costs.schedule,
                                      costs.comm, costs.virtual_stages, costs.scatter_gather, costs.blocking_p2p)
            self._searches[regime] = (StageSearch(search_costs, budget, self.granularity, self.allowed, self.exact)
                                      if budget > 0 else None)
        return self._searches[regime]

    def regimes(self, first: int, end: int) -> tuple[str, ...]:
        """The reserve's regimes solved for layers [first, end) (see the class)."""
        if self.per_parameter == 0:
            return ("constant",)
        if self.most[first:end].sum() <= ADAM_CHUNK_ELEMENTS:
            return ("per-layer",)
        least = np.where(self.allowed, self.costs.tables.optimizer_parameters, np.inf).min(axis=0)
        return ("constant",) if least[first:end].sum() >= ADAM_CHUNK_ELEMENTS else ("per-layer", "constant")

    def solve(self, index: int, first: int, end: int):
        solutions = [search.solve(index, first, end) for search in map(self._search, self.regimes(first, end))
                     if search is not None]
        solutions = [solution for solution in solutions if solution is not None]
        return min(solutions, key=lambda solution: solution.objective_s, default=None)
