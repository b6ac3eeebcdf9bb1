"""Shape-dependent matmul time: tile and wave quantization (issue 12, point 2: small micro-batches and narrow
TP-split layers run below the device's large-matmul rate).

A GPU computes a matmul's (rows × columns) output in tiles, one thread block per tile, and runs the blocks in
waves of one block per streaming multiprocessor (NVIDIA, "Matrix Multiplication Background User's Guide", Sec.
"Tile Quantization" and "Wave Quantization", docs.nvidia.com/deeplearning/performance/dl-performance-matrix-
multiplication). A partly filled tile costs as much as a full one, and a partly filled last wave as much as a
full one, so a matmul takes

    waves × (time of one full tile),   waves = ceil(ceil(rows / T_r) · ceil(columns / T_c) / SMs)

and runs at the fraction rows · columns / (waves · SMs · T_r · T_c) of the rate a matmul filling every wave
reaches — the device's measured `sustained_tflops`, taken on large square matmuls. A ViT-Huge micro-batch of one
image (197 tokens) through the 1280 → 1280 output projection fills 2 × 10 tiles of 128 × 128 on a 72-SM TITAN
RTX: one wave at 21 % of the rate. T_r = T_c = 128 is the tile cuBLAS's large-matmul kernels use; cuBLAS may
pick a smaller tile (or split the inner dimension) for a small output, so this bounds the rate from above only
through the waves: it is a model of the loss, not a measurement of it.

Backward runs two matmuls per forward one: the input's gradient (rows × inner, over the output columns) and the
weight's gradient (inner × columns, over the rows).
"""

from __future__ import annotations

import numpy as np

from gbmw.specs.cluster_spec import ClusterSpec
from gbmw.specs.model_spec import ModelSpec

TILE_ROWS = 128
TILE_COLUMNS = 128


def wave_efficiency(rows: np.ndarray, columns: np.ndarray, multiprocessors: int) -> np.ndarray:
    """The fraction of the full-wave matmul rate an output of `rows` × `columns` reaches (1 where it is empty)."""
    rows, columns = np.asarray(rows, dtype=float), np.asarray(columns, dtype=float)
    tiles = np.ceil(rows / TILE_ROWS) * np.ceil(columns / TILE_COLUMNS)
    waves = np.ceil(tiles / multiprocessors)
    filled = np.maximum(waves, 1.0) * multiprocessors * TILE_ROWS * TILE_COLUMNS
    return np.where(rows * columns > 0, rows * columns / filled, 1.0)


def matmul_time_s(rows, columns, inner, flops_per_s: float, multiprocessors: int) -> np.ndarray:
    """One (rows × inner) @ (inner × columns) matmul at the device's full-wave rate `flops_per_s`, slowed by its
    waves (module docstring)."""
    flops = 2.0 * np.asarray(rows, dtype=float) * np.asarray(columns, dtype=float) * np.asarray(inner, dtype=float)
    return flops / (flops_per_s * wave_efficiency(rows, columns, multiprocessors))


def linear_wave_loss_s(rows: np.ndarray, out_features: np.ndarray, in_features: np.ndarray,
                       flops_per_s: float | np.ndarray, multiprocessors: int) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) time the linear matmuls lose to their waves beyond their FLOPs at the full rate, summed
    over the last axis (a layer's matmuls; zero-sized entries are padding). Arrays of one shape: rows of the input,
    and the weight's output and input features as one device holds them (TP-split); the full rate may be one per
    layer (shaped to broadcast: an FP8 layer's matmuls at the FP8 rate)."""
    full_rate = 2.0 * rows * out_features * in_features / flops_per_s
    forward = matmul_time_s(rows, out_features, in_features, flops_per_s, multiprocessors)
    input_gradient = matmul_time_s(rows, in_features, out_features, flops_per_s, multiprocessors)
    weight_gradient = matmul_time_s(in_features, out_features, rows, flops_per_s, multiprocessors)
    return ((forward - full_rate).sum(axis=-1), (input_gradient + weight_gradient - 2 * full_rate).sum(axis=-1))


def layer_wave_loss_s(model: ModelSpec, cluster: ClusterSpec, precision: str, samples: float, tp: int,
                      sequence_parallel: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) per layer: what the linear matmuls of `samples` samples at TP degree `tp` lose to their
    tile waves beyond their FLOPs at the sustained rate (`linear_wave_loss_s`); 0 for profiled layers and on devices
    without a multiprocessor count. A linear whole on every TP rank runs the rank's share of the rows under
    `sequence_parallel`."""
    multiprocessors = cluster.device.multiprocessors
    arrays = model.arrays
    if multiprocessors is None:
        return np.zeros(model.num_layers), np.zeros(model.num_layers)
    whole = arrays.matmul_replicated
    out_features = np.where(arrays.matmul_splits_out, arrays.matmul_out_features / tp, arrays.matmul_out_features)
    in_features = np.where(arrays.matmul_splits_out | whole, arrays.matmul_in_features, arrays.matmul_in_features / tp)
    # [layer, 1]: a layer with FP8 linears runs its matmuls at the FP8 rate (a head's at bf16's)
    rate = np.where(arrays.fp8_forward_flops_per_sample > 0, cluster.linear_flops(precision),
                    cluster.sustained_flops(precision))[:, None]
    rows = arrays.matmul_rows_per_sample * samples / np.where(whole & sequence_parallel, tp, 1)
    forward, backward = linear_wave_loss_s(rows, out_features, in_features, rate, multiprocessors)
    analytic = ~arrays.has_measured_time
    return forward * analytic, backward * analytic
