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

Two scaling recipes (`fp8_recipe`; megatron-core's `--fp8-recipe`, megatron/core/fp8_utils.py `get_fp8_recipe`):

* `delayed` (DelayedScaling): a cast scales by the amax history of earlier iterations and records the tensor's amax
  as it writes it — one pass; a LayerNormLinear's norm writes FP8 itself. Its once-per-iteration reduction of the
  amax buffers is left out (a few kilobytes).
* `current` (Float8CurrentScaling, `--fp8-recipe tensorwise`; TransformerEngine v2.9 pytorch/csrc/quantizer.cpp
  `Float8CurrentScalingQuantizer::quantize_impl`): every cast first computes the tensor's amax
  (`nvte_compute_amax_with_config`) — one more read of d bytes per element — then the scale, then casts; a norm
  feeding a linear computes the amax in its own kernel but writes its output in bf16, which a cast pass (d read, 2
  written) then quantises (csrc/extensions/normalization.cpp `Impl::FUSED_NORM_AMAX_FP8`); each weight is read once
  more for its amax (2 bytes). With sequence parallelism the inputs of column-parallel linears and the output
  gradients of row-parallel ones all-reduce their amax over the TP group before the cast (module/linear.py,
  layernorm_linear.py `_customize_quantizers_float8_current_scaling`: `with_amax_reduction`, `tp_group`): one
  blocking 4-byte all-reduce each, a latency. No amax history is kept (its buffers are not in gbmw's memory either).
"""

from __future__ import annotations

import numpy as np

from gbmw.cost.comm import CommModel
from gbmw.space.strategy import Strategy
from gbmw.specs.cluster_spec import ClusterSpec
from gbmw.specs.model_spec import ACTIVATION_DTYPE_BYTES, ModelSpec

FP8_WEIGHT_CAST_BYTES = {"delayed": 4, "current": 6}
"""Bytes one weight's cast moves per iteration: its bf16 value read (current scaling: twice, its amax first), its
row- and column-wise FP8 data written."""
FP8_WEIGHT_COPY_BYTES = 2
"""Bytes Transformer Engine holds per FP8 weight between micro-batches: its row- and column-wise FP8 data."""
AMAX_BYTES = 4
"""One fp32 amax: what current scaling's TP all-reduce of a sequence-parallel tensor's amax moves."""


def rank_fp8_parameters(model: ModelSpec, strategy: Strategy) -> np.ndarray:
    """[layer]: the FP8 weights one rank holds under `strategy` — TP-local (those TP leaves whole, whole), the routed
    experts' at 1/ep and 1/ETP (their biases, where a model has them, counted with the experts' FP8 weights)."""
    arrays, tp = model.arrays, strategy.tp
    whole = arrays.fp8_tp_replicated_parameter_count  # duplicated on every TP rank (latent attention's down-projections)
    routed = np.minimum(arrays.expert_parameter_count, arrays.fp8_parameter_count)
    experts = routed / tp
    return (arrays.fp8_parameter_count - whole) / tp + whole - experts + routed / strategy.expert_tensor_parallel / strategy.ep


def fp8_weight_copy_bytes(precision: str) -> int:
    """Bytes held per FP8 weight under `precision` (0 unless fp8)."""
    return FP8_WEIGHT_COPY_BYTES if precision == "fp8" else 0


def fp8_cast_s(model: ModelSpec, precision: str, cluster: ClusterSpec, samples: float, tp: int,
               fp8_parameters: np.ndarray, recipe: str = "delayed") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, once per iteration) per layer: Transformer Engine's FP8 casts at the device's memory
    bandwidth — the inputs and output gradients of `samples` samples at TP `tp` (TP-split traffic of the LayerSpec),
    and the rank's `fp8_parameters` weights, read in bf16 (2 bytes) and written row- and column-wise in FP8 (2 bytes);
    under `recipe` current, each cast's amax pass (d bytes per element read) and the norm outputs' own cast passes
    (the module docstring). Zeros unless the precision is fp8."""
    if precision != "fp8":
        zeros = np.zeros(model.num_layers)
        return zeros, zeros, zeros
    arrays, bandwidth = model.arrays, cluster.memory_bandwidth_bytes_per_s
    forward_bytes = arrays.fp8_forward_cast_traffic_bytes_per_sample
    backward_bytes = arrays.fp8_backward_cast_traffic_bytes_per_sample
    if recipe == "current":
        d = ACTIVATION_DTYPE_BYTES[model.precision]
        amax_share = d / (d + 2)  # a cast pass moves d + 2 bytes per element; its amax pass reads d more
        forward_bytes = forward_bytes * (1 + amax_share) + arrays.fp8_norm_cast_elements_per_sample * (d + 2)
        backward_bytes = backward_bytes * (1 + amax_share)
    forward = forward_bytes * samples / tp / bandwidth
    backward = backward_bytes * samples / tp / bandwidth
    return forward, backward, fp8_parameters * FP8_WEIGHT_CAST_BYTES[recipe] / bandwidth


def amax_reductions_s(model: ModelSpec, precision: str, recipe: str, strategy: Strategy, comm: CommModel
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) per layer: current scaling's blocking amax all-reduces over the TP group under sequence
    parallelism — one per column-parallel linear's input in forward, one per row-parallel linear's output gradient
    in backward (the module docstring). Zeros for delayed scaling, without `+sp`, or at TP 1."""
    zeros = np.zeros(model.num_layers)
    if precision != "fp8" or recipe != "current" or not strategy.sp or strategy.tp < 2:
        return zeros, zeros
    one = comm.allreduce_s(AMAX_BYTES, strategy.tp, strategy.stride("tp"))
    fp8 = model.arrays.fp8_parameter_count > 0
    column = np.array([sum(m.tp_split == "out" for m in layer.matmuls) for layer in model.layers]) * fp8
    row = np.array([sum(m.tp_split == "in" for m in layer.matmuls) for layer in model.layers]) * fp8
    return column * one, row * one
