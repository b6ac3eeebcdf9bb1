"""Pipeline partitions: time-balanced, memory-balanced, and the bi-objective adjustment between them
(paper Sec. 4.2: Algorithm 2 with Eq. (5)–(8); Appendix B).

A partition `p` lists the layers of each stage; Eq. (5) costs it by its slowest stage. Its balance degrees (Eq. (6)) are
alpha_t = 1 - max_i C_i / Σ C_i and alpha_m = 1 - max_i O_i / Σ O_i. The time-balanced partition p_t
minimises the slowest stage; the memory-balanced p_m minimises the largest stage memory, where
1F1B makes stage i hold min(P - i, m) micro-batches of activations, so later stages take more layers.
The bi-objective adjustment starts from p_m and moves one boundary layer of the slowest stage to a
neighbour while three limits hold (Sec. 4.2.2, Algorithm 2 line 14), which keep it between p_m and p_t (Eq. (7),
proved in Appendix B as Eq. (8)): (1) no stage gets slower than the slowest stage was,
(2) every stage fits the budget, (3) no stage needs more memory than the worst stage of p_t.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import njit


@njit(cache=True)
def min_max_partition(fixed: np.ndarray, scaled: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The contiguous split of the layers into len(scale) non-empty stages minimising the largest stage
    cost, exactly, by dynamic programming; stage i holding layers [a, b) costs
    Σ fixed[a:b] + scale[i] · Σ scaled[a:b]. Returns the layer count of each stage."""
    layers, stages = fixed.shape[0], scale.shape[0]
    fixed_prefix = np.zeros(layers + 1)
    scaled_prefix = np.zeros(layers + 1)
    for layer in range(layers):
        fixed_prefix[layer + 1] = fixed_prefix[layer] + fixed[layer]
        scaled_prefix[layer + 1] = scaled_prefix[layer] + scaled[layer]
    best = np.full((stages + 1, layers + 1), np.inf)
    choice = np.zeros((stages + 1, layers + 1), np.int64)
    best[0, 0] = 0.0
    for i in range(1, stages + 1):
        for end in range(i, layers - (stages - i) + 1):
            for start in range(i - 1, end):
                cost = (fixed_prefix[end] - fixed_prefix[start]) + scale[i - 1] * (scaled_prefix[end] - scaled_prefix[start])
                if best[i - 1, start] > cost:
                    cost = best[i - 1, start]
                if cost < best[i, end]:
                    best[i, end] = cost
                    choice[i, end] = start
    counts = np.zeros(stages, np.int64)
    end = layers
    for i in range(stages, 0, -1):
        start = choice[i, end]
        counts[i - 1] = end - start
        end = start
    return counts


def _split(fixed: np.ndarray, scaled: np.ndarray, scale: list[float]) -> list[int]:
    if len(scale) > len(fixed):
        raise ValueError(f"cannot split {len(fixed)} layers into {len(scale)} non-empty stages")
    counts = min_max_partition(np.asarray(fixed, np.float64), np.asarray(scaled, np.float64),
                               np.asarray(scale, np.float64))
    return [int(c) for c in counts]


def time_balanced_partition(layer_time_s: np.ndarray, stages: int) -> list[int]:
    """p_t: minimise the slowest stage's summed layer time."""
    return _split(layer_time_s, np.zeros(len(layer_time_s)), [0.0] * stages)


def memory_balanced_partition(
    layer_state_bytes: np.ndarray, layer_activation_bytes: np.ndarray, in_flight: list[int]
) -> list[int]:
    """p_m: minimise the largest stage memory Σ (states + k_i · activations), k_i in flight at stage i."""
    return _split(layer_state_bytes, layer_activation_bytes, [float(k) for k in in_flight])


def lightest_memory_balanced_partition(tables, allowed: np.ndarray, in_flight: list[float]) -> tuple[int, ...]:
    """p_m of a setting's strategy tables (gbmw.cost.stage_cost.StrategyTables), each layer at its lightest model
    states and stashed activations among the strategies `allowed` (the stage DP picks the strategies afterwards)."""
    masked = np.where(allowed, 1.0, np.inf)
    states = (tables.model_state_bytes * masked).min(axis=0)
    activations = (tables.forward_memory_bytes * masked).min(axis=0)
    return tuple(memory_balanced_partition(states, activations, in_flight))


def balance_degrees(stage_time_s: list[float], stage_memory_bytes: list[float]) -> tuple[float, float]:
    """(alpha_t, alpha_m) of Eq. (6)."""
    return (1 - max(stage_time_s) / sum(stage_time_s), 1 - max(stage_memory_bytes) / sum(stage_memory_bytes))


@dataclass(frozen=True)
class StageOutcome:
    """What the search found for one partition: per-stage time and memory (None if a stage does not fit)."""

    partition: tuple[int, ...]
    stage_time_s: tuple[float, ...] | None
    stage_memory_bytes: tuple[float, ...] | None

    @property
    def fits(self) -> bool:
        return self.stage_time_s is not None


def neighbours_of_slowest(partition: tuple[int, ...], stage_time_s: tuple[float, ...]) -> list[tuple[int, ...]]:
    """Partitions that move one boundary layer of the slowest stage to an adjacent stage (Algorithm 2, line 13)."""
    slowest = int(np.argmax(stage_time_s))
    result = []
    if partition[slowest] > 1:
        for neighbour in (slowest - 1, slowest + 1):
            if 0 <= neighbour < len(partition):
                moved = list(partition)
                moved[slowest] -= 1
                moved[neighbour] += 1
                result.append(tuple(moved))
    return result


def bi_objective_adjustment(
    search: Callable[[tuple[int, ...]], StageOutcome],
    memory_balanced: tuple[int, ...],
    time_balanced_memory_bytes: float | None,
    budget_bytes: float,
    max_steps: int = 256,
) -> list[StageOutcome]:
    """Algorithm 2, lines 9–15: from p_m, repeatedly move a boundary layer off the slowest stage while
    Appendix B's three limits hold; returns every partition searched, in order.

    `search(partition)` runs the per-stage DP for a partition. `time_balanced_memory_bytes` is the
    largest stage memory of p_t (limit 3), None when p_t does not fit (the budget is then the limit).
    """
    outcomes = [search(memory_balanced)]
    queue = [outcomes[0]]
    seen = {memory_balanced}
    memory_limit = budget_bytes if time_balanced_memory_bytes is None else min(budget_bytes, time_balanced_memory_bytes)
    while queue and len(outcomes) < max_steps:
        current = queue.pop()
        if not current.fits:
            break
        slowest_time = max(current.stage_time_s)
        accepted: StageOutcome | None = None
        for candidate in neighbours_of_slowest(current.partition, current.stage_time_s):
            if candidate in seen:
                continue
            seen.add(candidate)
            outcome = search(candidate)
            outcomes.append(outcome)
            valid = (
                outcome.fits
                and max(outcome.stage_time_s) < slowest_time  # limit 1 (strictly: progress)
                and max(outcome.stage_memory_bytes) <= memory_limit  # limits 2 and 3
            )
            if valid and (accepted is None or max(outcome.stage_time_s) < max(accepted.stage_time_s)):
                accepted = outcome
        if accepted is not None:
            queue.append(accepted)
    return outcomes
