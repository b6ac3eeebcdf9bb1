"""Transformer Engine's FP8 training as megatron-core runs it (precision fp8, issue 28): what it adds to a layer's time
and memory beyond its GEMMs, which gbmw.cost.layer_cost prices at the device's FP8 GEMM rate
(`ClusterSpec.linear_flops`). What is cast and stashed, read in TransformerEngine and megatron-core, is in
gbmw.specs.transformer_layers' docstring; here:

* the casts are memory-bound passes at the device's measured bandwidth: the inputs and output gradients of each
  micro-batch (the LayerSpec's TP-split cast traffic), and each weight once per iteration — its bf16 value read, its
  row- and column-wise FP8 data written — charged to the last micro-batch;
* the weights' FP8 copies stay between micro-batches (transformer_engine/pytorch/module/linear.py
  `_linear_forward_impl`: `weight_quantizer.set_usage(rowwise=True, columnwise=...)`, `quantize_weight(...,
  cache=...)`; megatron-core's `TELinear.forward` passes `is_first_microbatch`): 2 bytes per weight, TP- and EP-local,
  never sharded by ZeRO.
"""

from __future__ import annotations

import numpy as np

from gbmw.space.strategy import Strategy
from gbmw.specs.cluster_spec import ClusterSpec
from gbmw.specs.model_spec import ModelSpec

FP8_WEIGHT_CAST_BYTES = 4
"""Bytes one weight's cast moves per iteration: its bf16 value read, its row- and column-wise FP8 data written."""
FP8_WEIGHT_COPY_BYTES = 2
"""Bytes Transformer Engine holds per FP8 weight between micro-batches: its row- and column-wise FP8 data."""


def rank_fp8_parameters(model: ModelSpec, strategy: Strategy) -> np.ndarray:
    """[layer]: the FP8 weights one rank holds under `strategy` — TP-local (those TP leaves whole, whole), the routed
    experts' at 1/ep (their biases, where a model has them, counted with the experts' FP8 weights)."""
    arrays, tp = model.arrays, strategy.tp
    whole = arrays.fp8_tp_replicated_parameter_count  # duplicated on every TP rank (latent attention's down-projections)
    experts = np.minimum(arrays.expert_parameter_count, arrays.fp8_parameter_count) / tp
    return (arrays.fp8_parameter_count - whole) / tp + whole - experts + experts / strategy.ep


def fp8_weight_copy_bytes(precision: str) -> int:
    """Bytes held per FP8 weight under `precision` (0 unless fp8)."""
    return FP8_WEIGHT_COPY_BYTES if precision == "fp8" else 0


def fp8_cast_s(model: ModelSpec, precision: str, cluster: ClusterSpec, samples: float, tp: int,
               fp8_parameters: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, once per iteration) per layer: Transformer Engine's FP8 casts at the device's memory
    bandwidth — the inputs and output gradients of `samples` samples at TP `tp` (TP-split traffic of the LayerSpec),
    and the rank's `fp8_parameters` weights, read in bf16 (2 bytes) and written row- and column-wise in FP8 (2 bytes).
    Zeros unless the precision is fp8 (gbmw.specs.transformer_layers says what is cast and what is left out)."""
    if precision != "fp8":
        zeros = np.zeros(model.num_layers)
        return zeros, zeros, zeros
    arrays, bandwidth = model.arrays, cluster.memory_bandwidth_bytes_per_s
    forward = arrays.fp8_forward_cast_traffic_bytes_per_sample * samples / tp / bandwidth
    backward = arrays.fp8_backward_cast_traffic_bytes_per_sample * samples / tp / bandwidth
    return forward, backward, fp8_parameters * FP8_WEIGHT_CAST_BYTES / bandwidth
