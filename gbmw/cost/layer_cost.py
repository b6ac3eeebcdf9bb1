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

gbmw.cost.stage_cost adds what depends on the stage (transitions, pipeline sends, the 1F1B stash).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gbmw.cost.activation_recompute import (selective_freed_bytes, selective_rebuilt_bytes, selective_recompute_s,
                                            sequence_parallel_divisor)
from gbmw.cost.comm import CommModel
from gbmw.cost.context_parallel import context_parallel_costs
from gbmw.cost.expert_parallel import expert_data_parallel_group, expert_parallel_costs, expert_view
from gbmw.cost.fp8 import amax_reductions_s, fp8_cast_s, fp8_weight_copy_bytes, rank_fp8_parameters
from gbmw.cost.framework_memory import (autocast_weight_copy_bytes, cross_entropy_workspace_bytes_per_logit,
                                        fp32_residual_extra_share, gated_activation_peak_bytes,
                                        fp32_tp_input_extra_share, gather_buffer_bytes_per_parameter,
                                        kept_shard_bytes_per_parameter, prices_backward_workspace,
                                        sequence_parallel_gather_share)
from gbmw.cost.matmul_waves import layer_wave_loss_s
from gbmw.cost.model_states import StateBytes, sharded_bytes_per_parameter, state_bytes
from gbmw.cost.runtime_passes import autocast_pass_times_s
from gbmw.space.strategy import DATA_PARALLEL_AXES, Strategy
from gbmw.specs.cluster_spec import ClusterSpec
from gbmw.specs.model_spec import ACTIVATION_DTYPE_BYTES, ModelSpec


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

    @property
    def states(self) -> StateBytes:
        return state_bytes(self.framework, self.precision, self.optimizer)


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


def layer_costs(
    model: ModelSpec, strategy: Strategy, micro_batch: float, settings: CostSettings, comm: CommModel
) -> LayerCosts:
    """c(l, S), O_f(l, S), O_b(l, S), O_ms(l, S) of every layer l under one strategy S."""
    arrays = model.arrays
    states = settings.states
    parameter_bytes, gradient_bytes = states.weights, states.gradients
    tp = strategy.tp
    # a rank's share of the micro-batch's tokens, in samples: its data-parallel slice of the samples, and of their
    # tokens under a sequence axis (cp, ulysses); the weights see the sequence ranks as data-parallel ones
    samples = micro_batch / strategy.data_parallel / strategy.sequence_parallel_degree
    weights = strategy.gradient_view
    slowdown = settings.cluster.overlap_slowdown

    # Compute.
    forward_compute = forward_compute_s(model, settings, samples, tp, strategy.sp)
    backward_compute = np.where(arrays.has_measured_backward,
                                arrays.backward_time_per_sample_s * samples / tp + arrays.backward_overhead_s,
                                2.0 * forward_compute)
    forward_wave_loss, backward_wave_loss = layer_wave_loss_s(model, settings.cluster, settings.precision, samples, tp, strategy.sp)
    forward_compute = forward_compute + forward_wave_loss
    backward_compute = backward_compute + backward_wave_loss  # 0 for profiled layers
    # a flash kernel's backward runs 2.5× its forward FLOPs, not 2× (it recomputes the scores: FlashAttention-2,
    # Sec. 3.1.2; its benchmark counts fwd + bwd as 3.5× fwd, the convention of the measured attention rate)
    attention_rate = np.where(arrays.forward_flash_attention_flops_per_sample > 0,
                              settings.cluster.attention_flops(settings.precision),
                              settings.cluster.sustained_flops(settings.precision))
    backward_compute = backward_compute + np.where(  # a profiled forward holds the kernel's real time already
        arrays.has_measured_time, 0.0, 0.5 * arrays.flash_kernel_flops_per_sample * samples / tp / attention_rate)

    # Tensor-parallel all-reduces (blocking, not overlapped).
    tp_stride = strategy.stride("tp") if tp > 1 else 1
    tp_forward = collective_time_s(comm.allreduce_s, arrays.tp_allreduce_bytes_per_sample * samples, tp, tp_stride)

    # Expert parallelism: the routed experts leave the data-parallel group for the expert-data-parallel one.
    experts = expert_parallel_costs(model, strategy, samples, comm, settings.cluster.linear_flops(settings.precision))
    local_parameters = tp_local_parameters(model, tp)
    split_experts = strategy.ep > 1
    dense_parameters = local_parameters - experts.expert_parameters if split_experts else local_parameters
    rank_experts = experts.expert_parameters / strategy.ep if split_experts else np.zeros(model.num_layers)
    device_parameters = dense_parameters + rank_experts
    """What this rank holds of each layer before any ZeRO sharding."""
    expert_strategy = expert_view(weights)
    fp8_parameters = rank_fp8_parameters(model, strategy)
    forward_cast, backward_cast, weight_cast = fp8_cast_s(model, settings.precision, settings.cluster, samples, tp,
                                                         fp8_parameters, settings.fp8_recipe)
    forward_compute = forward_compute + forward_cast
    backward_compute = backward_compute + backward_cast
    # gbmw's runtime under autocast: weight casts, gradient upcasts and accumulation (gbmw.cost.runtime_passes)
    kinds = np.array([layer.kind for layer in model.layers])
    kept_gradients = (dense_parameters / (weights.degree("sdp") * weights.degree("z2dp"))
                      + rank_experts / (expert_strategy.degree("sdp") * expert_strategy.degree("z2dp")))
    weight_cast_pass, gradient_upcast_pass, accumulation_pass = autocast_pass_times_s(
        settings.framework, settings.precision, kinds, device_parameters, kept_gradients,
        settings.cluster.memory_bandwidth_bytes_per_s)
    forward_compute = forward_compute + weight_cast_pass  # a checkpointed layer's recomputation casts again
    # the accumulation on every micro-batch: one pass per iteration more than runs (the first gradient is assigned),
    # so a micro-batch with the gradient sync is never cheaper than one without
    backward_compute = backward_compute + gradient_upcast_pass + accumulation_pass
    forward_amax, backward_amax = amax_reductions_s(model, settings.precision, settings.fp8_recipe, strategy, comm)

    # Data-parallel communication of this layer's (TP-local) parameters and gradients.
    every_micro_batch = np.zeros(model.num_layers)  # backward, overlappable
    forward_gather = np.zeros(model.num_layers)
    last_micro_batch = np.zeros(model.num_layers)  # backward, overlappable, once per iteration
    shard = 1
    for axis, degree in weights.dims:
        if axis not in DATA_PARALLEL_AXES:
            continue
        sync = _data_parallel_sync(comm, axis, degree, weights.stride(axis), dense_parameters / shard,
                                   parameter_bytes, gradient_bytes)
        forward_gather, every_micro_batch, last_micro_batch = (
            forward_gather + sync[0], every_micro_batch + sync[1], last_micro_batch + sync[2])
        if axis == "sdp":
            shard *= degree
    if split_experts and strategy.expert_data_parallel > 1:
        axis, degree, stride = expert_data_parallel_group(strategy)
        sync = _data_parallel_sync(comm, axis, degree, stride, rank_experts, parameter_bytes, gradient_bytes)
        forward_gather, every_micro_batch, last_micro_batch = (
            forward_gather + sync[0], every_micro_batch + sync[1], last_micro_batch + sync[2])

    call_overhead, recompute_overhead = framework_overheads_s(model, strategy, settings, comm, parameter_bytes,
                                                              gradient_bytes)

    def overlapped(compute: np.ndarray, communication: np.ndarray) -> np.ndarray:
        return np.maximum(compute, communication) + (slowdown - 1.0) * np.minimum(compute, communication)

    forward_compute = forward_compute + experts.extra_forward_compute_s
    backward_compute = backward_compute + 2 * experts.extra_forward_compute_s
    # TP's collectives and EP's all-to-alls block compute; backward runs as many, a full recomputation again
    blocking = tp_forward + experts.alltoall_forward_s
    # Context parallelism's ring and Ulysses' all-to-alls (gbmw.cost.context_parallel)
    context = context_parallel_costs(model, strategy, samples, comm, (
        arrays.attention_core_flops_per_sample - arrays.flash_attention_skipped_flops_per_sample) * samples / tp
        / attention_rate)
    forward = forward_compute + blocking + forward_amax + forward_gather + call_overhead + context.forward_s
    full_recompute = forward_compute + blocking + forward_amax + recompute_overhead + context.forward_s
    recompute = full_recompute if strategy.ckpt else selective_recompute_s(
        model, samples, strategy, settings.cluster.sustained_flops(settings.precision),
        settings.cluster.attention_flops(settings.precision), settings.cluster.memory_bandwidth_bytes_per_s)
    backward_common = blocking + backward_amax + recompute + context.backward_s
    time_no_sync = forward + backward_common + overlapped(backward_compute, every_micro_batch)
    time_sync = (forward + backward_common + overlapped(backward_compute, every_micro_batch + last_micro_batch)
                 + weight_cast)

    # Memory.
    boundary = arrays.boundary_activation_bytes_per_sample * samples
    intermediate = (
        arrays.intermediate_activation_bytes_per_sample + arrays.intermediate_tp_split_activation_bytes_per_sample / tp
    ) * samples + experts.extra_activation_bytes
    # What gbmw's runtime keeps beyond the 16-bit accounting under autocast (gbmw.cost.framework_memory; not for
    # embeddings, which keep token ids): the one-device layers' 16-bit weight copy, and fp32 residual-stream inputs.
    not_embedding = np.array([layer.kind != "embedding" for layer in model.layers])
    weight_copy = device_parameters * autocast_weight_copy_bytes(settings.framework, settings.precision,
                                                                strategy.tp) * not_embedding
    d = ACTIVATION_DTYPE_BYTES[model.precision]
    residual_share = fp32_residual_extra_share(settings.framework, settings.precision, d)
    fp32_share = residual_share * not_embedding
    tp_input_share = fp32_tp_input_extra_share(settings.framework, settings.precision, d, strategy.tp) * not_embedding
    residual_inputs = np.where(arrays.residual_input_bytes_per_sample > 0, arrays.residual_input_bytes_per_sample,
                               np.maximum(arrays.tp_allreduce_bytes_per_sample, arrays.boundary_activation_bytes_per_sample))
    boundary = boundary * (1 + fp32_share)
    intermediate = intermediate + (fp32_share * (residual_inputs - arrays.boundary_activation_bytes_per_sample)
                                   + tp_input_share * residual_inputs) * samples
    # sequence parallelism splits the replicated activations over TP (not an embedding's token ids); selective
    # recomputation drops the attention core's stash and rebuilds it while the layer runs backward
    if strategy.sp:
        sp_divisor = sequence_parallel_divisor(strategy)
        boundary = np.where(not_embedding, boundary / sp_divisor, boundary)
        split_part = arrays.intermediate_tp_split_activation_bytes_per_sample * samples / tp
        intermediate = (intermediate - split_part) / sp_divisor + split_part
    core = selective_freed_bytes(model, samples, strategy)
    if strategy.ckpt:
        forward_memory, backward_memory = boundary, intermediate + weight_copy
    else:
        forward_memory = boundary + intermediate - core + weight_copy
        workspace_priced = prices_backward_workspace(settings.framework)
        backward_memory = selective_rebuilt_bytes(model, samples, strategy, workspace_priced)
    backward_memory = backward_memory + context.transient_bytes
    # the gathered full parameters and unscattered gradients of the running layer (ZeRO-3)
    gathered_parameters = (dense_parameters * (1 - 1 / weights.degree("sdp"))
                           + rank_experts * (1 - 1 / expert_strategy.degree("sdp")))
    backward_memory = backward_memory + gathered_parameters * (parameter_bytes + gradient_bytes)
    output_gradient = np.zeros(model.num_layers)
    if prices_backward_workspace(settings.framework):  # backward's working set beside the stash
        residual = arrays.boundary_activation_bytes_per_sample
        # the gradients of the layer's output (received) and input (sent on), in the residual stream's dtype
        gradient_in_out = (np.where(kinds == "embedding", 0.0, residual)
                           + np.where(kinds == "head", 0.0, np.where(kinds == "embedding",
                                                                      arrays.tp_allreduce_bytes_per_sample, residual)))
        output_gradient = np.where(kinds == "embedding", 0.0, residual) * (1 + residual_share) * samples
        backward_memory = backward_memory + (gradient_in_out * (1 + residual_share) * samples
                                             + (arrays.backward_workspace_tp_split_bytes_per_sample * samples
                                                + arrays.largest_weight_gradient_tp_split_bytes) / tp)
        # a head's cross-entropy: what it holds beside the kept softmax (torch's on one device, megatron-core's in place)
        backward_memory = backward_memory + arrays.loss_logits_per_sample * samples / tp * (
            cross_entropy_workspace_bytes_per_logit(settings.framework, settings.precision, tp))
        # +sp: the column-parallel linears' input all-gathered again for their weight gradients
        backward_memory = backward_memory + np.where(kinds == "embedding", 0.0, residual) * samples * (
            sequence_parallel_gather_share(settings.framework, strategy))
    # the framework's all-gather buffer while the layer gathers (a forward transient, bounded by the backward term)
    gather_buffer = (dense_parameters * gather_buffer_bytes_per_parameter(settings.framework, weights, parameter_bytes)
                     + rank_experts * gather_buffer_bytes_per_parameter(settings.framework, expert_strategy,
                                                                         parameter_bytes))
    backward_memory = backward_memory + gather_buffer
    # the gated activation's working set, in forward or in a checkpointed layer's recomputation, where it holds more
    backward_memory = np.maximum(backward_memory, gated_activation_peak_bytes(
        settings.framework, settings.precision, model, strategy, samples, d,
        gathered_parameters * parameter_bytes + gather_buffer
        + (intermediate + weight_copy + output_gradient if strategy.ckpt else 0.0)))
    held_states = (dense_parameters * model_state_bytes_per_parameter(weights, settings)
                   + rank_experts * model_state_bytes_per_parameter(expert_strategy, settings)
                   + fp8_parameters * fp8_weight_copy_bytes(settings.precision))
    return LayerCosts(
        time_s=time_sync,
        time_no_grad_sync_s=time_no_sync,
        forward_memory_bytes=forward_memory,
        backward_memory_bytes=backward_memory,
        model_state_bytes=held_states,
        samples_per_device=samples,
        optimizer_parameters=dense_parameters / optimizer_shards(weights) + rank_experts / optimizer_shards(
            expert_strategy),
    )


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
