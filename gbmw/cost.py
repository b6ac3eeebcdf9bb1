"""The cost estimator: per-layer time and memory under each strategy, transitions, stages, pipeline.

Paper Sec. 5 and Appendix C. For one micro-batch of `micro_batch` samples entering a stage whose
group has G devices, a layer under strategy S (data-parallel ways d, TP degree t) processes
micro_batch / d samples per device:

* compute: forward = per-sample time × samples / t (profiled time, or FLOPs over the device's
  sustained FLOP/s); backward = 2 × forward unless profiled; CKPT adds one forward (recompute) before backward.
* TP: the layer's all-reduces in forward and as many in backward (and again in the recompute).
* DP/SDP: SDP all-gathers parameters before forward and backward and reduce-scatters gradients
  every micro-batch (DeepSpeed ZeRO-3 keeps no unsharded gradients across micro-batches);
  DP all-reduces gradients once per iteration, on the last micro-batch (Appendix C); ZeRO-1
  reduce-scatters gradients and all-gathers updated parameters then; ZeRO-2 reduce-scatters every
  micro-batch and all-gathers parameters on the last. Backward DP/SDP communication overlaps
  backward compute and both slow down by the cluster's overlap factor f while they share the
  device: time = max(c, g) + (f - 1) · min(c, g).
* memory (bytes per device): model states per precision and optimizer, divided by the sharding
  axes; forward-stashed activations f (boundary + intermediate, or boundary only under CKPT);
  backward extra b (the recomputed intermediates of a CKPT layer, the gathered parameters and
  gradients of an SDP layer) — the O_f, O_b, O_ms of Eq. (4)–(5).

Stages add the transition cost R between neighbouring layers whose activation layouts differ
(Eq. 6), the p2p transfers to neighbouring stages, and the 1F1B stash: stage i of P keeps the
activations of min(P - i, m) micro-batches. The pipeline time is Eq. (9).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gbmw.comm import CommModel
from gbmw.errors import PlanError
from gbmw.plan import Estimate, Plan
from gbmw.ranks import activation_layout, transition_fraction
from gbmw.cluster_spec import ClusterSpec
from gbmw.jobs import JobSpec
from gbmw.model_spec import ModelSpec
from gbmw.space import DATA_PARALLEL_AXES, Strategy

#: Bytes per parameter of (parameters, gradients, optimizer states) by precision and optimizer.
#: Mixed precision keeps 16-bit parameters and gradients and an fp32 master copy with Adam's two
#: moments (Rajbhandari et al., "ZeRO", Sec. 3.1: 2 + 2 + 12 bytes); fp32 keeps 4 + 4 + 8.
MODEL_STATE_BYTES: dict[tuple[str, str], tuple[int, int, int]] = {
    ("fp32", "adam"): (4, 4, 8),
    ("fp16", "adam"): (2, 2, 12),
    ("bf16", "adam"): (2, 2, 12),
    ("fp32", "sgd"): (4, 4, 0),
    ("fp16", "sgd"): (2, 2, 4),
    ("bf16", "sgd"): (2, 2, 4),
}


@dataclass(frozen=True)
class CostSettings:
    """What the costs depend on besides the layers and strategies."""

    cluster: ClusterSpec
    precision: str
    optimizer: str = "adam"


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


def model_state_bytes_per_parameter(strategy: Strategy, precision: str, optimizer: str) -> float:
    """Bytes of model states per (TP-local) parameter on one device under `strategy`'s sharding."""
    parameter_bytes, gradient_bytes, optimizer_bytes = MODEL_STATE_BYTES[(precision, optimizer)]
    zero3 = strategy.degree("sdp")
    zero2 = zero3 * strategy.degree("z2dp")
    zero1 = zero2 * strategy.degree("z1dp")
    return parameter_bytes / zero3 + gradient_bytes / zero2 + optimizer_bytes / zero1


def tp_local_parameters(model: ModelSpec, tp: int) -> np.ndarray:
    arrays = model.arrays
    return arrays.tp_split_parameter_count / tp + (arrays.parameter_count - arrays.tp_split_parameter_count)


def forward_time_per_sample_s(model: ModelSpec, settings: CostSettings) -> np.ndarray:
    """Measured per-sample forward time where profiled, else FLOPs / sustained FLOP/s."""
    arrays = model.arrays
    analytic = arrays.forward_flops_per_sample / settings.cluster.sustained_flops(settings.precision)
    return np.where(arrays.has_measured_time, arrays.forward_time_per_sample_s, analytic)


def _framework_overheads_s(model: ModelSpec, strategy: Strategy, settings: CostSettings, comm: CommModel,
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
        tp_comm = 2 * _vector(comm.allreduce_s, arrays.tp_allreduce_bytes_per_sample * batch, 2, 1)
        overhead += np.where(arrays.tp2_time_s > 0,
                             np.maximum(0.0, arrays.tp2_time_s - charged_compute(2) - tp_comm), 0.0)
        if strategy.ckpt:
            forward_charged = forward_per_sample * batch / 2 + arrays.forward_overhead_s + tp_comm / 2
            recompute_overhead += np.where(arrays.tp2_forward_time_s > 0,
                                           np.maximum(0.0, arrays.tp2_forward_time_s - forward_charged), 0.0)
    if strategy.degree("sdp") > 1:
        gathers = 2 * _vector(comm.allgather_s, arrays.parameter_count * parameter_bytes, 2, 1)
        scatter = _vector(comm.reduce_scatter_s, arrays.parameter_count * gradient_bytes, 2, 1)
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
    parameter_bytes, gradient_bytes, _ = MODEL_STATE_BYTES[(settings.precision, settings.optimizer)]
    tp = strategy.tp
    samples = micro_batch / strategy.data_parallel
    slowdown = settings.cluster.overlap_slowdown

    # Compute.
    forward_compute = forward_time_per_sample_s(model, settings) * samples / tp + arrays.forward_overhead_s
    backward_compute = np.where(arrays.has_measured_backward,
                                arrays.backward_time_per_sample_s * samples / tp + arrays.backward_overhead_s,
                                2.0 * forward_compute)

    # Tensor-parallel all-reduces (blocking, not overlapped).
    tp_stride = strategy.stride("tp") if tp > 1 else 1
    tp_forward = _vector(comm.allreduce_s, arrays.tp_allreduce_bytes_per_sample * samples, tp, tp_stride)

    # Data-parallel communication of this layer's (TP-local) parameters and gradients.
    local_parameters = tp_local_parameters(model, tp)
    every_micro_batch = np.zeros(model.num_layers)  # backward, overlappable
    forward_gather = np.zeros(model.num_layers)
    last_micro_batch = np.zeros(model.num_layers)  # backward, overlappable, once per iteration
    shard = 1
    for axis, degree in strategy.dims:
        if axis not in DATA_PARALLEL_AXES:
            continue
        stride = strategy.stride(axis)
        shard_parameters = local_parameters / shard
        if axis == "sdp":
            gather = _vector(comm.allgather_s, shard_parameters * parameter_bytes, degree, stride)
            forward_gather += gather
            every_micro_batch += gather + _vector(comm.reduce_scatter_s, shard_parameters * gradient_bytes, degree, stride)
            shard *= degree
        elif axis == "z2dp":
            every_micro_batch += _vector(comm.reduce_scatter_s, shard_parameters * gradient_bytes, degree, stride)
            last_micro_batch += _vector(comm.allgather_s, shard_parameters * parameter_bytes, degree, stride)
        elif axis == "z1dp":
            last_micro_batch += _vector(comm.reduce_scatter_s, shard_parameters * gradient_bytes, degree, stride)
            last_micro_batch += _vector(comm.allgather_s, shard_parameters * parameter_bytes, degree, stride)
        else:  # dp
            last_micro_batch += _vector(comm.allreduce_s, shard_parameters * gradient_bytes, degree, stride)

    framework, recompute_framework = _framework_overheads_s(model, strategy, settings, comm, parameter_bytes,
                                                            gradient_bytes)

    def overlapped(compute: np.ndarray, communication: np.ndarray) -> np.ndarray:
        return np.maximum(compute, communication) + (slowdown - 1.0) * np.minimum(compute, communication)

    forward = forward_compute + tp_forward + forward_gather + framework
    recompute = (forward_compute + tp_forward + recompute_framework) if strategy.ckpt else 0.0
    backward_common = tp_forward + recompute
    time_no_sync = forward + backward_common + overlapped(backward_compute, every_micro_batch)
    time_sync = forward + backward_common + overlapped(backward_compute, every_micro_batch + last_micro_batch)

    # Memory.
    boundary = arrays.boundary_activation_bytes_per_sample * samples
    intermediate = (
        arrays.intermediate_activation_bytes_per_sample + arrays.intermediate_tp_split_activation_bytes_per_sample / tp
    ) * samples
    if strategy.ckpt:
        forward_memory, backward_memory = boundary, intermediate.copy()
    else:
        forward_memory, backward_memory = boundary + intermediate, np.zeros(model.num_layers)
    sdp = strategy.degree("sdp")
    if sdp > 1:  # the gathered full parameters and unscattered gradients of the running layer
        backward_memory = backward_memory + local_parameters * (parameter_bytes + gradient_bytes) * (1 - 1 / sdp)
    states = local_parameters * model_state_bytes_per_parameter(strategy, settings.precision, settings.optimizer)
    return LayerCosts(
        time_s=time_sync,
        time_no_grad_sync_s=time_no_sync,
        forward_memory_bytes=forward_memory,
        backward_memory_bytes=backward_memory,
        model_state_bytes=states,
        samples_per_device=samples,
        optimizer_parameters=local_parameters / (sdp * strategy.degree("z2dp") * strategy.degree("z1dp")),
    )


def _vector(function, message_bytes: np.ndarray, size: int, stride: int) -> np.ndarray:
    """Apply a collective time function to each layer's message (times are affine in the size);
    a layer with nothing to send costs nothing."""
    if size <= 1:
        return np.zeros_like(message_bytes)
    base = function(0.0, size, stride)
    per_byte = function(1.0, size, stride) - base
    return np.where(message_bytes > 0, base + per_byte * message_bytes, 0.0)


# ----------------------------------------------------------------------------------------------
# Transition cost R (Eq. 6) from activation layouts
# ----------------------------------------------------------------------------------------------


def transition_time_s(
    previous: Strategy, current: Strategy, boundary_bytes_per_sample: float, micro_batch: float, comm: CommModel,
    overhead_s: float = 0.0,
) -> float:
    """R(l, S_i, S_j): Slice-Gather time between neighbouring layers (0 when the layouts agree), plus the
    profiled per-call overhead (`slice_gather_overhead_s`)."""
    fraction = transition_fraction(previous, current)
    if fraction == 0.0:
        return 0.0
    return comm.exchange_s(fraction * boundary_bytes_per_sample * micro_batch, previous.group_size) + overhead_s


def pipeline_send_s(model: ModelSpec, comm: CommModel, message_bytes: float, stage_devices: int) -> float:
    """One stage-to-stage transfer: the cluster's p2p time plus, for profiled models, what the runtime's
    measured transfer on the pair took beyond that model (paired isend/irecv and the wait)."""
    if message_bytes <= 0:
        return 0.0
    overhead = 0.0
    measured_s, measured_bytes = model.measured("p2p_time_s"), model.measured("p2p_bytes")
    if measured_s and measured_bytes:
        overhead = max(0.0, measured_s - comm.p2p_s(measured_bytes, 1))
    return comm.p2p_s(message_bytes, stage_devices) + overhead


def slice_gather_overhead_s(model: ModelSpec, comm: CommModel) -> float:
    """Per transition: what the profiled Slice-Gather on the pair (sliced in two ↔ replicated, so half the
    micro-batch received) took beyond the exchange model — the runtime's two all-gathers (forward and
    backward) and its autograd bookkeeping, where the model has one exchange. 0 for analytic models."""
    measured_s, measured_bytes = model.measured("slice_gather_time_s"), model.measured("slice_gather_bytes")
    if not measured_s or not measured_bytes:
        return 0.0
    return max(0.0, measured_s - comm.exchange_s(0.5 * measured_bytes, 2))


# ----------------------------------------------------------------------------------------------
# Stages and the pipeline (Eq. 9, Appendix C; 1F1B stash)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageEstimate:
    first_layer: int
    num_layers: int
    time_s: float
    """C(M_i, B_m): one micro-batch through the stage, gradient synchronisation included."""
    time_no_grad_sync_s: float
    peak_memory_bytes: float
    model_state_bytes: float
    activation_bytes: float
    """Peak activation memory (stash of in-flight micro-batches plus the backward extra)."""
    in_flight_micro_batches: int
    optimizer_time_s: float = 0.0
    """The optimizer step over the stage's (ZeRO-sharded) parameters, once per iteration (profiled models only)."""
    stashed_activation_bytes: float = 0.0
    """The stash alone: in-flight micro-batches × what each keeps from forward to backward (no backward extra)."""


def stage_estimate(
    model: ModelSpec,
    strategies: list[Strategy],
    first_layer: int,
    stage_index: int,
    pp: int,
    micro_batch: float,
    num_micro_batches: int,
    settings: CostSettings,
    comm: CommModel,
    cost_cache: dict | None = None,
    schedule: str = "1f1b",
) -> StageEstimate:
    """Time and peak memory of one pipeline stage holding layers [first_layer, first_layer + len(strategies))."""
    cache = cost_cache if cost_cache is not None else {}
    count = len(strategies)
    layers = range(first_layer, first_layer + count)
    arrays = model.arrays
    time = no_sync = 0.0
    forward_memory, backward_memory, states = np.zeros(count), np.zeros(count), np.zeros(count)
    optimizer_parameters = 0.0
    side_input_stashed = False
    for position, (layer, strategy) in enumerate(zip(layers, strategies)):
        if strategy not in cache:
            cache[strategy] = layer_costs(model, strategy, micro_batch, settings, comm)
        costs = cache[strategy]
        time += costs.time_s[layer]
        no_sync += costs.time_no_grad_sync_s[layer]
        forward_memory[position] = costs.forward_memory_bytes[layer]
        backward_memory[position] = costs.backward_memory_bytes[layer]
        tied = arrays.tied_to_index[layer]
        states[position] = costs.model_state_bytes[layer]
        optimizer_parameters += costs.optimizer_parameters[layer]
        if tied >= 0 and first_layer <= tied < first_layer + count:  # one copy of weights shared in the stage
            states[position] -= arrays.tied_parameter_count[layer] / strategy.tp * model_state_bytes_per_parameter(
                strategy, settings.precision, settings.optimizer
            )
            optimizer_parameters -= arrays.tied_parameter_count[layer] / strategy.tp / (
                strategy.degree("sdp") * strategy.degree("z2dp") * strategy.degree("z1dp"))
        side = arrays.side_input_bytes_per_sample[layer]
        if side > 0 and not side_input_stashed:  # the encoder output, stashed once per stage
            forward_memory[position] += side * costs.samples_per_device
            side_input_stashed = True
        if position:
            transition = transition_time_s(
                strategies[position - 1], strategy, arrays.boundary_activation_bytes_per_sample[layer], micro_batch, comm,
                slice_gather_overhead_s(model, comm),
            )
            time += transition
            no_sync += transition
    # p2p: send the output forward and the input's gradient backward, as the sending device.
    group = strategies[0].group_size
    send = 0.0
    last = first_layer + count - 1
    if stage_index < pp - 1:
        out_bytes = arrays.boundary_activation_bytes_per_sample[last + 1] + arrays.side_input_bytes_per_sample[last + 1]
        send += pipeline_send_s(model, comm, out_bytes * micro_batch / strategies[-1].data_parallel, group)
    if stage_index > 0:
        in_bytes = arrays.boundary_activation_bytes_per_sample[first_layer] + arrays.side_input_bytes_per_sample[first_layer]
        send += pipeline_send_s(model, comm, in_bytes * micro_batch / strategies[0].data_parallel, group)
    time += send
    no_sync += send
    in_flight = in_flight_micro_batches(schedule, stage_index, pp, num_micro_batches)
    activations = (in_flight - 1) * forward_memory.sum() + float(
        np.max(np.cumsum(forward_memory) + backward_memory)
    )
    return StageEstimate(
        first_layer=first_layer,
        num_layers=count,
        time_s=float(time),
        time_no_grad_sync_s=float(no_sync),
        peak_memory_bytes=float(states.sum() + activations),
        model_state_bytes=float(states.sum()),
        activation_bytes=float(activations),
        in_flight_micro_batches=in_flight,
        optimizer_time_s=float(optimizer_parameters * (model.measured("optimizer_step_s_per_parameter") or 0.0)),
        stashed_activation_bytes=float(in_flight * forward_memory.sum()),
    )


def in_flight_micro_batches(schedule: str, stage_index: int, pp: int, num_micro_batches: int) -> int:
    """Micro-batches whose activations a stage holds at its peak: 1F1B-flush keeps min(P - i, m)
    (Narayanan et al., 2021); GPipe runs every forward before any backward and keeps all m."""
    if schedule == "gpipe":
        return num_micro_batches
    return min(pp - stage_index, num_micro_batches)


def pipeline_time_s(stages: list[StageEstimate], num_micro_batches: int) -> float:
    """Eq. (9): (m - 1) · max_i C_no_grad_sync(M_i) + Σ_i C(M_i), plus the slowest stage's optimizer step
    (0 unless the model was profiled: the paper's estimator leaves it out)."""
    slowest = max(stage.time_no_grad_sync_s for stage in stages)
    optimizer = max(stage.optimizer_time_s for stage in stages)
    return (num_micro_batches - 1) * slowest + sum(stage.time_s for stage in stages) + optimizer


# ----------------------------------------------------------------------------------------------
# A whole plan
# ----------------------------------------------------------------------------------------------


def estimate_plan(job: JobSpec, plan: Plan, memory_budget_bytes: float | None = None) -> Estimate:
    """Iteration time (Eq. 9), throughput, per-stage time and peak memory of `plan` for `job`."""
    plan.check_against(job.model, job.cluster.num_devices)
    settings = CostSettings(job.cluster, job.precision, job.optimizer)
    comm = CommModel(job.cluster)
    cache: dict = {}
    stages = [
        stage_estimate(
            job.model, list(plan.stage_strategies(index)), first, index, plan.pp, plan.micro_batch,
            plan.num_micro_batches, settings, comm, cache, plan.schedule,
        )
        for index, (first, _) in enumerate(plan.stage_bounds)
    ]
    iteration_s = pipeline_time_s(stages, plan.num_micro_batches)
    if iteration_s <= 0:
        raise PlanError(
            f"model {job.model.name}: the estimated iteration time is 0 — its layers have no FLOPs, measured "
            "times or communication; check forward_flops_per_sample in the model spec"
        )
    budget = float(memory_budget_bytes if memory_budget_bytes is not None else job.memory_budget_bytes)
    model_flops = 3.0 * job.model.forward_flops_per_sample * plan.global_batch
    tflops_per_device = model_flops / iteration_s / plan.num_devices / 1e12
    return Estimate(
        iteration_time_s=iteration_s,
        samples_per_s=plan.global_batch / iteration_s,
        stage_time_s=tuple(stage.time_s for stage in stages),
        stage_peak_memory_bytes=tuple(stage.peak_memory_bytes for stage in stages),
        stage_model_state_bytes=tuple(stage.model_state_bytes for stage in stages),
        stage_activation_bytes=tuple(stage.activation_bytes for stage in stages),
        memory_budget_bytes=budget,
        fits=all(stage.peak_memory_bytes <= budget for stage in stages),
        model_tflops_per_device=tflops_per_device,
        mfu=tflops_per_device * 1e12 / job.cluster.peak_flops(job.precision),
    )


# ----------------------------------------------------------------------------------------------
# All candidate strategies at once (what the search reads)
# ----------------------------------------------------------------------------------------------


@dataclass
class StrategyTables:
    """Per-strategy, per-layer costs ([strategy, layer] arrays) for one micro-batch size and group size."""

    strategies: tuple[Strategy, ...]
    micro_batch: int
    time_s: np.ndarray
    time_no_grad_sync_s: np.ndarray
    forward_memory_bytes: np.ndarray
    backward_memory_bytes: np.ndarray
    model_state_bytes: np.ndarray
    optimizer_parameters: np.ndarray
    state_bytes_per_parameter: np.ndarray
    """[strategy]: model-state bytes per TP-local parameter (for tied weights shared in a stage)."""
    tp: np.ndarray
    data_parallel: np.ndarray
    layout: np.ndarray
    """[strategy]: activation-layout id; strategies with equal ids need no Slice-Gather between them."""
    transition_fraction: np.ndarray
    """[layout, layout]: share of the micro-batch's boundary activation one device receives (R)."""


def strategy_tables(
    model: ModelSpec, strategies: list[Strategy], micro_batch: int, settings: CostSettings, comm: CommModel
) -> StrategyTables:
    """`layer_costs` of every strategy, stacked, with layout ids and the layout transition matrix."""
    costs = [layer_costs(model, strategy, micro_batch, settings, comm) for strategy in strategies]
    layouts: dict[tuple, int] = {}
    layout_ids = np.array([layouts.setdefault(activation_layout(s), len(layouts)) for s in strategies])
    representative = {}
    for strategy, layout in zip(strategies, layout_ids):
        representative.setdefault(int(layout), strategy)
    count = len(layouts)
    fraction = np.zeros((count, count))
    for a in range(count):
        for b in range(count):
            if a != b:
                fraction[a, b] = transition_fraction(representative[a], representative[b])
    return StrategyTables(
        strategies=tuple(strategies),
        micro_batch=micro_batch,
        time_s=np.stack([c.time_s for c in costs]),
        time_no_grad_sync_s=np.stack([c.time_no_grad_sync_s for c in costs]),
        forward_memory_bytes=np.stack([c.forward_memory_bytes for c in costs]),
        backward_memory_bytes=np.stack([c.backward_memory_bytes for c in costs]),
        model_state_bytes=np.stack([c.model_state_bytes for c in costs]),
        optimizer_parameters=np.stack([c.optimizer_parameters for c in costs]),
        state_bytes_per_parameter=np.array(
            [model_state_bytes_per_parameter(s, settings.precision, settings.optimizer) for s in strategies]
        ),
        tp=np.array([s.tp for s in strategies]),
        data_parallel=np.array([s.data_parallel for s in strategies]),
        layout=layout_ids,
        transition_fraction=fraction,
    )
