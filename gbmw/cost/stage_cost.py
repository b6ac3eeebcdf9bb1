"""The cost of a pipeline stage: one model, vectorised over strategies. The stage search (gbmw.search.stage_dp.stage_search)
reads its terms layer by layer and `stage_estimate` sums them for a chosen list of strategies, so a plan's
estimate and the search's value for it are made of the same terms.

A stage's terms at one setting (micro-batch size, pp, micro-batch count m, schedule):
* each layer's c(l, S) with and without gradient synchronisation, O_f, O_b and O_ms (gbmw.cost.layer_cost);
* the transition cost R(l, S_i, S_j) of Eq. (4): a Slice-Gather when neighbouring layers' activation
  layouts differ (gbmw.ranks.transition_fraction);
* receiving the stage's input from the previous stage (and sending its gradient back), and sending the output
  to the next stage — whole, in 1/t scatter-gather pieces, or as the sequence shards +sp layers hold
  (`sequence_sharded_boundary`);
* the 1F1B stash: stage i of P keeps the activations of min(P − i, m) micro-batches (GPipe: all m);
* the side input (the encoder output a T5 decoder stage reads), stashed once per stage;
* the received input a framework keeps beside its own copy (gbmw.cost.framework_memory), with a later stage's first layer;
* a tied weight held once when both of its layers are in the stage.
The pipeline's time from its stages, and the stash per schedule, are gbmw.cost.pipeline_schedules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gbmw.cost.comm import CommModel
from gbmw.cost.framework_memory import (keeps_received_input, shares_tied_weights, step_reserve_bytes,
                                        step_temporary_bytes)
from gbmw.cost.layer_cost import CostSettings, LayerCosts, model_state_bytes_per_parameter
from gbmw.cost.layer_cost_batch import layer_costs_of_strategies
from gbmw.cost.model_states import step_traffic_bytes
from gbmw.cost.pipeline_schedules import in_flight_micro_batches
from gbmw.cost.runtime_passes import runtime_step_traffic_bytes
from gbmw.ranks import data_layout_number, transition_fraction
from gbmw.space.strategy import Strategy
from gbmw.specs.model_spec import ModelSpec


@dataclass
class StrategyTables:
    """Per-strategy, per-layer costs ([strategy, layer] arrays) for one micro-batch size and group size."""

    strategies: tuple[Strategy, ...]
    micro_batch: int
    time_s: np.ndarray
    """c(l, S) on the last micro-batch (gradient synchronisation included)."""
    time_no_grad_sync_s: np.ndarray
    forward_memory_bytes: np.ndarray
    """O_f: stashed from forward to backward, one micro-batch."""
    backward_memory_bytes: np.ndarray
    """O_b: extra while the layer runs backward."""
    model_state_bytes: np.ndarray
    """O_ms: parameters, gradients and optimizer states."""
    optimizer_parameters: np.ndarray
    """Parameters this device's optimizer steps."""
    optimizer_step_s_per_parameter: float
    """The optimizer step's time per parameter it steps: profiled, or its traffic over the memory bandwidth."""
    step_temporary_bytes_per_parameter: float
    """The optimizer step's temporaries per parameter it steps; a stage keeps them free, one chunk at most
    (gbmw.cost.framework_memory.step_reserve_bytes)."""
    keeps_received_input: bool
    """A stage after the first keeps the activation it received beside its own copy (gbmw.cost.framework_memory)."""
    shares_tied_weights: np.ndarray
    """[strategy]: a stage holding both tied layers under it holds the tied weight once (gbmw.cost.framework_memory)."""
    state_bytes_per_parameter: np.ndarray
    """[strategy]: model-state bytes per TP-local parameter (for tied weights shared in a stage)."""
    optimizer_shards: np.ndarray
    """[strategy]: ways the optimizer states are sharded (the product of the ZeRO degrees)."""
    tp: np.ndarray
    data_parallel: np.ndarray
    """[strategy]: ways a micro-batch's activations are split over ranks holding different parts: the
    data-parallel degree times the sequence-parallel one (cp, ulysses) — what a rank stashes, sends and receives
    of a boundary."""
    boundary_shards: np.ndarray
    """[strategy]: pieces a TP group's boundary activation is already split into, each rank sending its own
    (`sequence_sharded_boundary`); 1 where every TP rank holds the whole."""
    layout: np.ndarray
    """[strategy]: activation-layout id; strategies with equal ids need no Slice-Gather between them, and send their
    stage boundaries alike (equal `boundary_shards`)."""
    transition_fraction: np.ndarray
    """[layout, layout]: share of the micro-batch's boundary activation one device receives (R)."""


def strategy_tables(
    model: ModelSpec, strategies: list[Strategy], micro_batch: int, settings: CostSettings, comm: CommModel,
    costs: Sequence[LayerCosts] | None = None,
) -> StrategyTables:
    """`layer_costs` of every strategy (computed for all at once: gbmw.cost.layer_cost_batch), stacked, with layout ids
    and the layout transition matrix; `costs`, one per strategy, are used instead where the caller keeps them
    (gbmw.search.layer_cost_cache)."""
    if costs is None:
        costs = layer_costs_of_strategies(model, strategies, micro_batch, settings, comm)
    shards = np.array([sequence_sharded_boundary(settings.framework, s) for s in strategies])
    layouts: dict[tuple[int, int], int] = {}
    layout_ids = np.array([layouts.setdefault((data_layout_number(s), int(pieces)), len(layouts))
                           for s, pieces in zip(strategies, shards)])
    representative = {}
    for strategy, layout in zip(strategies, layout_ids):
        representative.setdefault(int(layout), strategy)
    count = len(layouts)
    fraction = np.zeros((count, count))
    for a in range(count):
        for b in range(count):
            if a != b:
                fraction[a, b] = transition_fraction(representative[a], representative[b])
    known = _strategy_rows.setdefault(settings, {})  # one hash of the settings per table, not one per strategy
    rows = np.array([known.get(s) or known.setdefault(s, _strategy_row(s, settings)) for s in strategies], float)
    return StrategyTables(
        strategies=tuple(strategies),
        micro_batch=micro_batch,
        time_s=np.stack([c.time_s for c in costs]),
        time_no_grad_sync_s=np.stack([c.time_no_grad_sync_s for c in costs]),
        forward_memory_bytes=np.stack([c.forward_memory_bytes for c in costs]),
        backward_memory_bytes=np.stack([c.backward_memory_bytes for c in costs]),
        model_state_bytes=np.stack([c.model_state_bytes for c in costs]),
        optimizer_parameters=np.stack([c.optimizer_parameters for c in costs]),
        optimizer_step_s_per_parameter=(model.measured("optimizer_step_s_per_parameter")
                                        or (runtime_step_traffic_bytes(settings.framework, settings.optimizer)
                                            or step_traffic_bytes(settings.states))
                                        / settings.cluster.memory_bandwidth_bytes_per_s),
        step_temporary_bytes_per_parameter=step_temporary_bytes(settings.framework, settings.optimizer),
        keeps_received_input=keeps_received_input(settings.framework, settings.precision),
        shares_tied_weights=rows[:, 0].astype(bool),
        state_bytes_per_parameter=rows[:, 1],
        optimizer_shards=rows[:, 2].astype(int),
        tp=rows[:, 3].astype(int),
        data_parallel=rows[:, 4].astype(int),
        boundary_shards=shards,
        layout=layout_ids,
        transition_fraction=fraction,
    )


_strategy_rows: dict[CostSettings, dict[Strategy, tuple]] = {}


def _strategy_row(strategy: Strategy, settings: CostSettings) -> tuple:
    """What a strategy's table row holds that depends on the strategy and the settings alone (every table of a search
    asks again for each micro-batch size): shares tied weights, state bytes per parameter, optimizer shards, TP,
    data-parallel ways. Kept per settings in `_strategy_rows`."""
    view = strategy.gradient_view
    return (float(shares_tied_weights(settings.framework, strategy)),
            model_state_bytes_per_parameter(view, settings),
            view.degree("sdp") * view.degree("z2dp") * view.degree("z1dp"),
            strategy.tp, strategy.data_parallel * strategy.sequence_parallel_degree)


def sequence_sharded_boundary(framework: str, strategy: Strategy) -> int:
    """Pieces a layer's stage-boundary activation is in across its TP group when it reaches the boundary (1: every TP
    rank holds the whole). Under Megatron's sequence parallelism (+sp) each TP rank holds s/t of the sequence between
    layers and sends that shard to its peer in the next stage, which needs nothing more: megatron-core's tensor shape
    is (s / t, b, h) with `config.sequence_parallel` (megatron/core/pipeline_parallel/schedules.py `get_tensor_shapes`
    at core_v0.16.1; its p2p_communication.py has no scatter-gather), and the Megatron-LM code before megatron-core
    scatter-gathered only `not args.sequence_parallel` (megatron/p2p_communication.py before 3c92fa93b5, 2023-03-23).
    Megatron-DeepSpeed's pipeline is DeepSpeed's engine and gbmw's runtime keeps the whole sequence at boundaries
    (its +sp is inside blocks): 1 for both."""
    return strategy.tp if framework == "megatron" and strategy.sp and strategy.tp > 1 else 1


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


class StageCosts:
    """The terms of a stage's cost at one setting that depend on where a layer sits in its stage, vectorised
    over strategies (indices into `tables.strategies`)."""

    def __init__(self, model: ModelSpec, tables: StrategyTables, pp: int, num_micro_batches: int, schedule: str,
                 comm: CommModel, virtual_stages: int = 1, scatter_gather: bool = False, blocking_p2p: bool = False):
        self.model, self.tables, self.comm = model, tables, comm
        self.pp, self.num_micro_batches, self.schedule = pp, num_micro_batches, schedule
        self.virtual_stages = virtual_stages
        """Model chunks per device (interleaved 1F1B when > 1, gbmw.cost.pipeline_schedules)."""
        self.scatter_gather = scatter_gather
        """Each TP rank sends 1/t of a stage's output and the next stage all-gathers it (Megatron's and DeepSpeed's
        pipelines with TP; Narayanan et al. SC21 Sec. 4.1); otherwise every TP rank sends the whole activation."""
        self.blocking_p2p = blocking_p2p
        """Every send and every receive is a blocking call of its own, so a stage spends each transfer's time twice per
        boundary: sending the activation and receiving its gradient (or receiving the activation and sending the
        gradient). DeepSpeed's PipelineEngine runs TrainSchedule's SendGrad, RecvActivation, RecvGrad and
        SendActivation as separate synchronous `dist.send`/`dist.recv` (deepspeed/runtime/pipe/schedule.py, p2p.py);
        Megatron's 1F1B pairs each send with the opposite receive in one batched call (send_forward_recv_backward),
        which runs both directions at once: once per boundary."""
        self.group_size = tables.strategies[0].group_size
        self.in_flight = [in_flight_micro_batches(schedule, i, pp, num_micro_batches, virtual_stages)
                          for i in range(pp)]
        arrays = model.arrays
        self.boundary_bytes, self.side_bytes = arrays.boundary_activation_bytes_per_sample, arrays.side_input_bytes_per_sample
        self.tied_to, self.tied_parameters = arrays.tied_to_index, arrays.tied_parameter_count
        self.samples_per_device = tables.micro_batch / tables.data_parallel
        self.transition_overhead_s = slice_gather_overhead_s(model, comm)
        self._transitions: dict[int, np.ndarray] = {}

    def boundary_send_s(self, layer: int, data_parallel, tp=1, shards=1):
        """One transfer of `layer`'s input (boundary activation and side input) between two stages, sent by
        each device of a layout that splits the micro-batch `data_parallel` ways and replicates it over `tp` ranks
        (numbers, or arrays of them): the previous stage sends it forward, and the receiving stage sends its
        gradient back. Where the TP group already holds it in `shards` pieces (+sp: `sequence_sharded_boundary`) each
        rank sends its own piece and nothing is gathered; otherwise, with scatter-gather, each TP rank sends 1/t and
        the receivers all-gather the whole. With `blocking_p2p` the stage also waits out the transfer it receives the
        other way: the p2p part twice (the all-gather stays once: a stage all-gathers what it receives, never what it
        sends)."""
        messages = np.atleast_1d((self.boundary_bytes[layer] + self.side_bytes[layer]) * self.tables.micro_batch
                                 / np.asarray(data_parallel, dtype=float))
        tps = np.broadcast_to(np.asarray(tp), messages.shape)
        pieces = np.broadcast_to(np.asarray(shards), messages.shape)
        times = np.empty(messages.shape)
        transfers = 2 if self.blocking_p2p else 1
        for index, (message, degree, piece) in enumerate(zip(messages, tps, pieces)):
            degree, piece = int(degree), int(piece)
            if piece > 1:
                times[index] = transfers * pipeline_send_s(self.model, self.comm, float(message) / piece,
                                                           self.group_size)
            elif self.scatter_gather and degree > 1:
                times[index] = (transfers * pipeline_send_s(self.model, self.comm, float(message) / degree,
                                                            self.group_size)
                                + self.comm.allgather_s(float(message), degree, 1))
            else:
                times[index] = transfers * pipeline_send_s(self.model, self.comm, float(message), self.group_size)
        scalar = np.ndim(data_parallel) == 0 and np.ndim(tp) == 0 and np.ndim(shards) == 0
        return float(times[0]) if scalar else times

    def strategies_send_s(self, layer: int, strategies):
        """`boundary_send_s` of `layer`'s input under the strategies of these indices into `tables.strategies`."""
        tables = self.tables
        return self.boundary_send_s(layer, tables.data_parallel[strategies], tables.tp[strategies],
                                    tables.boundary_shards[strategies])

    def transition_s(self, layer: int) -> np.ndarray:
        """R(l, S_i, S_j) of Eq. (4) per micro-batch, as a [layout of S_i, layout of S_j] matrix: the Slice-Gather
        of `layer`'s boundary activation plus the profiled per-call overhead (0 when the layouts agree)."""
        if layer not in self._transitions:
            message = self.tables.transition_fraction * self.boundary_bytes[layer] * self.tables.micro_batch
            if self.group_size == 1:
                self._transitions[layer] = np.zeros_like(message)
            else:
                bandwidth, latency = self.comm.exchange_rate(self.group_size)
                self._transitions[layer] = np.where(
                    message > 0, message / bandwidth + latency + self.transition_overhead_s, 0.0)
        return self._transitions[layer]

    def received_input_bytes(self, layer: int, strategies: np.ndarray) -> np.ndarray:
        """What a stage after the first keeps of the activation it received, with its first layer `layer` (per
        micro-batch; 0 where the framework's layers keep that very tensor, counted as the layer's input)."""
        return self.boundary_bytes[layer] * self.samples_per_device[strategies] * self.tables.keeps_received_input

    def side_input_bytes(self, layer: int, strategies: np.ndarray) -> np.ndarray:
        """The side input a stage stashes once, with its first layer that reads one (per micro-batch)."""
        return self.side_bytes[layer] * self.samples_per_device[strategies]

    def twin_in_stage(self, layer: int, first_layer: int) -> bool:
        """`layer` shares weights with an earlier layer (ModelSpec allows ties only to earlier layers) that is
        in the same stage, which starts at `first_layer`: the stage holds the weights once."""
        return bool(self.tied_to[layer] >= first_layer) if self.tied_to[layer] >= 0 else False

    def tied_state_bytes(self, layer: int, strategies: np.ndarray) -> np.ndarray:
        """The model states of `layer`'s tied weights, not held again when its twin is in the stage (0 where the
        framework holds the tied weight twice under that strategy)."""
        tables = self.tables
        return (self.tied_parameters[layer] / tables.tp[strategies] * tables.state_bytes_per_parameter[strategies]
                * tables.shares_tied_weights[strategies])

    def tied_optimizer_parameters(self, layer: int, strategies: np.ndarray) -> np.ndarray:
        """The parameters of `layer`'s tied weights this device's optimizer would step again (0 where the
        framework holds the tied weight twice)."""
        tables = self.tables
        return (self.tied_parameters[layer] / tables.tp[strategies] / tables.optimizer_shards[strategies]
                * tables.shares_tied_weights[strategies])


@dataclass(frozen=True)
class StageEstimate:
    first_layer: int
    num_layers: int
    time_s: float
    """C(M_i, B_m): one micro-batch through the stage, gradient synchronisation included."""
    time_no_grad_sync_s: float
    peak_memory_bytes: float
    """The forward/backward peak below plus the reserve for the optimizer step's temporaries."""
    forward_backward_peak_bytes: float
    """Model states + the activations at their peak (Eq. (1)): what the stage search bounds."""
    model_state_bytes: float
    activation_bytes: float
    """Peak activation memory (stash of in-flight micro-batches plus the backward extra)."""
    in_flight_micro_batches: float
    optimizer_time_s: float = 0.0
    """The optimizer step over the stage's (ZeRO-sharded) parameters, once per iteration (memory-bound)."""
    stashed_activation_bytes: float = 0.0
    """The stash alone: in-flight micro-batches × what each keeps from forward to backward (no backward extra)."""


def stage_estimate(costs: StageCosts, stage_index: int, first_layer: int, strategies: Sequence[int]) -> StageEstimate:
    """Time and peak memory (Eq. (1)) of stage `stage_index` holding layers [first_layer, first_layer + len(strategies))
    under the strategies of those indices into `costs.tables.strategies`."""
    tables, model = costs.tables, costs.model
    count = len(strategies)
    time = no_sync = 0.0
    forward_memory, backward_memory, states = np.zeros(count), np.zeros(count), np.zeros(count)
    optimizer_parameters = 0.0
    side_input_stashed = False
    for position, (layer, strategy) in enumerate(zip(range(first_layer, first_layer + count), strategies)):
        time += tables.time_s[strategy, layer]
        no_sync += tables.time_no_grad_sync_s[strategy, layer]
        forward_memory[position] = tables.forward_memory_bytes[strategy, layer]
        backward_memory[position] = tables.backward_memory_bytes[strategy, layer]
        states[position] = tables.model_state_bytes[strategy, layer]
        optimizer_parameters += tables.optimizer_parameters[strategy, layer]
        if costs.twin_in_stage(layer, first_layer):
            states[position] -= costs.tied_state_bytes(layer, strategy)
            optimizer_parameters -= costs.tied_optimizer_parameters(layer, strategy)
        if position == 0 and stage_index > 0:
            forward_memory[position] += costs.received_input_bytes(layer, strategy)
        if costs.side_bytes[layer] > 0 and not side_input_stashed:
            forward_memory[position] += costs.side_input_bytes(layer, strategy)
            side_input_stashed = True
        if position:
            transition = costs.transition_s(layer)[tables.layout[strategies[position - 1]], tables.layout[strategy]]
            time += transition
            no_sync += transition
    send = 0.0  # the output forward and the input's gradient backward, as the sending device
    last, first = strategies[-1], strategies[0]
    if costs.virtual_stages > 1:
        # every chunk boundary, on every stage (the last stage's chunks feed stage 0's next ones), but the pipeline's
        # own ends: stage 0's first chunk reads the data (no input to receive, no gradient to send back) and the last
        # stage's last chunk ends in the loss (no output to send)
        output_layer = first_layer + count if first_layer + count < model.num_layers else first_layer
        outputs = costs.virtual_stages - (stage_index == costs.pp - 1)
        inputs = costs.virtual_stages - (stage_index == 0)
        send += (outputs * costs.strategies_send_s(output_layer, last)
                 + inputs * costs.strategies_send_s(first_layer, first))
    else:
        if stage_index < costs.pp - 1:
            send += costs.strategies_send_s(first_layer + count, last)
        if stage_index > 0:
            send += costs.strategies_send_s(first_layer, first)
    time += send
    no_sync += send
    in_flight = costs.in_flight[stage_index]
    activations = (in_flight - 1) * forward_memory.sum() + float(np.max(np.cumsum(forward_memory) + backward_memory))
    forward_backward_peak = float(states.sum() + activations)
    return StageEstimate(
        first_layer=first_layer,
        num_layers=count,
        time_s=float(time),
        time_no_grad_sync_s=float(no_sync),
        peak_memory_bytes=forward_backward_peak + step_reserve_bytes(tables.step_temporary_bytes_per_parameter,
                                                                     optimizer_parameters),
        forward_backward_peak_bytes=forward_backward_peak,
        model_state_bytes=float(states.sum()),
        activation_bytes=float(activations),
        in_flight_micro_batches=in_flight,
        optimizer_time_s=float(optimizer_parameters * tables.optimizer_step_s_per_parameter),
        stashed_activation_bytes=float(in_flight * forward_memory.sum()),
    )
