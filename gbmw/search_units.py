"""The units the outer search (gbmw.planner) works in: a setting (PP degree, micro-batch size and count), a
candidate plan, the search's counters, and which strategies a layer's heads allow."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gbmw.space import Strategy
from gbmw.stage_cost import StrategyTables


@dataclass
class SearchStats:
    """What a search visited, for a plan's provenance."""

    settings_total: int = 0
    settings_searched: int = 0
    partitions_searched: int = 0
    search_s: float = 0.0


@dataclass
class Setting:
    """One point of the outer search: PP degree, micro-batch size and count, with the strategy tables and the
    throughput bound (gbmw.bounds) that order the settings."""

    pp: int
    micro_batch: int
    num_micro_batches: int
    tables: StrategyTables
    allowed: np.ndarray
    throughput_bound: float
    memory_bound: float | None = None
    """The memory-aware throughput bound (gbmw.stage_knapsack_bound), computed when first needed."""

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.num_micro_batches


@dataclass
class Candidate:
    """A whole plan a setting's search found, with its samples/s."""

    samples_per_s: float
    iteration_s: float
    setting: Setting
    partition: tuple[int, ...]
    strategies: tuple[Strategy, ...]


def tp_allowed(model, strategies: list[Strategy]) -> np.ndarray:
    """[strategy, layer]: TP degree divides the layer's attention (and key/value) heads."""
    tp = np.array([strategy.tp for strategy in strategies])[:, None]
    allowed = np.ones((len(strategies), model.num_layers), bool)
    for heads in (np.array([layer.attention_heads for layer in model.layers]),
                  np.array([layer.kv_heads for layer in model.layers])):
        allowed &= (heads[None, :] == 0) | (heads[None, :] % tp == 0)
    return allowed
