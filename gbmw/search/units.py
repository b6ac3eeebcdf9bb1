"""The units the outer search (gbmw.search.planner) works in: a setting (PP degree, micro-batch size and count), a
candidate plan, the search's counters, and which strategies a layer's heads allow."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gbmw.cost.stage_cost import StrategyTables
from gbmw.space.stock_partitions import accounted_blocks_per_stage
from gbmw.space.strategy import Strategy


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
    throughput bound (gbmw.search.bounds.setting_bounds) that order the settings."""

    pp: int
    micro_batch: int
    num_micro_batches: int
    tables: StrategyTables
    allowed: np.ndarray
    throughput_bound: float
    virtual_stages: int = 1
    """Model chunks per pipeline device (> 1: interleaved 1F1B, on targets that run it)."""
    memory_bound: float | None = None
    """The memory-aware throughput bound (gbmw.search.bounds.stage_knapsack_bound), computed when first needed."""

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


def used_somewhere(strategies: list[Strategy], allowed: np.ndarray) -> tuple[list[Strategy], np.ndarray]:
    """The strategies some layer allows (`allowed`: [strategy, layer]) and their rows: one no layer allows — an EP
    degree dividing no layer's experts, a TP degree no layer's heads — is never chosen, so its cost tables are not
    built (Mixtral-8x7B on 64 devices: +ep16 … +ep64 for its 8 experts)."""
    anywhere = allowed.any(axis=1)
    return [strategy for strategy, used in zip(strategies, anywhere) if used], allowed[anywhere]


def micro_batch_sizes(fixed_batch: int | None, max_global_batch: int) -> list[int]:
    """The micro-batch sizes the outer search tries: the divisors of a fixed global batch, or the powers of two and
    three times powers of two up to the largest global batch the sweep may reach."""
    if fixed_batch is not None:
        return [b for b in range(1, fixed_batch + 1) if fixed_batch % b == 0]
    limit = max_global_batch
    sizes = sorted({2**e for e in range(limit.bit_length())} | {3 * 2**e for e in range(limit.bit_length())})
    return [b for b in sizes if b <= limit]


def micro_batch_counts(micro_batch: int, pp: int, fixed_batch: int | None, max_global_batch: int, accumulate: bool,
                       schedule: str, exact: bool = False) -> list[int]:
    """The micro-batch counts tried with `micro_batch` at pipeline degree `pp`: one pass without a pipeline when
    not accumulating; the fixed batch's count; else powers of two (under 1F1B: those below pp, and the largest;
    under GPipe, whose stash grows with every micro-batch, all of them, and with `exact` the largest too)."""
    if pp == 1 and not accumulate:
        return [1] if fixed_batch in (None, micro_batch) else []
    if fixed_batch is not None:
        return [fixed_batch // micro_batch]
    largest = max_global_batch // micro_batch
    if largest < 1:
        return []
    counts = {2**e for e in range(largest.bit_length()) if 2**e <= largest}
    if schedule == "1f1b":
        counts = {m for m in counts if m < pp} | {largest}
    elif exact:
        counts.add(largest)
    return sorted(counts)


def counts_to_try(micro_batch: int, pp: int, fixed_batch: int | None, max_global_batch: int, accumulate: bool,
                  schedule: str, exact: bool, interleaves: bool, batch_multiple: int = 1,
                  rule=None) -> list[tuple[int, bool]]:
    """(count, for interleaved pipelines only) pairs the outer search tries with `micro_batch` at pipeline degree
    `pp`: `micro_batch_counts` and, where `interleaves`, `interleaved_only_counts`; a sweep keeps the global batches
    that are multiples of `batch_multiple` (`on_batch_grid`). `rule(global batch, pp)`, where given, is a framework's
    one count per batch for pp > 1: a fixed batch runs its count, a sweep each batch b · m it gives m for."""
    if rule is not None and pp > 1:
        batches = [fixed_batch] if fixed_batch is not None else range(micro_batch, max_global_batch + 1, micro_batch)
        return [(batch // micro_batch, False) for batch in batches if batch % micro_batch == 0
                and (fixed_batch is not None or batch % batch_multiple == 0) and batch // micro_batch == rule(batch, pp)]
    counts = micro_batch_counts(micro_batch, pp, fixed_batch, max_global_batch, accumulate, schedule, exact)
    extra = interleaved_only_counts(micro_batch, pp, fixed_batch, max_global_batch) if interleaves else []
    if fixed_batch is None:
        counts = on_batch_grid(counts, micro_batch, max_global_batch, batch_multiple)
        extra = [count for count in extra if micro_batch * count % batch_multiple == 0]
    return [(count, False) for count in counts] + [(count, True) for count in extra if count not in counts]


def on_batch_grid(counts: list[int], micro_batch: int, max_global_batch: int, multiple: int) -> list[int]:
    """`counts` (micro_batch_counts of a sweep) restricted to global batches b · m that are multiples of `multiple` (a
    study's or a framework's batch grid); where they held the largest count, the largest on the grid too (B / T grows
    with m where the stash no longer does: gbmw.search.planner's module docstring)."""
    if multiple <= 1:
        return counts
    kept = {count for count in counts if micro_batch * count % multiple == 0}
    if counts and counts[-1] == max_global_batch // micro_batch:
        kept.add(next((m for m in range(counts[-1], 0, -1) if micro_batch * m % multiple == 0), 0))
    return sorted(kept - {0})


def interleaved_only_counts(micro_batch: int, pp: int, fixed_batch: int | None, max_global_batch: int) -> list[int]:
    """The counts a 1F1B batch sweep adds for interleaved pipelines alone (v > 1), beside `micro_batch_counts`: pp,
    and the largest power of two where the largest count is not a multiple of pp.

    Interleaving needs a multiple of pp micro-batches. Its stash, min(2(pp − i − 1) + (v − 1)·pp + 1, m·v) chunks
    on stage i (gbmw.cost.pipeline_schedules.in_flight_micro_batches), is smaller at m = pp than at any larger multiple,
    where it no longer grows (m·v ≥ 2·pp·v ≥ (v + 1)·pp − 1), while B / T grows with m (Eq. (9), as for 1F1B): of the
    larger multiples in the sweep the largest power of two (every power of two ≥ pp is a multiple) is the one to
    try. Plain 1F1B at these counts has the stash it has at the largest count and a lower B / T: not needed."""
    largest = max_global_batch // micro_batch
    if fixed_batch is not None or pp < 2 or largest < pp:
        return []
    return sorted({pp} | ({2 ** (largest.bit_length() - 1)} if largest % pp else set()))


def virtual_stage_choices(interleaves: bool, blocks: int, pp: int, count: int) -> list[int]:
    """Model chunks per device to try: 1, and where the pipeline `interleaves` (a target running Megatron's virtual
    pipeline stages with 1F1B, pp ≥ 2, a micro-batch count that is a multiple of pp, as gbmw.space.targets accepts) every
    v > 1 that splits the even share of the `blocks` Transformer blocks per stage into equal chunks, or the share of
    megatron-core's split counting the embedding and the loss as layers (gbmw.space.stock_partitions)."""
    if not interleaves or pp < 2 or count % pp:
        return [1]
    shares = {blocks // pp} if blocks % pp == 0 else set()
    if accounted_blocks_per_stage(blocks, pp) is not None:  # the embedding and the loss counted as layers
        shares.add((blocks + 2) // pp)
    return [1] + [v for v in range(2, max(shares, default=0) + 1) if any(share % v == 0 for share in shares)]
