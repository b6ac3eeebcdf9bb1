"""Bounds that let the planner skip settings without searching them (its best-first order and early stop):
no partition of a setting can fit, and an upper bound of the throughput any plan of a setting reaches."""

from __future__ import annotations

import numpy as np
from numba import njit

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
    maximised by bisection on its subgradient. inf when even the lightest choices exceed the capacity.

    Compiled (`_knapsack_dual_bound`): the numpy form it replaced, float for float (tests/test_search_bounds.py keeps
    it as the reference) — each λ's terms, the first least strategy per layer (`argmin`) and the sums as numpy forms
    them (`_numpy_sum`)."""
    time, memory = np.ascontiguousarray(time, float), np.ascontiguousarray(memory, float)
    return float(_knapsack_dual_bound(time, memory, float(capacity), iterations))


@njit(cache=True)
def _block_sum(values, first, count):
    """numpy's sum of at most 128 terms values[first:first + count]: below 8 one by one from 0, else in eight
    interleaved partial sums, combined pairwise, then the rest one by one."""
    if count < 8:
        total = 0.0
        for i in range(count):
            total += values[first + i]
        return total
    partial = np.empty(8)
    for j in range(8):
        partial[j] = values[first + j]
    i = 8
    while i < count - count % 8:
        for j in range(8):
            partial[j] += values[first + i + j]
        i += 8
    total = ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5])
                                                                       + (partial[6] + partial[7]))
    while i < count:
        total += values[first + i]
        i += 1
    return total


@njit(cache=True)
def _pairwise_sum(values, first, count):
    """numpy's pairwise summation of values[first:first + count] (`np.add.reduce` of a contiguous float64 row):
    blocks of at most 128 terms by `_block_sum`; a longer range is the sum of its two halves (the first a multiple of
    8 long), each summed apart — walked with an explicit stack (numba does not cache recursive functions safely)."""
    if count <= 128:
        return _block_sum(values, first, count)
    firsts, counts, stages = np.empty(64, np.int64), np.empty(64, np.int64), np.empty(64, np.int64)
    results = np.empty(64)
    top, done = 0, 0
    firsts[0], counts[0], stages[0] = first, count, 0
    while top >= 0:
        start, length = firsts[top], counts[top]
        if length <= 128:
            results[done] = _block_sum(values, start, length)
            done += 1
            top -= 1
            continue
        half = length // 2
        half -= half % 8
        if stages[top] == 0:  # the first half
            stages[top] = 1
            top += 1
            firsts[top], counts[top], stages[top] = start, half, 0
        elif stages[top] == 1:  # then the second
            stages[top] = 2
            top += 1
            firsts[top], counts[top], stages[top] = start + half, length - half, 0
        else:  # both summed: first + second
            results[done - 2] = results[done - 2] + results[done - 1]
            done -= 1
            top -= 1
    return results[0]


@njit(cache=True)
def _numpy_sum(values):
    """`values.sum()` for a contiguous float64 vector, as numpy adds it."""
    return _pairwise_sum(values, 0, values.shape[0])


@njit(cache=True)
def _dual(time, memory, weight, capacity, picked_time, picked_memory):
    """(Σ_l min_s (time + weight · memory) − weight · capacity, Σ_l memory of those choices − capacity): the first
    least choice per layer as `argmin` takes it (inf where not allowed; a NaN wins)."""
    strategies, layers = time.shape
    for layer in range(layers):
        best, pick = np.inf, 0
        for s in range(strategies):
            value = time[s, layer] + weight * memory[s, layer] if np.isfinite(time[s, layer]) else np.inf
            if s == 0 or value < best or (np.isnan(value) and not np.isnan(best)):
                best, pick = value, s
            if np.isnan(best):
                break
        picked_time[layer], picked_memory[layer] = best, memory[pick, layer]
    return _numpy_sum(picked_time) - weight * capacity, _numpy_sum(picked_memory) - capacity


@njit(cache=True)
def _knapsack_dual_bound(time, memory, capacity, iterations):
    """`knapsack_lower_bound` (its numpy form, step for step)."""
    strategies, layers = time.shape
    lightest = np.empty(layers)
    for layer in range(layers):
        least = np.inf
        for s in range(strategies):
            value = memory[s, layer] if np.isfinite(time[s, layer]) else np.inf
            if value < least or np.isnan(value):
                least = value
                if np.isnan(least):
                    break
        lightest[layer] = least
    if _numpy_sum(lightest) > capacity:
        return np.inf
    picked_time, picked_memory = np.empty(layers), np.empty(layers)
    value, excess = _dual(time, memory, 0.0, capacity, picked_time, picked_memory)
    if excess <= 0:
        return value
    low, high = 0.0, 1e-12
    while _dual(time, memory, high, capacity, picked_time, picked_memory)[1] > 0:
        low, high = high, high * 4
    best = value
    candidate = _dual(time, memory, high, capacity, picked_time, picked_memory)[0]
    if candidate > best:  # Python's max(value, candidate): the first unless the second is greater
        best = candidate
    for _ in range(iterations):
        middle = (low + high) / 2
        value, excess = _dual(time, memory, middle, capacity, picked_time, picked_memory)
        if value > best:
            best = value
        if excess > 0:
            low = middle
        else:
            high = middle
    return best
