"""The cost of one layer under one strategy: time, and memory in bytes (paper Sec. 5; Eq. (1)–(3)'s O_f, O_b,
O_ms and the per-layer time c(l, S) of Eq. (4)).

For one micro-batch of `micro_batch` samples entering a stage whose group has G devices, a layer under
strategy S (data-parallel ways d, TP degree t) processes micro_batch / d samples per device:

* compute: forward = per-sample time × samples / t where profiled; otherwise kernel by kernel: the matmul FLOPs
  at the device's measured matmul rate (flash attention's at its measured attention rate), plus the memory-bound
  kernels' traffic at its measured memory bandwidth (TP divides both inside its split regions, not the norms,
  dropout and residual adds outside them);
  backward = 2 × forward unless profiled; CKPT adds one forward (recompute) before backward, selective
  recomputation the attention core's forward; sequence parallelism divides the norms', dropout's and residual
  adds' traffic by TP too (gbmw.cost.activation_recompute). On a device with a
  known multiprocessor count, each linear matmul of that micro-batch's shape (rows = samples × tokens, TP-split
  features) also pays the time its tile waves lose, forward and backward (gbmw.cost.matmul_waves).
  Under precision fp8 (Transformer Engine) the linear layers' GEMMs (`fp8_forward_flops_per_sample`) run at the
  device's measured FP8 GEMM rate and every other FLOP at bf16's; their casts are memory-bound passes at the measured
  bandwidth — the inputs and output gradients per micro-batch, the weights once per iteration, priced on the last
  micro-batch (gbmw.cost.fp8; what is cast: gbmw.specs.transformer_layers); current scaling adds each cast's amax
  pass and, under `+sp`, the TP all-reduces of the amax (blocking).
* TP: the layer's all-reduces in forward and as many in backward (and again in the recompute).
* EP (mixture-of-experts layers under `+epN`): the routed experts split over the EP group, their states synchronised
  and sharded over the expert-data-parallel group, the dispatch and combine all-to-alls, the busiest rank's load
  (gbmw.cost.expert_parallel).
* DP/SDP: SDP all-gathers parameters before forward and backward and reduce-scatters gradients
  every micro-batch (DeepSpeed ZeRO-3 keeps no unsharded gradients across micro-batches);
  DP all-reduces gradients once per iteration, on the last micro-batch (Appendix C); ZeRO-1
  reduce-scatters gradients and all-gathers updated parameters then; ZeRO-2 reduce-scatters every
  micro-batch and all-gathers parameters on the last. Backward DP/SDP communication overlaps
  backward compute and both slow down by the cluster's overlap factor f while they share the
  device: time = max(c, g) + (f - 1) · min(c, g).
* memory (bytes per device): model states per framework, precision and optimizer (gbmw.cost.model_states), divided by the sharding
  axes, and what the framework allocates beyond them (gbmw.cost.framework_memory); forward-stashed activations O_f (boundary + intermediate, or boundary only under CKPT,
  without the attention core's s×s tensors under selective recomputation, TP's replicated part divided by TP
  under sequence parallelism: Korthikanti et al. 2022, Table 2);
  backward extra O_b (the recomputed intermediates of a CKPT layer, the gathered parameters and
  gradients of an SDP layer); model states O_ms, and under fp8 the FP8 copies of the linear weights Transformer
  Engine caches between micro-batches (row- and column-wise: 2 bytes per weight, TP- and EP-local, never sharded).

The tables themselves — `layer_costs` of one strategy, `layer_costs_of_strategies` of many in one numpy pass — are
computed in gbmw.cost.layer_cost_batch from this module's settings, result type and helpers. gbmw.cost.stage_cost adds
what depends on the stage (transitions, pipeline sends, the 1F1B stash).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gbmw.cost.comm import CommModel
from gbmw.cost.framework_memory import kept_shard_bytes_per_parameter
from gbmw.cost.model_states import StateBytes, sharded_bytes_per_parameter, state_bytes
from gbmw.space.strategy import Strategy
from gbmw.specs.cluster_spec import ClusterSpec
from gbmw.specs.model_spec import ModelSpec


@dataclass(frozen=True)
class CostSettings:
    """What the costs depend on besides the layers and strategies."""

    cluster: ClusterSpec
    precision: str
    optimizer: str = "adam"
    framework: str = "gbmw-runtime"
    """What runs the plan (gbmw.space.targets' Target.framework): it decides the bytes kept per parameter."""
    fp8_recipe: str = "delayed"
    """Transformer Engine's FP8 scaling under precision fp8: delayed or current (gbmw.cost.fp8)."""
    gradient_reduce_dtype: str = "fp32"
    """The dtype gradients are accumulated and reduced in (gbmw.cost.model_states.state_bytes)."""
    adam_moments_dtype: str = "fp32"
    """The dtype Adam's moments are kept in (gbmw.cost.model_states.state_bytes)."""
    tp_comm_overlap: bool = False
    """The +sp layers' TP collectives run beside their GEMMs (gbmw.cost.tp_comm_overlap)."""
    fused_elementwise: bool = False
    """The norms, gated activations and rotary positions run as fused kernels (Transformer Engine's) rather than as
    gbmw's runtime's own unfused passes (gbmw.cost.runtime_passes.unfused_pass_times_s): for costing another FSDP2
    framework's run in the runtime's layout (benchmarks/published_runs.py)."""

    @classmethod
    def for_job(cls, job: Any, framework: str) -> CostSettings:
        """The settings of `job` (a gbmw.specs.jobs.JobSpec) run by `framework`."""
        return cls(job.cluster, job.precision, job.optimizer, framework, job.fp8_recipe, job.gradient_reduce_dtype,
                   job.adam_moments_dtype, job.tp_comm_overlap)

    @property
    def unfused_passes_framework(self) -> str:
        """The framework whose unfused elementwise passes are charged ("fused": none)."""
        return "fused" if self.fused_elementwise else self.framework

    @property
    def states(self) -> StateBytes:
        return state_bytes(self.framework, self.precision, self.optimizer, self.gradient_reduce_dtype,
                           self.adam_moments_dtype)


@dataclass
class LayerCosts:
    """Per-layer costs for one strategy (arrays over layers), one micro-batch."""

    time_s: np.ndarray
    """Layer time on the last micro-batch (gradient synchronisation included)."""
    time_no_grad_sync_s: np.ndarray
    """Layer time on the other micro-batches."""
    forward_memory_bytes: np.ndarray
    """O_f: activations stashed from forward to backward (one micro-batch)."""
    backward_memory_bytes: np.ndarray
    """O_b: extra memory only while this layer runs backward."""
    model_state_bytes: np.ndarray
    """O_ms: parameters, gradients and optimizer states held throughout."""
    samples_per_device: float
    optimizer_parameters: np.ndarray
    """Parameters this device's optimizer steps (TP-local, divided by every ZeRO degree of the strategy)."""


def model_state_bytes_per_parameter(strategy: Strategy, settings: CostSettings) -> float:
    """Bytes of model states per (TP-local) parameter on one device under `strategy`'s sharding."""
    return (sharded_bytes_per_parameter(strategy, settings.states)
            + kept_shard_bytes_per_parameter(settings.framework, strategy, settings.states.weights))


def tp_local_parameters(model: ModelSpec, tp: int) -> np.ndarray:
    arrays = model.arrays
    return arrays.tp_split_parameter_count / tp + (arrays.parameter_count - arrays.tp_split_parameter_count)


def forward_time_per_sample_s(model: ModelSpec, settings: CostSettings) -> np.ndarray:
    """Measured per-sample forward time where profiled, else FLOPs / the matmul rate (profiled models only)."""
    arrays = model.arrays
    analytic = arrays.forward_flops_per_sample / settings.cluster.sustained_flops(settings.precision)
    return np.where(arrays.has_measured_time, arrays.forward_time_per_sample_s, analytic)


def forward_compute_s(model: ModelSpec, settings: CostSettings, samples: float, tp: int,
                      sequence_parallel: bool = False) -> np.ndarray:
    """One forward pass of `samples` samples on one device at TP degree `tp`: the profiled time, or the matmuls
    at the measured matmul rate plus the memory-bound kernels' traffic at the measured memory bandwidth (with
    `sequence_parallel`, TP also divides the traffic of the norms, dropout and residual adds: gbmw.cost.activation_recompute)."""
    arrays = model.arrays
    bandwidth = settings.cluster.memory_bandwidth_bytes_per_s
    flash, fp8 = arrays.forward_flash_attention_flops_per_sample, arrays.fp8_forward_flops_per_sample
    # the linears every TP rank runs whole (at the FP8 rate in a layer with FP8 linears)
    replicated = arrays.tp_replicated_forward_flops_per_sample / np.where(
        fp8 > 0, settings.cluster.linear_flops(settings.precision), settings.cluster.sustained_flops(settings.precision))
    split = ((arrays.forward_flops_per_sample - flash - fp8) / settings.cluster.sustained_flops(settings.precision)
             + fp8 / settings.cluster.linear_flops(settings.precision)
             + arrays.flash_kernel_flops_per_sample / settings.cluster.attention_flops(settings.precision)
             + arrays.forward_tp_split_memory_traffic_bytes_per_sample / bandwidth) - replicated
    whole = arrays.forward_memory_traffic_bytes_per_sample / bandwidth + replicated
    analytic = split * samples / tp + whole * samples / (tp if sequence_parallel else 1)
    measured = arrays.forward_time_per_sample_s * samples / tp + arrays.forward_overhead_s
    return np.where(arrays.has_measured_time, measured, analytic)


def framework_overheads_s(model: ModelSpec, strategy: Strategy, settings: CostSettings, comm: CommModel,
                          parameter_bytes: float, gradient_bytes: float) -> tuple[np.ndarray, np.ndarray]:
    """Per call: what profiled TP-2 / SDP-2 / checkpointed timings show beyond compute and the modelled
    collectives (the runtime's megatron-core, FSDP2 and checkpoint_wrapper bookkeeping), and the part of it
    a checkpointed layer's recomputed forward repeats (TP's forward share). 0 for analytic models and for
    strategies without tp, sdp or ckpt."""
    arrays = model.arrays
    overhead, recompute_overhead = np.zeros(model.num_layers), np.zeros(model.num_layers)
    batch = arrays.profiled_batch
    if not batch.any():
        return overhead, recompute_overhead
    forward_per_sample = forward_time_per_sample_s(model, settings)
    backward_per_sample = np.where(arrays.has_measured_backward, arrays.backward_time_per_sample_s,
                                   2 * forward_per_sample)
    backward_per_call = np.where(arrays.has_measured_backward, arrays.backward_overhead_s, 2 * arrays.forward_overhead_s)

    def charged_compute(tp: int) -> np.ndarray:
        """Forward + backward compute of one call of `batch` samples as layer_costs charges it at TP `tp`."""
        return (forward_per_sample + backward_per_sample) * batch / tp + arrays.forward_overhead_s + backward_per_call

    if strategy.tp > 1:
        tp_comm = 2 * collective_time_s(comm.allreduce_s, arrays.tp_allreduce_bytes_per_sample * batch, 2, 1)
        overhead += np.where(arrays.tp2_time_s > 0,
                             np.maximum(0.0, arrays.tp2_time_s - charged_compute(2) - tp_comm), 0.0)
        if strategy.ckpt:
            forward_charged = forward_per_sample * batch / 2 + arrays.forward_overhead_s + tp_comm / 2
            recompute_overhead += np.where(arrays.tp2_forward_time_s > 0,
                                           np.maximum(0.0, arrays.tp2_forward_time_s - forward_charged), 0.0)
    if strategy.degree("sdp") > 1:
        gathers = 2 * collective_time_s(comm.allgather_s, arrays.parameter_count * parameter_bytes, 2, 1)
        scatter = collective_time_s(comm.reduce_scatter_s, arrays.parameter_count * gradient_bytes, 2, 1)
        overhead += np.where(arrays.sdp2_time_s > 0,
                             np.maximum(0.0, arrays.sdp2_time_s - charged_compute(1) - gathers - scatter), 0.0)
    if strategy.ckpt:
        recompute = forward_per_sample * batch + arrays.forward_overhead_s
        overhead += np.where(arrays.ckpt_time_s > 0,
                             np.maximum(0.0, arrays.ckpt_time_s - charged_compute(1) - recompute), 0.0)
    return overhead, recompute_overhead


def optimizer_shards(strategy: Strategy) -> int:
    """Ways ZeRO divides the parameters a rank's optimizer steps."""
    return strategy.degree("sdp") * strategy.degree("z2dp") * strategy.degree("z1dp")


def _data_parallel_sync(comm: CommModel, axis: str, degree: int, stride: int, parameters: np.ndarray,
                        parameter_bytes: float, gradient_bytes: float
                        ) -> tuple[np.ndarray | float, np.ndarray | float, np.ndarray | float]:
    """(forward gather, every micro-batch, last micro-batch) times of one data-parallel axis over `parameters` per
    layer (module docstring: SDP gathers and reduce-scatters every micro-batch, ZeRO-2 reduce-scatters every
    micro-batch and gathers on the last, ZeRO-1 reduce-scatters and gathers on the last, DP all-reduces on the last)."""
    if axis == "sdp":
        gather = collective_time_s(comm.allgather_s, parameters * parameter_bytes, degree, stride)
        return gather, gather + collective_time_s(comm.reduce_scatter_s, parameters * gradient_bytes, degree,
                                                  stride), 0.0
    if axis == "z2dp":
        return (0.0, collective_time_s(comm.reduce_scatter_s, parameters * gradient_bytes, degree, stride),
                collective_time_s(comm.allgather_s, parameters * parameter_bytes, degree, stride))
    if axis == "z1dp":
        return 0.0, 0.0, (collective_time_s(comm.reduce_scatter_s, parameters * gradient_bytes, degree, stride)
                          + collective_time_s(comm.allgather_s, parameters * parameter_bytes, degree, stride))
    return 0.0, 0.0, collective_time_s(comm.allreduce_s, parameters * gradient_bytes, degree, stride)


def collective_time_s(function, message_bytes: np.ndarray, size: int, stride: int) -> np.ndarray:
    """A collective time function of gbmw.cost.comm applied to each layer's message (times are affine in the
    size); a layer with nothing to send costs nothing."""
    if size <= 1:
        return np.zeros_like(message_bytes)
    base = function(0.0, size, stride)
    per_byte = function(1.0, size, stride) - base
    return np.where(message_bytes > 0, base + per_byte * message_bytes, 0.0)
