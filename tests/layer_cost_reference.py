"""The per-strategy `layer_costs` as it was written before the batched tables (gbmw.cost.layer_cost_batch) became
the one implementation: kept here, line for line, as the independent reference tests/test_layer_cost_batch.py
compares the batched tables with, bit for bit. Change both together when the cost model changes."""

from __future__ import annotations

import numpy as np

from gbmw.cost.activation_recompute import (selective_freed_bytes, selective_rebuilt_bytes, selective_recompute_s,
                                            sequence_parallel_divisor)
from gbmw.cost.comm import CommModel
from gbmw.cost.context_parallel import context_parallel_costs
from gbmw.cost.expert_parallel import (expert_data_parallel_group, expert_input_gathered_bytes, expert_parallel_costs,
                                      expert_tp_bytes_per_sample, expert_view)
from gbmw.cost.fp8 import amax_reductions_s, fp8_cast_s, fp8_weight_copy_bytes, rank_fp8_parameters
from gbmw.cost.framework_memory import (autocast_weight_copy_bytes, cross_entropy_workspace_bytes_per_logit,
                                        fp32_residual_extra_share, gated_activation_forward_bytes,
                                        gated_activation_peak_bytes,
                                        fp32_tp_input_extra_share, gather_buffer_bytes_per_parameter,
                                        prices_backward_workspace, recomputation_weight_bytes,
                                        sequence_parallel_gather_share)
from gbmw.cost.matmul_waves import layer_wave_loss_s
from gbmw.cost.runtime_passes import autocast_pass_times_s, unfused_pass_times_s
from gbmw.space.strategy import DATA_PARALLEL_AXES, Strategy
from gbmw.specs.model_spec import ACTIVATION_DTYPE_BYTES, ModelSpec
from gbmw.cost.layer_cost import (CostSettings, LayerCosts, _data_parallel_sync, collective_time_s,
                                  forward_compute_s, framework_overheads_s, model_state_bytes_per_parameter, optimizer_shards,
                                  tp_local_parameters)


def reference_layer_costs(
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
    # Under +etpN the experts' share runs over the ETP group instead (gbmw.cost.expert_parallel).
    tp_stride = strategy.stride("tp") if tp > 1 else 1
    tp_bytes, expert_tp_bytes = expert_tp_bytes_per_sample(model, strategy)
    tp_forward = collective_time_s(comm.allreduce_s, tp_bytes * samples, tp, tp_stride)
    if strategy.expert_tp is not None:
        tp_forward = tp_forward + collective_time_s(comm.allreduce_s, expert_tp_bytes * samples, strategy.expert_tp,
                                                    tp_stride)

    # Expert parallelism: the routed experts leave the data-parallel group for the expert-data-parallel one.
    experts = expert_parallel_costs(model, strategy, samples, comm, settings.cluster.linear_flops(settings.precision))
    local_parameters = tp_local_parameters(model, tp)
    split_experts = strategy.ep > 1
    dense_parameters = local_parameters - experts.expert_parameters if split_experts else local_parameters
    rank_experts = experts.rank_expert_parameters
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
    unfused_forward, unfused_backward = unfused_pass_times_s(
        settings.unfused_passes_framework, ACTIVATION_DTYPE_BYTES[model.precision], arrays, samples, tp, strategy.sp)
    forward_compute = forward_compute + unfused_forward / settings.cluster.memory_bandwidth_bytes_per_s
    backward_compute = backward_compute + unfused_backward / settings.cluster.memory_bandwidth_bytes_per_s
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
        / attention_rate, settings.framework)
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
    weight_copy = (dense_parameters * autocast_weight_copy_bytes(settings.framework, settings.precision, strategy.tp)
                   + rank_experts * autocast_weight_copy_bytes(settings.framework, settings.precision,
                                                               strategy.expert_tensor_parallel)) * not_embedding
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
        if settings.framework in ("megatron", "gbmw-runtime"):  # the runtime: ETP = TP (expert_sequence_parallel)
            intermediate = intermediate + expert_input_gathered_bytes(
                arrays.expert_input_activation_bytes_per_sample * samples, tp, strategy.expert_tensor_parallel)
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
    backward_memory = backward_memory + gathered_parameters * gradient_bytes
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
        if strategy.expert_tp is not None:  # a routed expert's weight gradient at 1/ETP, where it is the larger
            backward_memory = backward_memory + np.maximum(
                0.0, arrays.expert_largest_weight_gradient_bytes / strategy.expert_tp
                - arrays.largest_weight_gradient_tp_split_bytes / tp)
        # a head's cross-entropy: what it holds beside the kept softmax (torch's on one device, megatron-core's in place)
        backward_memory = backward_memory + arrays.loss_logits_per_sample * samples / tp * (
            cross_entropy_workspace_bytes_per_logit(settings.framework, settings.precision, tp))
        # +sp: the column-parallel linears' input all-gathered again for their weight gradients
        backward_memory = backward_memory + np.where(kinds == "embedding", 0.0, residual) * samples * (
            sequence_parallel_gather_share(settings.framework, strategy))
    # the framework's all-gather buffer: beside a block's backward one of its size (the next block's, prefetched); a
    # ZeRO-3 head gathers again before its backward computes and frees its buffer first, and a ZeRO-1/2 layer that
    # recomputes gathers nothing in backward and reduce-scatters once its rebuilt stash is freed (the larger of the two)
    gather_buffer = (dense_parameters * gather_buffer_bytes_per_parameter(settings.framework, weights, parameter_bytes)
                     + rank_experts * gather_buffer_bytes_per_parameter(settings.framework, expert_strategy,
                                                                         parameter_bytes))
    regathering_head = np.array([layer.kind == "head" for layer in model.layers]) & (weights.degree("sdp") > 1)
    recomputing_gathered = strategy.ckpt and weights.degree("sdp") == 1
    # routed experts sharded in their own unit (EP, ZeRO-3): the layer's dense part is what is prefetched beside them
    experts_apart = (rank_experts > 0) & (expert_strategy.degree("sdp") > 1)
    dense_buffer = dense_parameters * gather_buffer_bytes_per_parameter(settings.framework, weights, parameter_bytes)
    prefetched_buffer = np.where(regathering_head | recomputing_gathered, 0.0,
                                 np.where(experts_apart, dense_buffer, gather_buffer))
    backward_memory = gathered_parameters * parameter_bytes + np.maximum(gather_buffer - prefetched_buffer,
                                                                         backward_memory + prefetched_buffer)
    # the gated activation's working set, in a checkpointed layer's recomputation and in forward, where it holds more
    # (the routed experts are their own FSDP2 unit under EP with an expert-data-parallel group to shard over)
    experts_buffer = rank_experts * gather_buffer_bytes_per_parameter(settings.framework, expert_strategy,
                                                                      parameter_bytes)
    experts_own_unit = (strategy.ep > 1) & (experts_buffer > 0)
    if strategy.ckpt:
        # the recomputation, a forward again: ZeRO-3 gathers whole weights beside the running unit's buffer; ZeRO-2/3
        # recompute beside the reduce-scatter input of the unit above
        dense_regathered = weights.degree("sdp") > 1
        experts_sharded = gather_buffer_bytes_per_parameter(settings.framework, expert_strategy, parameter_bytes) > 0
        held_weights = recomputation_weight_bytes(
            dense_regathered, weights.degree("sdp") * weights.degree("z2dp") > 1, experts_own_unit,
            dense_parameters * parameter_bytes * dense_regathered,
            rank_experts * parameter_bytes * (expert_strategy.degree("sdp") > 1), gather_buffer, experts_buffer,
            dense_parameters * gradient_bytes, rank_experts * gradient_bytes * experts_sharded)
        backward_memory = np.maximum(backward_memory, gated_activation_peak_bytes(
            settings.framework, settings.precision, model, strategy, samples, d,
            held_weights + intermediate + weight_copy + output_gradient))
    # in forward, beside the all-gather buffer of the FSDP2 unit running it (the routed experts' own
    # unit, else the whole layer's)
    backward_memory = np.maximum(backward_memory, gated_activation_forward_bytes(
        settings.framework, settings.precision, model, strategy.tp, strategy.ep, strategy.expert_tensor_parallel,
        samples, d, strategy.ckpt,
        gathered_parameters * parameter_bytes, np.where(experts_own_unit, gather_buffer - experts_buffer, gather_buffer),
        np.where(experts_own_unit, experts_buffer, gather_buffer)))
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
