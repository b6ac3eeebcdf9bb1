"""Bounds that let the planner skip settings without searching them (its best-first order and early stop):
no partition of a setting can fit, and an upper bound of the throughput any plan of a setting reaches."""

from __future__ import annotations

import numpy as np

from gbmw.cost.framework_memory import ADAM_CHUNK_ELEMENTS
from gbmw.cost.stage_cost import StageCosts

BOUND_SLACK = 1e-12
"""Relative slack on the throughput bound: it sums the same non-negative times in another order than Eq. (9) does,
a few ulps (≈1e-16 relative each, fewer than 10^3 terms) from the exact sum, far below this."""


def least_state_bytes(costs: StageCosts) -> np.ndarray:
    """[strategy, layer]: the model states a layer holds in ANY stage — less its tied weight where it has a twin, as
    if the twin shared its stage (then the twin's layer holds the weight, under its own strategy, which may be
    lighter), so that sums of them bound a stage's states from below."""
    return _less_tied(costs, costs.tables.model_state_bytes, costs.tied_state_bytes)


def least_optimizer_parameters(costs: StageCosts) -> np.ndarray:
    """[strategy, layer]: the parameters a layer's optimizer steps in ANY stage (a tied weight as in
    `least_state_bytes`)."""
    return _less_tied(costs, costs.tables.optimizer_parameters, costs.tied_optimizer_parameters)


def _less_tied(costs: StageCosts, values: np.ndarray, tied) -> np.ndarray:
    values = values.copy()
    strategies = np.arange(values.shape[0])
    for layer in np.nonzero(costs.tied_to >= 0)[0]:
        values[:, layer] -= tied(int(layer), strategies)
    return values


def cannot_fit(costs: StageCosts, allowed: np.ndarray, budget_bytes: float) -> bool:
    """True if no partition can fit: some layer alone, or the stages' average, exceeds the budget (model states
    by `least_state_bytes`; every stage holds at least one micro-batch's activations, its peak at least each
    layer's states, stash, backward extra and the step reserve of that layer's parameters)."""
    tables = costs.tables
    masked = np.where(allowed, 1.0, np.inf)
    states = least_state_bytes(costs)
    reserve = tables.step_temporary_bytes_per_parameter * np.minimum(least_optimizer_parameters(costs),
                                                                     ADAM_CHUNK_ELEMENTS)  # step_reserve_bytes
    alone = (states + tables.forward_memory_bytes + tables.backward_memory_bytes + reserve) * masked
    lightest = ((states + tables.forward_memory_bytes) * masked).min(axis=0)
    return bool(alone.min(axis=0).max() > budget_bytes or lightest.sum() > costs.pp * budget_bytes)


def least_total_no_sync_s(costs: StageCosts, allowed: np.ndarray, budget_bytes: float) -> float:
    """The knapsack part of `throughput_upper_bound`: a lower bound of the stages' summed no-sync time over the plans
    whose memory fits all stages together (inf where none can). Under 1F1B it does not depend on the micro-batch
    count (each stage holds at least one micro-batch's activations whatever m is), so a sweep computes it once per
    micro-batch size and pipeline degree; under GPipe every micro-batch is held."""
    tables = costs.tables
    no_sync = np.where(allowed, tables.time_no_grad_sync_s, np.inf)
    k = costs.num_micro_batches if costs.schedule == "gpipe" else 1
    memory = least_state_bytes(costs) + k * tables.forward_memory_bytes
    return knapsack_lower_bound(no_sync, memory, costs.pp * budget_bytes)


def throughput_upper_bound(costs: StageCosts, allowed: np.ndarray, budget_bytes: float,
                           total_no_sync_s: float | None = None) -> float:
    """B / (a lower bound of Eq. (9) over every plan of this setting that fits).

    The iteration time (gbmw.cost.pipeline_schedules; synchronisation and optimizer steps only add to it) is at least
    (m - 1) · Σ_i C_no_sync(M_i) / P + Σ_l min c_no_sync(l) + the slowest stage's synchronisation (at least the
    stages' average and at least one layer's least): the stages' no-sync times sum to at
    least the least total no-sync time of plans whose memory fits all stages together —
    Σ_l (O_ms + O_f) ≤ P · E, since every stage holds at least one micro-batch, with O_ms from `least_state_bytes`
    (a tied weight counted once) — which the Lagrangian dual of that knapsack bounds from below
    (`least_total_no_sync_s`; pass its value as `total_no_sync_s` where it is known for these costs' tables).
    """
    tables, pp, count = costs.tables, costs.pp, costs.num_micro_batches
    no_sync = np.where(allowed, tables.time_no_grad_sync_s, np.inf)
    total_no_sync = (least_total_no_sync_s(costs, allowed, budget_bytes) if total_no_sync_s is None
                     else total_no_sync_s)
    slowest_stage = max(total_no_sync / pp, no_sync.min(axis=0).max())
    # Synchronisation: the slowest stage's is at least the stages' average and at least any one layer's least (a
    # stage's is the sum over its layers of their non-negative extras). The optimizer step is left out: a stage
    # holding both tied layers steps the tied weight once, so per-layer step times do not bound it from below.
    sync_extra = np.where(allowed, tables.time_s - tables.time_no_grad_sync_s, np.inf).min(axis=0)
    slowest_sync = max(sync_extra.sum() / pp, sync_extra.max())
    # fill and drain: Σ_i C_i' (interleaved over v chunks: Σ_i C_i' / v + (1 − 1/v) · max_i C_i', gbmw.cost.pipeline_schedules)
    chunks = costs.virtual_stages
    fill_and_drain = no_sync.min(axis=0).sum() / chunks + (1 - 1 / chunks) * slowest_stage
    lower = (count - 1) * slowest_stage + fill_and_drain + slowest_sync
    return tables.micro_batch * count / lower * (1 + BOUND_SLACK) if np.isfinite(lower) else 0.0


def knapsack_lower_bound(time: np.ndarray, memory: np.ndarray, capacity: float, iterations: int = 40) -> float:
    """A lower bound of min Σ_l time[s_l, l] subject to Σ_l memory[s_l, l] ≤ capacity (one choice s_l
    per layer; inf time = not allowed): the Lagrangian dual max_λ Σ_l min_s (time + λ·memory) − λ·capacity,
    maximised by bisection on its subgradient. inf when even the lightest choices exceed the capacity."""
    allowed = np.isfinite(time)
    if np.where(allowed, memory, np.inf).min(axis=0).sum() > capacity:
        return np.inf

    def dual(weight: float) -> tuple[float, float]:
        combined = np.where(allowed, time + weight * memory, np.inf)
        pick = combined.argmin(axis=0)
        columns = np.arange(time.shape[1])
        used = memory[pick, columns].sum()
        return combined[pick, columns].sum() - weight * capacity, used - capacity

    value, excess = dual(0.0)
    if excess <= 0:
        return value
    low, high = 0.0, 1e-12
    while dual(high)[1] > 0:
        low, high = high, high * 4
    best = max(value, dual(high)[0])
    for _ in range(iterations):
        middle = (low + high) / 2
        value, excess = dual(middle)
        best = max(best, value)
        if excess > 0:
            low = middle
        else:
            high = middle
    return best
