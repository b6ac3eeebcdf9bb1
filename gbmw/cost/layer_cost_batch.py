"""`layer_costs` (gbmw.cost.layer_cost) of many strategies in one numpy pass: [strategy, layer] arrays.

A search costs every strategy of a device group at every micro-batch size — thousands of `layer_costs` calls per
complete search, each a hundred small numpy operations over the layers, so that their fixed cost, not the
arithmetic, was most of the search's time (issue 29). Here the same terms are computed once for all strategies of
one micro-batch size: each number layer_costs takes from the strategy (the samples a rank holds, the TP degree, a
collective's latency and time per byte, the bytes kept per parameter) is a column of a [strategy, layer] array, and
each branch layer_costs takes for one strategy is an `np.where` over the rows, or its term is 0 on the other rows.

The results are those of `layer_costs`, bit for bit: every element is computed by the same IEEE operations in the
same order (broadcasting a column does not change an operation; a term added as 0.0 where layer_costs adds none
leaves the sum as it was, the terms being non-negative). The terms few strategies have and whose per-strategy
functions loop in Python anyway — context parallelism's, FP8 current scaling's amax reductions — and the profiled
framework overheads, which depend on three flags only, come from layer_cost's own functions, row by row.
tests/test_layer_cost_batch.py compares the two on GPT, LLaMA, MoE, T5, BERT and Swin models over every strategy of
their search spaces; a change to one is a change to both.
"""

from __future__ import annotations

import numpy as np

from gbmw.cost.comm import CommModel
from gbmw.cost.context_parallel import context_parallel_costs
from gbmw.cost.expert_parallel import expert_input_gathered_bytes
from gbmw.cost.fp8 import amax_reductions_s, fp8_cast_s, fp8_weight_copy_bytes
from gbmw.cost.framework_memory import (expert_call_rows, fp32_residual_extra_share, gated_activation_forward_bytes,
                                        gated_activation_working_bytes_per_element, recomputation_weight_bytes,
                                        prices_backward_workspace, runs_autocast)
from gbmw.cost.layer_cost import CostSettings, LayerCosts, framework_overheads_s
from gbmw.cost.matmul_waves import linear_wave_loss_s
from gbmw.cost.runtime_passes import (GRADIENT_ACCUMULATION_BYTES, GRADIENT_UPCAST_BYTES, WEIGHT_CAST_BYTES,
                                      unfused_pass_times_s)
from gbmw.cost.strategy_columns import StrategyColumns, strategy_columns
from gbmw.cost.tp_comm_overlap import exposed_tp_communication_s, overlapped_s
from gbmw.space.strategy import Strategy
from gbmw.specs.model_spec import ACTIVATION_DTYPE_BYTES, ModelSpec


def _rows_of(count: int, per_row: dict[int, np.ndarray], num_layers: int) -> np.ndarray:
    """[strategy, layer]: the arrays of `per_row` in their rows, zeros elsewhere."""
    out = np.zeros((count, num_layers))
    for index, row in per_row.items():
        out[index] = row
    return out


def layer_costs(model: ModelSpec, strategy: Strategy, micro_batch: float, settings: CostSettings,
                comm: CommModel) -> LayerCosts:
    """c(l, S), O_f(l, S), O_b(l, S), O_ms(l, S) of every layer l under one strategy S (gbmw.cost.layer_cost's module
    docstring; paper Eqs. (1)–(4)): the tables of a one-strategy list."""
    return layer_costs_of_strategies(model, [strategy], micro_batch, settings, comm)[0]


def layer_costs_of_strategies(model: ModelSpec, strategies: list[Strategy], micro_batch: float,
                              settings: CostSettings, comm: CommModel) -> list[LayerCosts]:
    """`[layer_costs(model, s, micro_batch, settings, comm) for s in strategies]`, equal to it bit for bit (the module
    docstring); each LayerCosts' arrays are rows of [strategy, layer] arrays."""
    if not strategies:
        return []
    arrays, cluster, precision, framework = model.arrays, settings.cluster, settings.precision, settings.framework
    parameter_bytes, gradient_bytes = settings.states.weights, settings.states.gradients
    layers, count = model.num_layers, len(strategies)
    d = ACTIVATION_DTYPE_BYTES[model.precision]
    columns = strategy_columns(strategies, settings, comm, bool(arrays.expert_parameter_count.any()), d)
    sustained, linear = cluster.sustained_flops(precision), cluster.linear_flops(precision)
    attention, bandwidth = cluster.attention_flops(precision), cluster.memory_bandwidth_bytes_per_s
    samples = micro_batch / columns.data_parallel / columns.sequence_parallel_degree
    samples_list = samples[:, 0].tolist()
    tp, sp, ckpt, selective, ep = columns.tp, columns.sp, columns.ckpt, columns.selective, columns.ep
    zeros = np.zeros((count, layers))

    # Compute (layer_cost.forward_compute_s, with `tp if sequence_parallel else 1` a column).
    flash, fp8 = arrays.forward_flash_attention_flops_per_sample, arrays.fp8_forward_flops_per_sample
    replicated = arrays.tp_replicated_forward_flops_per_sample / np.where(fp8 > 0, linear, sustained)
    split = ((arrays.forward_flops_per_sample - flash - fp8) / sustained + fp8 / linear
             + arrays.flash_kernel_flops_per_sample / attention
             + arrays.forward_tp_split_memory_traffic_bytes_per_sample / bandwidth) - replicated
    whole = arrays.forward_memory_traffic_bytes_per_sample / bandwidth + replicated
    analytic = split * samples / tp + whole * samples / np.where(sp, tp, 1)
    measured = arrays.forward_time_per_sample_s * samples / tp + arrays.forward_overhead_s
    forward_compute = np.where(arrays.has_measured_time, measured, analytic)
    backward_compute = np.where(arrays.has_measured_backward,
                                arrays.backward_time_per_sample_s * samples / tp + arrays.backward_overhead_s,
                                2.0 * forward_compute)
    forward_wave_loss, backward_wave_loss = _wave_loss_rows(model, settings, samples, tp, sp)
    forward_compute = forward_compute + forward_wave_loss
    backward_compute = backward_compute + backward_wave_loss
    attention_rate = np.where(flash > 0, attention, sustained)
    backward_compute = backward_compute + np.where(
        arrays.has_measured_time, 0.0, 0.5 * arrays.flash_kernel_flops_per_sample * samples / tp / attention_rate)

    # Tensor-parallel all-reduces.
    # (gbmw.cost.expert_parallel.expert_tp_bytes_per_sample: under +etpN the experts' share runs over the ETP group)
    differs = columns.expert_tp_differs
    tp_forward = columns.tp_allreduce.time_s(np.where(differs, np.maximum(
        arrays.tp_allreduce_bytes_per_sample - arrays.expert_dispatch_bytes_per_sample, 0.0) * samples,
        arrays.tp_allreduce_bytes_per_sample * samples))
    if differs.any():
        tp_forward = tp_forward + columns.expert_tp_allreduce.time_s(
            arrays.expert_dispatch_bytes_per_sample * columns.expert_tp / tp * samples)

    # Expert parallelism (gbmw.cost.expert_parallel.expert_parallel_costs).
    expert_parameters = arrays.expert_parameter_count / tp
    alltoall_forward, extra_forward_compute, extra_activation = zeros, zeros, zeros
    if columns.routed.any():
        load, routed = arrays.expert_load_factor, columns.routed
        received = arrays.expert_dispatch_bytes_per_sample * samples / np.where(sp, tp, 1) * load
        alltoall_forward = np.where(routed & (received > 0), 2 * (
            received * columns.alltoall_per_byte_s + columns.alltoall_latency_s), 0.0)
        extra_forward_compute = np.where(
            routed, (load - 1) * arrays.expert_forward_flops_per_sample * samples / tp / linear, 0.0)
        extra_activation = np.where(routed, (load - 1) * (
            arrays.expert_activation_bytes_per_sample + arrays.expert_tp_split_activation_bytes_per_sample / tp)
            * samples, 0.0)
    split_experts = ep > 1
    local_parameters = arrays.tp_split_parameter_count / tp + (arrays.parameter_count
                                                               - arrays.tp_split_parameter_count)
    dense_parameters = np.where(split_experts, local_parameters - expert_parameters, local_parameters)
    rank_experts = np.where(split_experts, arrays.expert_parameter_count / columns.expert_tp / ep, 0.0)
    device_parameters = dense_parameters + rank_experts
    fp8_whole = arrays.fp8_tp_replicated_parameter_count
    fp8_routed = np.minimum(arrays.expert_parameter_count, arrays.fp8_parameter_count)
    fp8_experts = fp8_routed / tp
    fp8_parameters = ((arrays.fp8_parameter_count - fp8_whole) / tp + fp8_whole - fp8_experts
                      + fp8_routed / columns.expert_tp / ep)
    forward_cast, backward_cast, weight_cast = fp8_cast_s(model, precision, cluster, samples, tp, fp8_parameters,
                                                         settings.fp8_recipe)
    forward_compute = forward_compute + forward_cast
    backward_compute = backward_compute + backward_cast
    # gbmw's runtime under autocast (gbmw.cost.runtime_passes.autocast_pass_times_s)
    kinds = np.array([layer.kind for layer in model.layers])
    if runs_autocast(framework, precision):
        kept_gradients = (dense_parameters / columns.kept_gradient_shards
                          + rank_experts / columns.kept_expert_gradient_shards)
        casts = np.where(kinds == "embedding", 0.0, device_parameters)
        forward_compute = forward_compute + casts * WEIGHT_CAST_BYTES / bandwidth
        backward_compute = (backward_compute + casts * GRADIENT_UPCAST_BYTES / bandwidth
                            + kept_gradients * GRADIENT_ACCUMULATION_BYTES / bandwidth)
    else:
        forward_compute = forward_compute + zeros
        backward_compute = backward_compute + zeros + zeros
    unfused_forward, unfused_backward = unfused_pass_times_s(settings.unfused_passes_framework, d, arrays, samples, tp, sp)
    forward_compute = forward_compute + unfused_forward / bandwidth
    backward_compute = backward_compute + unfused_backward / bandwidth
    forward_amax, backward_amax = zeros, zeros
    if precision == "fp8" and settings.fp8_recipe == "current":
        amax = [amax_reductions_s(model, precision, "current", s, comm) for s in strategies]
        forward_amax, backward_amax = np.stack([row[0] for row in amax]), np.stack([row[1] for row in amax])

    # Data-parallel communication, one data-parallel axis of each strategy's weights at a time.
    forward_gather, every_micro_batch, last_micro_batch = zeros, zeros, zeros
    for sync_columns, parameters in ([(sync, dense_parameters / sync.shards) for sync in columns.data_parallel_syncs]
                                     + ([(columns.expert_sync, rank_experts)] if columns.expert_sync else [])):
        sync = sync_columns.times_s(parameters, parameter_bytes, gradient_bytes)
        forward_gather, every_micro_batch, last_micro_batch = (
            forward_gather + sync[0], every_micro_batch + sync[1], last_micro_batch + sync[2])

    # The profiled framework overheads depend on three flags of the strategy only.
    overheads: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for strategy, flag in zip(strategies, columns.overhead_flags):
        if flag not in overheads:
            overheads[flag] = framework_overheads_s(model, strategy, settings, comm, parameter_bytes, gradient_bytes)
    call_overhead = np.stack([overheads[flag][0] for flag in columns.overhead_flags])
    recompute_overhead = np.stack([overheads[flag][1] for flag in columns.overhead_flags])

    slowdown = cluster.overlap_slowdown

    forward_compute = forward_compute + extra_forward_compute
    backward_compute = backward_compute + 2 * extra_forward_compute
    blocking = backward_blocking = tp_forward + alltoall_forward
    if settings.tp_comm_overlap:  # Transformer Engine runs the +sp layers' TP collectives beside their GEMMs
        overlaps = (tp > 1) & sp
        blocking = alltoall_forward + np.where(
            overlaps, exposed_tp_communication_s(forward_compute, tp_forward, slowdown), tp_forward)
        backward_blocking = alltoall_forward + np.where(
            overlaps, exposed_tp_communication_s(backward_compute, tp_forward, slowdown), tp_forward)
    attention_core_s = ((arrays.attention_core_flops_per_sample - arrays.flash_attention_skipped_flops_per_sample)
                        * samples / tp / attention_rate)
    context = {index: context_parallel_costs(model, s, samples_list[index], comm, attention_core_s[index],
                                             settings.framework)
               for index, s in enumerate(strategies) if s.sequence_axis is not None}
    context_forward = _rows_of(count, {i: c.forward_s for i, c in context.items()}, layers)
    context_backward = _rows_of(count, {i: c.backward_s for i, c in context.items()}, layers)
    context_transient = _rows_of(count, {i: c.transient_bytes for i, c in context.items()}, layers)
    forward = forward_compute + blocking + forward_amax + forward_gather + call_overhead + context_forward
    full_recompute = forward_compute + blocking + forward_amax + recompute_overhead + context_forward
    selective_per_sample = (arrays.attention_core_flops_per_sample / attention_rate
                            + arrays.attention_core_memory_traffic_bytes_per_sample / bandwidth)
    recompute = np.where(ckpt, full_recompute, np.where(selective, selective_per_sample * samples / tp, 0.0))
    backward_common = backward_blocking + backward_amax + recompute + context_backward
    time_no_sync = forward + backward_common + overlapped_s(backward_compute, every_micro_batch, slowdown)
    synchronised = overlapped_s(backward_compute, every_micro_batch + last_micro_batch, slowdown)
    time_sync = forward + backward_common + synchronised + weight_cast

    forward_memory, backward_memory = _memory_rows(model, columns, settings, samples, dense_parameters, rank_experts,
                                                   device_parameters, extra_activation, context_transient, kinds, d)
    held_states = (dense_parameters * columns.state_bytes + rank_experts * columns.expert_state_bytes
                   + fp8_parameters * fp8_weight_copy_bytes(precision))
    optimizer_parameters = (dense_parameters / columns.optimizer_shards
                            + rank_experts / columns.expert_optimizer_shards)
    return [LayerCosts(time_s=time_sync[i], time_no_grad_sync_s=time_no_sync[i], forward_memory_bytes=forward_memory[i],
                       backward_memory_bytes=backward_memory[i], model_state_bytes=held_states[i],
                       samples_per_device=samples_list[i], optimizer_parameters=optimizer_parameters[i])
            for i in range(count)]


def _wave_loss_rows(model: ModelSpec, settings: CostSettings, samples: np.ndarray, tp: np.ndarray, sp: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """gbmw.cost.matmul_waves.layer_wave_loss_s per row: [strategy, layer, matmul] arrays summed over the matmuls."""
    multiprocessors = settings.cluster.device.multiprocessors
    arrays = model.arrays
    if multiprocessors is None:
        zeros = np.zeros((len(samples), model.num_layers))
        return zeros, zeros
    tp, samples, sp = tp[:, :, None], samples[:, :, None], sp[:, :, None]
    whole = arrays.matmul_replicated
    out_features = np.where(arrays.matmul_splits_out, arrays.matmul_out_features / tp, arrays.matmul_out_features)
    in_features = np.where(arrays.matmul_splits_out | whole, arrays.matmul_in_features, arrays.matmul_in_features / tp)
    rate = np.where(arrays.fp8_forward_flops_per_sample > 0, settings.cluster.linear_flops(settings.precision),
                    settings.cluster.sustained_flops(settings.precision))[:, None]
    rows = arrays.matmul_rows_per_sample * samples / np.where(whole & sp, tp, 1)
    forward, backward = linear_wave_loss_s(rows, out_features, in_features, rate, multiprocessors)
    analytic = ~arrays.has_measured_time
    return forward * analytic, backward * analytic


def _memory_rows(model: ModelSpec, columns: StrategyColumns, settings: CostSettings, samples: np.ndarray,
                 dense_parameters: np.ndarray, rank_experts: np.ndarray, device_parameters: np.ndarray,
                 extra_activation: np.ndarray, context_transient: np.ndarray, kinds: np.ndarray, d: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(O_f, O_b) per row: layer_costs' memory terms."""
    arrays, framework, precision = model.arrays, settings.framework, settings.precision
    parameter_bytes, gradient_bytes = settings.states.weights, settings.states.gradients
    tp, sp, ckpt, selective, ep = columns.tp, columns.sp, columns.ckpt, columns.selective, columns.ep
    boundary = arrays.boundary_activation_bytes_per_sample * samples
    intermediate = (arrays.intermediate_activation_bytes_per_sample
                    + arrays.intermediate_tp_split_activation_bytes_per_sample / tp) * samples + extra_activation
    not_embedding = kinds != "embedding"
    weight_copy = (dense_parameters * columns.weight_copy_bytes
                   + rank_experts * columns.expert_weight_copy_bytes) * not_embedding
    residual_share = fp32_residual_extra_share(framework, precision, d)
    fp32_share = residual_share * not_embedding
    tp_input_share = columns.tp_input_share * not_embedding
    residual_inputs = np.where(arrays.residual_input_bytes_per_sample > 0, arrays.residual_input_bytes_per_sample,
                               np.maximum(arrays.tp_allreduce_bytes_per_sample,
                                          arrays.boundary_activation_bytes_per_sample))
    boundary = boundary * (1 + fp32_share)
    intermediate = intermediate + (fp32_share * (residual_inputs - arrays.boundary_activation_bytes_per_sample)
                                   + tp_input_share * residual_inputs) * samples
    # +sp: sequence_parallel_divisor is the TP degree
    boundary = np.where(sp & not_embedding, boundary / tp, boundary)
    split_part = arrays.intermediate_tp_split_activation_bytes_per_sample * samples / tp
    intermediate = np.where(sp, (intermediate - split_part) / tp + split_part, intermediate)
    if framework in ("megatron", "gbmw-runtime"):  # the experts' inputs gathered over the expert TP group
        # (gbmw.cost.expert_parallel; gbmw's runtime: gbmw.adapters.runtime.expert_sequence_parallel, ETP = TP)
        intermediate = intermediate + np.where(sp, expert_input_gathered_bytes(
            arrays.expert_input_activation_bytes_per_sample * samples, tp, columns.expert_tp), 0.0)
    core = np.where(selective, arrays.attention_core_activation_bytes_per_sample * samples / tp, 0.0)
    rebuilt = (np.where(arrays.forward_flash_attention_flops_per_sample > 0, 0.0, core)
               if prices_backward_workspace(framework) else core)
    forward_memory = np.where(ckpt, boundary, boundary + intermediate - core + weight_copy)
    backward_memory = np.where(ckpt, intermediate + weight_copy, rebuilt)
    backward_memory = backward_memory + context_transient
    gathered_parameters = dense_parameters * columns.gathered_share + rank_experts * columns.gathered_expert_share
    backward_memory = backward_memory + gathered_parameters * gradient_bytes
    output_gradient = np.zeros_like(backward_memory)
    if prices_backward_workspace(framework):
        residual = arrays.boundary_activation_bytes_per_sample
        gradient_in_out = (np.where(kinds == "embedding", 0.0, residual)
                           + np.where(kinds == "head", 0.0, np.where(kinds == "embedding",
                                                                      arrays.tp_allreduce_bytes_per_sample, residual)))
        output_gradient = np.where(kinds == "embedding", 0.0, residual) * (1 + residual_share) * samples
        backward_memory = backward_memory + (gradient_in_out * (1 + residual_share) * samples
                                             + (arrays.backward_workspace_tp_split_bytes_per_sample * samples
                                                + arrays.largest_weight_gradient_tp_split_bytes) / tp)
        if columns.expert_tp_differs.any():  # +etpN: a routed expert's weight gradient at 1/ETP, where the larger
            backward_memory = backward_memory + np.where(columns.expert_tp_differs, np.maximum(
                0.0, arrays.expert_largest_weight_gradient_bytes / columns.expert_tp
                - arrays.largest_weight_gradient_tp_split_bytes / tp), 0.0)
        backward_memory = (backward_memory
                           + arrays.loss_logits_per_sample * samples / tp * columns.cross_entropy_bytes_per_logit)
        backward_memory = (backward_memory + np.where(kinds == "embedding", 0.0, residual) * samples
                           * columns.sequence_parallel_gather_share)
    gather_buffer = dense_parameters * columns.gather_buffer_bytes + rank_experts * columns.gather_buffer_expert_bytes
    # beside a block's backward a buffer of its size (the next block's, prefetched); a ZeRO-3 head gathers again before
    # its backward computes and frees its buffer first, and a ZeRO-1/2 layer that recomputes gathers nothing then (its
    # parameters stay gathered from forward) and reduce-scatters after its rebuilt stash is freed: the larger
    # (gbmw.cost.framework_memory)
    # routed experts in their own ZeRO-3 unit: the unit prefetched beside their backward is the layer's dense part
    prefetched_buffer = np.where(((kinds == "head") & (columns.gathered_share > 0))
                                 | (ckpt & (columns.gathered_share == 0)), 0.0, np.where(
        (rank_experts > 0) & (columns.gathered_expert_share > 0), dense_parameters * columns.gather_buffer_bytes,
        gather_buffer))
    backward_memory = gathered_parameters * parameter_bytes + np.maximum(
        gather_buffer - prefetched_buffer, backward_memory + prefetched_buffer)
    # the gated activation's working set (gbmw.cost.framework_memory): gated_activation_peak_bytes in a checkpointed
    # layer's recomputation, beside its rebuilt stash; gated_activation_forward_bytes in forward
    per_element = gated_activation_working_bytes_per_element(framework, precision)
    experts_buffer = rank_experts * columns.gather_buffer_expert_bytes
    experts_own_unit = (ep > 1) & (experts_buffer > 0)
    if per_element:
        experts_sharded = columns.gather_buffer_expert_bytes > 0
        held = recomputation_weight_bytes(
            columns.gathered_share > 0, columns.kept_gradient_shards > 1, experts_own_unit,
            dense_parameters * parameter_bytes * (columns.gathered_share > 0),
            rank_experts * parameter_bytes * (columns.gathered_expert_share > 0), gather_buffer, experts_buffer,
            dense_parameters * gradient_bytes, rank_experts * gradient_bytes * experts_sharded,
        ) + intermediate + weight_copy + output_gradient
        expert_rows = expert_call_rows(framework, precision, columns.expert_tp, ep, arrays.expert_load_factor,
                                       arrays.num_experts)
        elements = np.maximum(arrays.gated_activation_elements_per_sample,
                              arrays.expert_gated_activation_elements_per_sample * expert_rows) * samples / tp
        peak = np.where(ckpt & (elements > 0), elements * (per_element - d) + held, 0.0)  # in the recomputation
        # in forward, beside the all-gather buffer of the FSDP2 unit running the call
        peak = np.maximum(peak, gated_activation_forward_bytes(
            framework, precision, model, tp, ep, columns.expert_tp, samples, d, ckpt,
            gathered_parameters * parameter_bytes,
            np.where(experts_own_unit, gather_buffer - experts_buffer, gather_buffer),
            np.where(experts_own_unit, experts_buffer, gather_buffer)))
    else:
        peak = np.zeros(model.num_layers)
    return forward_memory, np.maximum(backward_memory, peak)
