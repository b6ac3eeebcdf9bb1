"""The memory-bound passes gbmw's runtime makes over its fp32 weights and gradients, beyond the layers' own
compute (issue 28, point 6: the estimate of gbmw's own one-device plans was 21–47 % faster than an H100 ran them;
the kernels the step spent its time on are in docs/gpu-measurements.md).

gbmw's runtime keeps fp32 weights and runs the layers under autocast without its weight cache
(adapters/runtime/engine.py), so in 16-bit precision every micro-batch

* casts each fp32 weight a matmul uses to 16 bits — read 4 + write 2 = 6 bytes per parameter, once per forward
  and once more in a checkpointed layer's recomputation (an embedding's lookup casts nothing);
* turns the 16-bit weight gradient the matmul's backward gives into fp32 (the cast's backward) — read 2 + write 4
  = 6 bytes per parameter;
* adds its fp32 gradient to the one kept from the micro-batches before it — read 4 + 4, write 4 = 12 bytes per
  gradient element the rank keeps (every micro-batch but the first of an iteration; charged on every one, so a
  micro-batch with the gradient sync never costs less than one without: one pass per iteration too many).

Once per iteration the optimizer step replaces the minimal traffic of gbmw.cost.model_states.step_traffic_bytes
with what torch's code does, pass by pass:

* torch's foreach Adam (torch/optim/adam.py, `_multi_tensor_adam`, not capturable): lerp_ of the first moment
  (read m, g; write m: 12), mul_ and addcmul_ of the second (8 + 12), its sqrt into a new tensor (8), div_ and
  add_ of ε on that tensor (8 + 8), addcdiv_ into the weights (read w, m, tmp; write w: 16) — 72 bytes per
  parameter;
* the gradient norm in float64, a chunk at a time (the runtime's `gradient_norm.sum_of_squares_float64`): .double()
  (read 4, write 8), square (16), sum (8) — 36 bytes; then the clip's scale, mul_ in place (8).

Its three unfused autograd functions (adapters/runtime/rms_norm.py, gated_mlp.py, rotary.py) make more passes over
their activations than the one read and one write per tensor gbmw.specs.transformer_layers counts for every target
(a norm 2·d, an activation (inputs + 1)·d per element, forward; backward priced at twice the forward). Counted from
their code, with the dtypes the runtime gives them (`unfused_pass_times_s`), in bytes per element forward +
backward:

* RMSNorm, on the fp32 residual stream (autocast keeps it fp32; fp32 training too): forward square (8), mean (4),
  × 1/rms (8), × weight (8) = 28; backward x · 1/rms (8), grad · weight (8), their product (12) and its mean (4),
  normalised × projection (8), the difference (12), × 1/rms (8), the weight gradient's product (12) and sum (4) = 76;
* SwiGLU on 16-bit inputs (autocast's linear outputs): forward two fp32 upcasts (6 + 6), sigmoid (8), gate · σ (12),
  × up (12), the 16-bit cast (6) = 50; backward σ (4), gate · σ (6), × grad (6), 1 − σ (4), × gate (6), + 1 (4),
  × σ (6), × up (6), × grad (6) = 48; on fp32 inputs 32 and 96;
* rotary, on Q and K in the activation dtype d: forward x · cos (2d), the negated half (d), the concatenation (2d),
  × sin (2d), the sum (3d) = 10d; backward the same 10d.

`tests/test_runtime_passes.py` counts the same bytes independently, operator by operator, from what the functions
run (a dispatch mode summing every aten op's input and output bytes). Each pass runs at the device's measured
copy bandwidth (the cluster's `memory_bandwidth_gb_per_s`).
"""

from __future__ import annotations

import numpy as np

from gbmw.cost.framework_memory import runs_autocast
from gbmw.specs.layer_arrays import LayerArrays

WEIGHT_CAST_BYTES = 6
"""fp32 weight read, 16-bit copy written: per parameter, per forward (and per recomputation)."""
GRADIENT_UPCAST_BYTES = 6
"""16-bit weight gradient read, fp32 gradient written: per parameter, per backward."""
GRADIENT_ACCUMULATION_BYTES = 12
"""Kept and new fp32 gradient read, their sum written: per kept gradient element, per micro-batch after the first."""
FOREACH_ADAM_STEP_BYTES = 72
"""torch's foreach Adam, its seven passes over the weights, the moments, the gradient and one temporary."""
FLOAT64_NORM_BYTES = 36
"""The runtime's gradient norm: each fp32 gradient element converted to float64, squared, summed."""
CLIP_SCALE_BYTES = 8
"""The clip's in-place scale of each fp32 gradient element."""
RMS_NORM_PASS_BYTES = (28, 76)
"""The runtime's RMSNorm on an fp32 input, (forward, backward) bytes per element (module docstring)."""
SWIGLU_PASS_BYTES = {2: (50, 48), 4: (32, 96)}
"""The runtime's SwiGLU by its inputs' bytes per element (16-bit under autocast, fp32): (forward, backward)."""
ROTARY_PASS_BYTES_PER_ACTIVATION_BYTE = (10, 10)
"""The runtime's rotary rotation of Q and K: (forward, backward) bytes per element per byte of the activation."""


def runtime_step_traffic_bytes(framework: str, optimizer: str) -> int | None:
    """Bytes gbmw's runtime moves per parameter it steps once per iteration (Adam, the float64 gradient norm and
    the clip's scale; module docstring); None for any other framework or optimizer (model_states' accounting)."""
    if framework != "gbmw-runtime" or optimizer != "adam":
        return None
    return FOREACH_ADAM_STEP_BYTES + FLOAT64_NORM_BYTES + CLIP_SCALE_BYTES


def autocast_pass_times_s(framework: str, precision: str, layer_kinds: np.ndarray, device_parameters: np.ndarray,
                          kept_gradient_parameters: np.ndarray, bandwidth_bytes_per_s: float
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward cast, backward upcast, gradient accumulation) seconds of one micro-batch, per layer, of gbmw's
    runtime under autocast (zeros otherwise): `device_parameters` are the weights this rank's matmuls use (TP-,
    EP-local, gathered), `kept_gradient_parameters` the gradient elements it keeps (its ZeRO-2/3 shard)."""
    zeros = np.zeros(len(device_parameters))
    if not runs_autocast(framework, precision):
        return zeros, zeros, zeros
    casts = np.where(layer_kinds == "embedding", 0.0, device_parameters)
    return (casts * WEIGHT_CAST_BYTES / bandwidth_bytes_per_s,
            casts * GRADIENT_UPCAST_BYTES / bandwidth_bytes_per_s,
            kept_gradient_parameters * GRADIENT_ACCUMULATION_BYTES / bandwidth_bytes_per_s)


def unfused_pass_times_s(framework: str, activation_bytes: int, arrays: LayerArrays, samples, tp, sequence_parallel
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per layer that gbmw's runtime spends beyond gbmw.specs.transformer_layers' count
    in its unfused RMSNorm, SwiGLU and rotary passes (module docstring), for `samples` samples at TP `tp` (TP divides
    the SwiGLU's and the rotation's elements, and the norms' under `sequence_parallel`); zeros for other frameworks
    and for profiled layers, whose measured time holds them. `samples`, `tp` and `sequence_parallel` may be columns
    (one row per strategy) broadcast against the layers. The bandwidth is applied by the caller."""
    profiled = arrays.has_measured_time
    if framework != "gbmw-runtime":
        zeros = np.zeros(np.broadcast_shapes(np.shape(samples), np.shape(tp), np.shape(sequence_parallel),
                                             profiled.shape))
        return zeros, zeros
    d = activation_bytes
    norm_forward, norm_backward = RMS_NORM_PASS_BYTES
    # what the common count already charges: a norm reads and writes d per element, an activation its two inputs and
    # its output; backward twice the forward
    norm = arrays.rms_norm_elements_per_sample * samples / np.where(sequence_parallel, tp, 1)
    gated = (arrays.gated_activation_elements_per_sample
             + arrays.expert_gated_activation_elements_per_sample * arrays.num_experts) * samples / tp
    rotary = arrays.rotary_elements_per_sample * samples / tp
    gate_forward, gate_backward = SWIGLU_PASS_BYTES[2 if d == 2 else 4]
    rotary_forward, rotary_backward = (d * share for share in ROTARY_PASS_BYTES_PER_ACTIVATION_BYTE)
    forward = (norm * (norm_forward - 2 * d) + gated * (gate_forward - 3 * d) + rotary * rotary_forward)
    backward = (norm * (norm_backward - 4 * d) + gated * (gate_backward - 6 * d) + rotary * rotary_backward)
    return np.where(profiled, 0.0, forward), np.where(profiled, 0.0, backward)
