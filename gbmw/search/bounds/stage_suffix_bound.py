"""A lower bound of the no-sync time the rest of a stage's layers add, given the memory its partial plan has left:
the exact search (gbmw.search.exact.whole_plan_search) prunes the partial plans of a stage that ends at the last layer (the
last stage, and the only one when P = 1) by it.

A partial plan of the stage on layers [first, l) holds stash s (Σ O_ms + k · O_f so far). Any completion on layers
[l, L) under strategies s_j fits the budget E only if (the peak of Eq. (2) is at least the stash, Eq. (3) ≤ Eq. (2))

    Σ_{j∈[l,L)} mem(s_j, j) ≤ E − s,       mem = O_ms' + k · O_f

(O_ms' of gbmw.search.bounds.setting_bounds.least_state_bytes: a tied weight counted at most once), and then, for every λ ≥ 0, its
layers' no-sync time is at least (weak duality, as in gbmw.search.bounds.stage_knapsack_bound)

    Σ_j c_no_sync(s_j, j) ≥ Σ_{j∈[l,L)} min_s [c_no_sync(s, j) + λ · mem(s, j)] − λ · (E − s).

The sums over j are suffix sums, one row per λ of a fixed grid, computed once per stage; a partial plan's bound
is the best row at its own E − s, less a floating-point error bound ((4 L + 16) ulps of the magnitudes, as in
gbmw.search.bounds.stage_knapsack_bound).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from gbmw.cost.stage_cost import StageCosts
from gbmw.search.bounds.setting_bounds import least_state_bytes
from gbmw.search.bounds.stage_knapsack_bound import lambda_grid, trade_rates

_EPSILON = np.finfo(np.float64).eps


class SuffixTimeBound:
    """Lower bounds of the no-sync time of layers [l, L) of a stage keeping `in_flight` micro-batches, among the
    strategies `allowed` per layer, given the bytes left for their stash (see the module)."""

    def __init__(self, costs: StageCosts, allowed: np.ndarray, in_flight: float, time_s: np.ndarray | None = None):
        """`time_s` [strategy, layer]: the per-layer time to bound in place of the no-sync time (e.g. the last stage's
        joint m · c_no_sync + c_sync + c_step: any non-negative per-layer cost; the duality argument is the same)."""
        tables = costs.tables
        times = np.where(allowed, tables.time_no_grad_sync_s if time_s is None else time_s, np.inf)
        memory = least_state_bytes(costs) + in_flight * tables.forward_memory_bytes
        self.lambdas = lambda_grid(*trade_rates(times, memory))
        self.layers = times.shape[1]
        combined = np.where(allowed[None], times[None] + self.lambdas[:, None, None] * memory[None],
                            np.inf).min(axis=1)  # [λ, layer]
        self.suffix_s = np.concatenate((np.cumsum(combined[:, ::-1], axis=1)[:, ::-1],
                                        np.zeros((len(self.lambdas), 1))), axis=1)  # [λ, l]: Σ over [l, L)
        self.suffix_abs = np.concatenate((np.cumsum(np.abs(combined)[:, ::-1], axis=1)[:, ::-1],
                                          np.zeros((len(self.lambdas), 1))), axis=1)

    def lower_s(self, start: int, free_bytes: np.ndarray) -> np.ndarray:
        """Per partial plan: a lower bound of the no-sync time of layers [start, L) when their stash must fit in
        `free_bytes` (E − s) — inf-free: where nothing fits the bound is merely large, and λ · (E − s) < 0 grows
        with λ. Compiled (`_best_row`): per plan and λ the numpy expression

            (suffix_s[λ, start] − λ · free) − (4 L + 16) ε · (suffix_abs[λ, start] + |λ · free|),  max over λ."""
        free = np.ascontiguousarray(free_bytes, dtype=float).reshape(-1)
        return _best_row(self.suffix_s[:, start].copy(), self.suffix_abs[:, start].copy(), self.lambdas, free,
                         (4 * self.layers + 16) * _EPSILON)


@njit(cache=True)
def _best_row(suffix_s, suffix_abs, lambdas, free, coefficient):
    """`SuffixTimeBound.lower_s`'s max over λ, plan by plan (a NaN anywhere gives NaN, as numpy's max)."""
    result = np.empty(free.shape[0])
    for i in range(free.shape[0]):
        best = -np.inf
        for j in range(lambdas.shape[0]):
            penalty = lambdas[j] * free[i]
            value = (suffix_s[j] - penalty) - coefficient * (suffix_abs[j] + abs(penalty))
            if value > best or np.isnan(value):
                best = value
                if np.isnan(best):
                    break
        result[i] = best
    return result
