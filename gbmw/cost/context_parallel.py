"""What splitting each sample's tokens over c ranks costs beyond their share of the work (gbmw.space.strategy: the
`cp` and `ulysses` axes).

Under either, a rank computes, stashes and sends 1/c of every per-token quantity of the layer — its linear FLOPs,
activations, TP collectives, memory traffic — and, with causal attention split in load-balanced chunks (megatron-core
gives rank i the chunks i and 2c − 1 − i of 2c), 1/c of the attention work too: gbmw.cost.layer_cost prices the
layer at samples / c. What each adds on top, per layer and micro-batch, for the rank's `samples` samples at TP t:

* ring context parallelism (`cp`; Liu et al., "Ring Attention with Blockwise Transformers", 2023; megatron-core's
  p2p CP through Transformer Engine): the keys and values of the rank's chunk go round the ring in c − 1 steps, each a
  send of samples · KV / (c · t) bytes (KV: one sample's keys and values) to the next rank while the attention of the
  chunk held runs. Per step the exposed time is what the send takes beyond 1/c of the rank's attention-core compute,
  in forward; backward sends keys and values and their gradients (twice the bytes) beside twice the compute. The
  two chunks a rank holds at a time (its own and the one arriving) are a transient of 2 · samples · KV / (c · t);
* Ulysses (`ulysses`; Jacobs et al., "DeepSpeed Ulysses", 2023): an all-to-all over the u ranks turns the queries,
  keys and values of 1/u of the tokens and all heads into all tokens of 1/u of the heads before attention, and
  another turns the output back — samples · (Q + KV) / (u · t) and samples · Q / (u · t) bytes held by each rank,
  blocking; backward runs the same two the other way, a full recomputation runs the forward pair again.

Layers without self-attention (embeddings, heads) only take their share of the tokens.

gbmw's runtime runs the ring's blocks as plain matmuls in fp32 (gbmw.adapters.runtime.context_parallel), not through
a flash kernel: each (query chunk, key chunk) block of L = s / 2c tokens is attended in tiles of R query rows whose
scores hold at most RUNTIME_SCORE_TILE_ELEMENTS, R = max(1, min(L, ⌊RUNTIME_SCORE_TILE_ELEMENTS / (b · H/t · L)⌋))
for b samples and H heads. A tile's backward holds four score-sized fp32 tensors at once (the probabilities, their
gradient, the gradient less the row dot and its product with the probabilities), which the runtime's transient adds
(`runtime_score_tile_bytes`). At 32k tokens on cp 4 whole blocks were 2 GiB a tensor for 32 heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gbmw.cost.comm import CommModel
from gbmw.space.strategy import Strategy
from gbmw.specs.model_spec import ModelSpec


RUNTIME_SCORE_TILE_ELEMENTS = 2**26
"""The most fp32 score elements one tile of gbmw's runtime ring holds (the module docstring; the runtime reads it)."""
RUNTIME_SCORE_TENSORS = 4
"""Score-sized fp32 tensors a tile's backward holds at once in gbmw's runtime ring."""


def runtime_score_tile_bytes(rows: float, heads: np.ndarray, chunk: float) -> np.ndarray:
    """Bytes of one tile's fp32 scores in gbmw's runtime ring: `rows` samples' rows of a `chunk`-token block over
    `heads` heads (per layer; 0 without attention), R query rows at a time (the module docstring)."""
    per_row = rows * heads * chunk
    tile = np.minimum(chunk, np.maximum(1, RUNTIME_SCORE_TILE_ELEMENTS // np.maximum(per_row, 1)))
    return per_row * tile * 4.0


@dataclass
class ContextParallelCosts:
    """Per-layer arrays for one micro-batch on one rank (zeros without a sequence axis)."""

    forward_s: np.ndarray
    """Communication in forward that compute does not hide (CP's ring beyond the attention, Ulysses' all-to-alls)."""
    backward_s: np.ndarray
    """The same in backward."""
    transient_bytes: np.ndarray
    """Buffers held only while the layer runs (CP's two key/value chunks in flight)."""


def context_parallel_costs(model: ModelSpec, strategy: Strategy, samples: float, comm: CommModel,
                           attention_core_forward_s: np.ndarray, framework: str = "megatron") -> ContextParallelCosts:
    """The module's terms for every layer of `model` under `strategy`, the rank holding `samples` samples' worth of
    tokens (its data-parallel samples over the sequence degree, as gbmw.cost.layer_cost counts them);
    `attention_core_forward_s` is each layer's attention-core forward time for the rank's share of the tokens;
    `framework` "gbmw-runtime" adds its ring's score tiles to the transient."""
    zeros = np.zeros(model.num_layers)
    axis, degree = strategy.sequence_axis, strategy.sequence_parallel_degree
    if axis is None:
        return ContextParallelCosts(zeros, zeros, zeros)
    arrays, tp = model.arrays, strategy.tp
    stride = strategy.stride(axis)
    share = samples / tp  # the rank's part of the micro-batch's tokens (`samples` is already 1/c of them), 1/t of the heads
    if axis == "cp":
        chunk = arrays.attention_key_value_bytes_per_sample * share
        send = np.array([comm.p2p_in_group_s(message, degree, stride) for message in chunk])
        steps = degree - 1
        compute_per_step = attention_core_forward_s / degree
        forward = steps * np.maximum(0.0, send - compute_per_step)
        backward = steps * np.maximum(0.0, 2 * send - 2 * compute_per_step)
        has_attention = chunk > 0
        transient = 2 * chunk
        if framework == "gbmw-runtime":
            heads = np.array([layer.attention_heads for layer in model.layers], float) / tp
            transient = transient + np.where(has_attention, RUNTIME_SCORE_TENSORS * runtime_score_tile_bytes(
                samples * degree, heads, model.sequence_length / (2 * degree)), 0.0)
        return ContextParallelCosts(np.where(has_attention, forward, 0.0), np.where(has_attention, backward, 0.0),
                                    transient)
    query, key_value = arrays.attention_query_bytes_per_sample * share, arrays.attention_key_value_bytes_per_sample * share
    per_byte = comm.alltoall_s(1.0, degree, stride) - comm.alltoall_s(0.0, degree, stride)
    latency = comm.alltoall_s(0.0, degree, stride)
    exchanges = np.where(query > 0, (2 * query + key_value) * per_byte + 2 * latency, 0.0)
    return ContextParallelCosts(exchanges, exchanges, zeros)
