"""What each framework keeps per parameter — the model states O_ms of Eq. (2) — and how ZeRO shards them.

Bytes per parameter, as each framework documents or implements it (Adam; mixed precision is bf16/fp16):

framework       precision   weights   gradients   optimizer    source
gbmw-runtime    any         4         4           8            gbmw's runtime: fp32 weights under autocast,
                                                               fp32 gradients, Adam's two fp32 moments
megatron        bf16        2         4           12           Megatron-LM docs, "Distributed Optimizer": bf16
                fp16        2         2           16           parameters with fp32 main gradients keep 18
                fp32        4         4           8            bytes (6 + 12/d distributed), fp16 20 (4 + 16/d),
                fp8         2         4           12           fp32 16 (8 + 8/d); fp8 (Transformer Engine) keeps
                                                               bf16's states (its FP8 weight copies are not model
                                                               states: gbmw.cost.layer_cost)
deepspeed       bf16/fp16   2         2           16           DeepSpeed's estimate_zero2_model_states_mem_needs:
                fp32        4         4           8            16-bit weights and gradients, then fp32 gradients,
                                                               fp32 weights and Adam's moments (18/d with ZeRO-2)
SGD (no momentum) keeps the weights and gradients and, in mixed precision, an fp32 master copy (any framework).
With `gradient_reduce_dtype` bf16 (megatron-core's `--grad-reduce-in-bf16`: megatron/training/arguments.py turns
accumulate_allreduce_grads_in_fp32 off, so its DDP's gradient buffer takes the bf16 parameters' dtype) Megatron keeps
2-byte gradients; only --target megatron-core plans it (gbmw.space.targets). With `adam_moments_dtype` bf16
(megatron-core's precision-aware optimizer, `--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16`: Transformer Engine's
FusedAdam keeps exp_avg and exp_avg_sq in bf16 beside the fp32 main weights) Adam's two moments take 2 bytes each:
Megatron bf16's optimizer column is 4 + 2 + 2 = 8 bytes instead of 12.

The optimizer step is memory-bound: per parameter it steps, it reads and writes the optimizer's states, reads the
gradient (twice: the gradient norm for clipping, then the update) and writes the weights — and, where the weights
are themselves the fp32 master copy (no 16-bit copy), reads them too (`step_traffic_bytes`).

Sharding follows ZeRO (Rajbhandari et al., Sec. 5): ZeRO-1 (z1dp, Megatron's distributed optimizer) divides the
optimizer column by its degree, ZeRO-2 (z2dp) the gradients too, ZeRO-3 (sdp) everything. The weights are also
what SDP all-gathers and the gradients what data parallelism reduces, so their sizes set those messages too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gbmw.space.strategy import Strategy
from gbmw.specs.model_spec import STORAGE_PRECISION


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter a framework keeps: the weights layers compute with, the gradients it accumulates and
    reduces, and what its optimizer holds (fp32 master weights, moments, fp32 gradient copies)."""

    weights: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


_ADAM = {
    ("gbmw-runtime", "fp32"): StateBytes(4, 4, 8),
    ("gbmw-runtime", "bf16"): StateBytes(4, 4, 8),
    ("gbmw-runtime", "fp16"): StateBytes(4, 4, 8),
    ("megatron", "fp32"): StateBytes(4, 4, 8),
    ("megatron", "bf16"): StateBytes(2, 4, 12),
    ("megatron", "fp16"): StateBytes(2, 2, 16),
    ("megatron", "fp8"): StateBytes(2, 4, 12),
    ("deepspeed", "fp32"): StateBytes(4, 4, 8),
    ("deepspeed", "bf16"): StateBytes(2, 2, 16),
    ("deepspeed", "fp16"): StateBytes(2, 2, 16),
}
_SGD = {"fp32": StateBytes(4, 4, 0), "bf16": StateBytes(2, 2, 4), "fp16": StateBytes(2, 2, 4),
        "fp8": StateBytes(2, 2, 4)}
FRAMEWORKS = ("gbmw-runtime", "megatron", "deepspeed")
BF16_GRADIENT_BYTES = 2
BF16_MOMENTS_SAVED_BYTES = 2 * (4 - 2)
"""Adam's two moments in bf16 rather than fp32: 2 bytes saved on each."""


def state_bytes(framework: str, precision: str, optimizer: str, gradient_reduce_dtype: str = "fp32",
                adam_moments_dtype: str = "fp32") -> StateBytes:
    """The bytes per parameter `framework` keeps training in `precision` with `optimizer` (see the module table),
    its gradients in bf16 where `gradient_reduce_dtype` says so, Adam's moments where `adam_moments_dtype` does."""
    precision = STORAGE_PRECISION.get(precision, precision)
    states = _SGD[precision] if optimizer == "sgd" else _ADAM[framework, precision]
    if gradient_reduce_dtype == "bf16":
        states = replace(states, gradients=BF16_GRADIENT_BYTES)
    if adam_moments_dtype == "bf16" and optimizer == "adam":
        states = replace(states, optimizer=states.optimizer - BF16_MOMENTS_SAVED_BYTES)
    return states


def sharded_bytes_per_parameter(strategy: Strategy, states: StateBytes) -> float:
    """Bytes of model states per (TP-local) parameter on one device under `strategy`'s ZeRO sharding."""
    zero3 = strategy.degree("sdp")
    zero2 = zero3 * strategy.degree("z2dp")
    zero1 = zero2 * strategy.degree("z1dp")
    return states.weights / zero3 + states.gradients / zero2 + states.optimizer / zero1


def step_traffic_bytes(states: StateBytes) -> int:
    """Bytes the optimizer step moves per parameter it steps (the module's accounting): Adam with a 16-bit copy,
    e.g. Megatron bf16, 2·12 + 2·4 + 2 = 34; gbmw's runtime (fp32 weights are the master) 2·8 + 2·4 + 2·4 = 32."""
    master_is_weights = states.weights >= 4
    return 2 * states.optimizer + 2 * states.gradients + states.weights * (2 if master_is_weights else 1)
