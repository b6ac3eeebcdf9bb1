"""How stock frameworks split a model's layers into pipeline stages — closed-form rules the planner searches
for the targets (gbmw.space.targets) and the emitters name (a PipelineModule's `partition_method`, Megatron's
`--decoder-first/last-pipeline-num-layers`).

DeepSpeed's PipelineModule: `uniform` (equal layer counts, the remainder on the first stages) and
`parameters` / `type:REGEX` (the contiguous split whose stage weights differ least). Megatron: an equal
number of Transformer blocks per stage, or (megatron-core) other block counts on the first and last stages
with the middle stages equal, or (megatron-core, `--account-for-embedding-in-pipeline-split
--account-for-loss-in-pipeline-split`) an equal split of the blocks plus two layers standing for the embedding
and the loss; embeddings sit on the stage of the block that follows them, heads on the stage of the block
before them. tests/test_deepspeed_adapter.py checks the DeepSpeed rules against
DeepSpeed's own functions.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from numba import njit

from gbmw.errors import PlanError
from gbmw.space.strategy import is_power_of_two
from gbmw.specs.model_spec import ModelSpec


def uniform_first_partition(layers: int, stages: int) -> list[int]:
    """Equal layer counts with the remainder on the FIRST stages: what DeepSpeed's PipelineModule
    `partition_method="uniform"` gives (stages beyond the layer count get none)."""
    if layers <= stages:
        return [1 if stage < layers else 0 for stage in range(stages)]
    base, extra = divmod(layers, stages)
    return [base + (1 if stage < extra else 0) for stage in range(stages)]


@njit(cache=True)
def _least_spread_cuts(prefix: np.ndarray, stages: int) -> np.ndarray:
    """Stage boundaries of the contiguous split whose stage sums have the least spread (largest minus
    smallest), built stage by stage keeping one best split per (layers, stages) and preferring the
    latest cut among equals."""
    layers = prefix.shape[0] - 1
    spread = np.full((layers + 1, stages + 1), np.inf)
    largest = np.full((layers + 1, stages + 1), np.inf)
    smallest = np.full((layers + 1, stages + 1), np.inf)
    cut = np.zeros((layers + 1, stages + 1), np.int64)
    spread[0, 0] = 0.0
    largest[0, 0] = 0.0
    for end in range(1, layers + 1):
        for stage in range(1, min(end, stages) + 1):
            for start in range(end - 1, -1, -1):  # latest cut first; strict < keeps it among equals
                size = prefix[end] - prefix[start]
                high = max(largest[start, stage - 1], size)
                low = min(smallest[start, stage - 1], size)
                if high - low < spread[end, stage]:
                    spread[end, stage], largest[end, stage], smallest[end, stage] = high - low, high, low
                    cut[end, stage] = start
    bounds = np.zeros(stages + 1, np.int64)
    bounds[stages] = layers
    for stage in range(stages, 0, -1):
        bounds[stage - 1] = cut[bounds[stage], stage]
    return bounds


def least_spread_partition(weights, stages: int) -> list[int]:
    """Layers per stage of the split whose stage weight sums differ least: what DeepSpeed's
    PipelineModule gives for `partition_method="parameters"` (weights = parameters per layer) and
    `"type:REGEX"` (weights = 1 for matching layers)."""
    weights = np.asarray(weights, np.float64)
    if len(weights) <= stages:
        return uniform_first_partition(len(weights), stages)
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    bounds = _least_spread_cuts(prefix, stages)
    return [int(b - a) for a, b in zip(bounds[:-1], bounds[1:])]


# ----------------------------------------------------------------------------------------------
# Megatron: blocks per stage
# ----------------------------------------------------------------------------------------------


def blocks_per_stage(model: ModelSpec, partition: Sequence[int]) -> list[int]:
    """Transformer blocks on each stage of `partition` (embeddings and heads not counted)."""
    counts, first = [], 0
    for size in partition:
        counts.append(sum(layer.is_block for layer in model.layers[first:first + size]))
        first += size
    return counts


def megatron_stage_partition(model: ModelSpec, blocks: Sequence[int]) -> list[int]:
    """Layers per stage when stage i builds `blocks[i]` Transformer blocks, as Megatron places the rest: an
    embedding on the stage of the block that follows it, any other non-block layer (the head) on the stage
    of the block before it."""
    block_indices = [index for index, layer in enumerate(model.layers) if layer.is_block]
    if sum(blocks) != len(block_indices):
        raise PlanError(f"{list(blocks)} blocks per stage, but {model.name} has {len(block_indices)} Transformer blocks")
    stage_of, index = {}, 0
    for stage, count in enumerate(blocks):
        for _ in range(count):
            stage_of[block_indices[index]] = stage
            index += 1
    counts = [0] * len(blocks)
    previous_stage = 0
    for position, layer in enumerate(model.layers):
        if position in stage_of:
            stage = previous_stage = stage_of[position]
        elif layer.kind == "embedding":
            following = [stage_of[i] for i in block_indices if i > position]
            stage = following[0] if following else previous_stage
        else:
            stage = previous_stage
        counts[stage] += 1
    return counts


def megatron_partition(model: ModelSpec, pp: int) -> list[int]:
    """Megatron's even split: the same number of Transformer blocks on every stage."""
    blocks = sum(layer.is_block for layer in model.layers)
    if blocks % pp:
        divisors = [p for p in range(1, blocks + 1) if blocks % p == 0 and is_power_of_two(p)]
        raise PlanError(
            f"{model.name} has {blocks} Transformer blocks, not divisible by pp={pp}; an even split needs pp in {divisors}"
        )
    return megatron_stage_partition(model, [blocks // pp] * pp)


def is_first_last_split(model: ModelSpec, partition: Sequence[int]) -> bool:
    """megatron-core's uneven pipeline (--decoder-first/last-pipeline-num-layers): every stage has a block, only
    the first and last stages differ from an equal share of blocks, and the other layers sit where Megatron
    places them (`megatron_stage_partition`)."""
    counts = blocks_per_stage(model, partition)
    return (all(count >= 1 for count in counts) and len(set(counts[1:-1])) <= 1
            and megatron_stage_partition(model, counts) == list(partition))


def accounted_blocks_per_stage(num_blocks: int, pp: int) -> list[int] | None:
    """Transformer blocks per stage under megatron-core's `--account-for-embedding-in-pipeline-split
    --account-for-loss-in-pipeline-split` (`get_num_layers_to_build`, transformer_block.py): the blocks plus one
    layer for the embedding and one for the loss split equally, the first stage building one block fewer (its
    first chunk holds the embedding) and the last one fewer (its last chunk holds the loss). None where
    num_blocks + 2 is not a multiple of pp or a stage would build no block."""
    if pp < 2 or (num_blocks + 2) % pp or (num_blocks + 2) // pp < 2:
        return None
    share = (num_blocks + 2) // pp
    return [share - 1] + [share] * (pp - 2) + [share - 1]


def interleaved_split(blocks: Sequence[int], virtual_stages: int) -> str | None:
    """How stages holding `blocks` Transformer blocks build `virtual_stages` equal chunks each, as megatron-core's
    interleaved pipeline does: `even` (the same multiple of v blocks on every stage), `accounted` (the split of
    `accounted_blocks_per_stage` with (blocks + 2) / pp a multiple of v), or None where they cannot."""
    blocks = list(blocks)
    if len(set(blocks)) == 1 and blocks[0] % virtual_stages == 0:
        return "even"
    if blocks == accounted_blocks_per_stage(sum(blocks), len(blocks)) and (blocks[0] + 1) % virtual_stages == 0:
        return "accounted"
    return None


def accounted_candidates(model: ModelSpec, pp: int) -> list[tuple[int, ...]]:
    """megatron-core's split with the embedding and the loss each counted as a layer (`accounted_blocks_per_stage`),
    or none where it does not divide."""
    counts = accounted_blocks_per_stage(sum(layer.is_block for layer in model.layers), pp)
    return [] if counts is None else [tuple(megatron_stage_partition(model, counts))]


def first_last_candidates(model: ModelSpec, pp: int, spread: int = 4) -> list[tuple[int, ...]]:
    """The uneven pipelines the planner tries for megatron-core: the first and last stages take up to `spread`
    blocks more or fewer than an even share, the middle stages an equal share of the rest (embeddings and
    heads ride along, as `megatron_stage_partition` places them)."""
    blocks = sum(layer.is_block for layer in model.layers)
    even = max(1, blocks // pp)
    window = range(max(1, even - spread), even + spread + 1)
    result = []
    for first in window:
        for last in window:
            middle = blocks - first - last
            if first + last > blocks:
                continue
            if pp == 2 and middle == 0:
                result.append(tuple(megatron_stage_partition(model, [first, last])))
            elif pp > 2 and middle >= pp - 2 and middle % (pp - 2) == 0:
                share = middle // (pp - 2)
                result.append(tuple(megatron_stage_partition(model, [first, *([share] * (pp - 2)), last])))
    return result


def _even_or_none(model: ModelSpec, pp: int) -> list[tuple[int, ...]]:
    try:
        return [tuple(megatron_partition(model, pp))]
    except PlanError:
        return []


PARTITION_RULES: dict[str, Callable[[ModelSpec, int], list[tuple[int, ...]]]] = {
    "uniform": lambda model, pp: [tuple(uniform_first_partition(model.num_layers, pp))],
    "parameters": lambda model, pp: [tuple(least_spread_partition(model.arrays.parameter_count, pp))],
    "even": _even_or_none,
    "first-last": first_last_candidates,
    "accounted": accounted_candidates,
}
"""Closed-form partition rules by name → (model, pp) → the partitions the planner tries (none if the rule
cannot split this model over pp stages)."""
RULE_DESCRIPTIONS = {
    "uniform": "DeepSpeed's `uniform` split",
    "parameters": "DeepSpeed's `parameters` split",
    "even": "Megatron's even split of Transformer blocks",
    "first-last": "megatron-core's uneven first/last stages with equal middles",
    "accounted": "megatron-core's split counting the embedding and the loss as layers",
}
