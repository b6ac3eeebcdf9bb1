"""The numbers `layer_costs` (gbmw.cost.layer_cost) takes from each strategy, as [strategy, 1] columns for the
batched tables of gbmw.cost.layer_cost_batch.

They depend on the strategies, the cost settings and the cluster's collectives, not on the micro-batch size, so
one search — which costs the same strategies at every micro-batch size — builds them once per list of strategies
(`strategy_columns`, cached). Each number is the one layer_costs computes, by the same expression: a TP degree, a
collective's latency and time per byte over the strategy's group, bytes kept per parameter, and so on.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from gbmw.cost.comm import CommModel
from gbmw.cost.expert_parallel import expert_alltoall_group, expert_data_parallel_group, expert_view
from gbmw.cost.framework_memory import (autocast_weight_copy_bytes, cross_entropy_workspace_bytes_per_logit,
                                        fp32_tp_input_extra_share, gather_buffer_bytes_per_parameter,
                                        sequence_parallel_gather_share)
from gbmw.cost.layer_cost import CostSettings, model_state_bytes_per_parameter, optimizer_shards
from gbmw.space.strategy import DATA_PARALLEL_AXES, Strategy

MAX_ENTRIES = 256
"""Lists of strategies whose columns are kept (a search has one per pipeline degree and variant)."""


def column(values, dtype=float) -> np.ndarray:
    """[strategy, 1]: one number per strategy, to broadcast over the layers."""
    return np.array(values, dtype=dtype).reshape(-1, 1)


@dataclass(frozen=True)
class CollectiveColumns:
    """gbmw.cost.layer_cost.collective_time_s of one collective, one group (size, stride) per strategy: its
    latency and time per byte (0 for a group of one)."""

    base_s: np.ndarray
    per_byte_s: np.ndarray
    active: np.ndarray
    """The group has more than one rank."""

    @classmethod
    def of(cls, function, sizes, strides) -> "CollectiveColumns":
        terms: dict[tuple[int, int], tuple[float, float]] = {}
        for size, stride in zip(sizes, strides):
            if size > 1 and (size, stride) not in terms:
                base = function(0.0, size, stride)
                terms[size, stride] = (base, function(1.0, size, stride) - base)
        found = [terms.get((size, stride), (0.0, 0.0)) for size, stride in zip(sizes, strides)]
        return cls(column([base for base, _ in found]), column([per_byte for _, per_byte in found]),
                   column(sizes, int) > 1)

    def time_s(self, message_bytes: np.ndarray) -> np.ndarray:
        """[strategy, layer]: collective_time_s of each row's messages over its group."""
        return np.where(self.active, np.where(message_bytes > 0, self.base_s + self.per_byte_s * message_bytes, 0.0),
                        0.0)


@dataclass(frozen=True)
class SyncColumns:
    """One data-parallel axis of each strategy (or none): gbmw.cost.layer_cost._data_parallel_sync's collectives,
    per kind of axis present; a row of another kind is a group of one in each, so its terms there are 0."""

    sdp_gather: CollectiveColumns | None
    sdp_scatter: CollectiveColumns | None
    z2dp_scatter: CollectiveColumns | None
    z2dp_gather: CollectiveColumns | None
    z1dp_scatter: CollectiveColumns | None
    z1dp_gather: CollectiveColumns | None
    dp_allreduce: CollectiveColumns | None
    shards: np.ndarray
    """[strategy, 1]: the SDP degree of the axes before this one (layer_costs' `shard`)."""

    @classmethod
    def of(cls, comm: CommModel, groups: list, shards: list[int]) -> "SyncColumns":
        kinds = {group[0] for group in groups if group}

        def collective(kind: str, function) -> CollectiveColumns | None:
            if kind not in kinds:
                return None
            return CollectiveColumns.of(function, [group[1] if group and group[0] == kind else 1 for group in groups],
                                        [group[2] if group and group[0] == kind else 1 for group in groups])

        return cls(collective("sdp", comm.allgather_s), collective("sdp", comm.reduce_scatter_s),
                   collective("z2dp", comm.reduce_scatter_s), collective("z2dp", comm.allgather_s),
                   collective("z1dp", comm.reduce_scatter_s), collective("z1dp", comm.allgather_s),
                   collective("dp", comm.allreduce_s), column(shards, int))

    def times_s(self, parameters: np.ndarray, parameter_bytes: float, gradient_bytes: float) -> tuple:
        """(forward gather, every micro-batch, last micro-batch) of `parameters` ([strategy, layer])."""
        gradients, weights = parameters * gradient_bytes, parameters * parameter_bytes
        forward, every, last = 0.0, 0.0, 0.0
        if self.sdp_gather is not None:
            gather = self.sdp_gather.time_s(weights)
            forward, every = gather, gather + self.sdp_scatter.time_s(gradients)
        if self.z2dp_scatter is not None:
            every = every + self.z2dp_scatter.time_s(gradients)
            last = last + self.z2dp_gather.time_s(weights)
        if self.z1dp_scatter is not None:
            last = last + (self.z1dp_scatter.time_s(gradients) + self.z1dp_gather.time_s(weights))
        if self.dp_allreduce is not None:
            last = last + self.dp_allreduce.time_s(gradients)
        return forward, every, last


@dataclass(frozen=True)
class StrategyColumns:
    """What layer_costs reads from each strategy of a list ([strategy, 1] columns unless said)."""

    strategies: tuple[Strategy, ...]
    data_parallel: np.ndarray
    sequence_parallel_degree: np.ndarray
    tp: np.ndarray
    sp: np.ndarray
    ckpt: np.ndarray
    selective: np.ndarray
    ep: np.ndarray
    expert_tp: np.ndarray
    """The experts' TP degree (the layer's unless `+etpN`)."""
    expert_tp_differs: np.ndarray
    """`+etpN`: the experts' TP share of the TP bytes runs over the ETP group (gbmw.cost.expert_parallel)."""
    tp_allreduce: CollectiveColumns
    expert_tp_allreduce: CollectiveColumns
    routed: np.ndarray
    """Expert parallelism applies (EP > 1 and the model has routed experts)."""
    alltoall_latency_s: np.ndarray
    alltoall_per_byte_s: np.ndarray
    kept_gradient_shards: np.ndarray
    kept_expert_gradient_shards: np.ndarray
    data_parallel_syncs: tuple[SyncColumns, ...]
    """One per position of a data-parallel axis in the strategies' weights (gradient_view)."""
    expert_sync: SyncColumns | None
    overhead_flags: tuple[tuple[bool, bool, bool], ...]
    """Per strategy: (tp > 1, sdp > 1, ckpt), all that layer_cost.framework_overheads_s reads."""
    weight_copy_bytes: np.ndarray
    expert_weight_copy_bytes: np.ndarray
    """`weight_copy_bytes` of the routed experts under EP, at their own TP degree (whole experts at +etp1 keep it)."""
    tp_input_share: np.ndarray
    cross_entropy_bytes_per_logit: np.ndarray
    sequence_parallel_gather_share: np.ndarray
    gathered_share: np.ndarray
    gathered_expert_share: np.ndarray
    gather_buffer_bytes: np.ndarray
    gather_buffer_expert_bytes: np.ndarray
    state_bytes: np.ndarray
    expert_state_bytes: np.ndarray
    optimizer_shards: np.ndarray
    expert_optimizer_shards: np.ndarray


_entries: OrderedDict[tuple, StrategyColumns] = OrderedDict()


def strategy_columns(strategies: list[Strategy], settings: CostSettings, comm: CommModel, has_routed_experts: bool,
                     activation_bytes: int) -> StrategyColumns:
    """The columns of `strategies` for a model with or without routed experts whose activations take
    `activation_bytes` per element (cached by all of these, the settings and the cluster whose collectives `comm`
    times: a CommModel's times are a function of its cluster alone)."""
    key = (tuple(strategies), settings, comm.cluster, has_routed_experts, activation_bytes)
    found = _entries.get(key)
    if found is None:
        found = _entries[key] = _build(key[0], settings, comm, has_routed_experts, activation_bytes)
        if len(_entries) > MAX_ENTRIES:
            _entries.popitem(last=False)
    else:
        _entries.move_to_end(key)
    return found


def _build(strategies: tuple[Strategy, ...], settings: CostSettings, comm: CommModel, has_experts: bool, d: int
           ) -> StrategyColumns:
    framework, precision = settings.framework, settings.precision
    weight_bytes = settings.states.weights
    weights = [s.gradient_view for s in strategies]
    experts = [expert_view(w) for w in weights]
    routed = [s.ep != 1 and has_experts for s in strategies]
    ep_groups = [expert_alltoall_group(s) if active else (1, 1) for s, active in zip(strategies, routed)]
    latency = [comm.alltoall_s(0.0, size, stride) if active else 0.0
               for (size, stride), active in zip(ep_groups, routed)]
    per_byte = [comm.alltoall_s(1.0, size, stride) - comm.alltoall_s(0.0, size, stride) if active else 0.0
                for (size, stride), active in zip(ep_groups, routed)]
    groups = [[(axis, degree, w.stride(axis)) for axis, degree in w.dims if axis in DATA_PARALLEL_AXES]
              for w in weights]
    syncs, shards = [], [1] * len(strategies)
    for slot in range(max(len(row) for row in groups)):
        in_slot = [row[slot] if slot < len(row) else None for row in groups]
        syncs.append(SyncColumns.of(comm, in_slot, shards))
        shards = [shard * group[1] if group and group[0] == "sdp" else shard for shard, group in zip(shards, in_slot)]
    expert_groups = [expert_data_parallel_group(s) if s.ep > 1 and s.expert_data_parallel > 1 else None
                     for s in strategies]
    return StrategyColumns(
        strategies=strategies,
        data_parallel=column([s.data_parallel for s in strategies], int),
        sequence_parallel_degree=column([s.sequence_parallel_degree for s in strategies], int),
        tp=column([s.tp for s in strategies], int),
        sp=column([s.sp for s in strategies], bool),
        ckpt=column([s.ckpt for s in strategies], bool),
        selective=column([s.selective for s in strategies], bool),
        ep=column([s.ep for s in strategies], int),
        tp_allreduce=CollectiveColumns.of(comm.allreduce_s, [s.tp for s in strategies],
                                          [s.stride("tp") if s.tp > 1 else 1 for s in strategies]),
        expert_tp=column([s.expert_tensor_parallel for s in strategies], int),
        expert_tp_differs=column([s.expert_tp is not None for s in strategies], bool),
        expert_tp_allreduce=CollectiveColumns.of(comm.allreduce_s, [s.expert_tp or 1 for s in strategies],
                                                 [s.stride("tp") if s.tp > 1 else 1 for s in strategies]),
        routed=column(routed, bool),
        alltoall_latency_s=column(latency),
        alltoall_per_byte_s=column(per_byte),
        kept_gradient_shards=column([w.degree("sdp") * w.degree("z2dp") for w in weights], int),
        kept_expert_gradient_shards=column([e.degree("sdp") * e.degree("z2dp") for e in experts], int),
        data_parallel_syncs=tuple(syncs),
        expert_sync=SyncColumns.of(comm, expert_groups, [1] * len(strategies)) if any(expert_groups) else None,
        overhead_flags=tuple((s.tp > 1, s.degree("sdp") > 1, s.ckpt) for s in strategies),
        weight_copy_bytes=column([autocast_weight_copy_bytes(framework, precision, s.tp) for s in strategies], int),
        expert_weight_copy_bytes=column(
            [autocast_weight_copy_bytes(framework, precision, s.expert_tensor_parallel) for s in strategies], int),
        tp_input_share=column([fp32_tp_input_extra_share(framework, precision, d, s.tp) for s in strategies]),
        cross_entropy_bytes_per_logit=column(
            [cross_entropy_workspace_bytes_per_logit(framework, precision, s.tp) for s in strategies]),
        sequence_parallel_gather_share=column([sequence_parallel_gather_share(framework, s) for s in strategies]),
        gathered_share=column([1 - 1 / w.degree("sdp") for w in weights]),
        gathered_expert_share=column([1 - 1 / e.degree("sdp") for e in experts]),
        gather_buffer_bytes=column([gather_buffer_bytes_per_parameter(framework, w, weight_bytes) for w in weights]),
        gather_buffer_expert_bytes=column(
            [gather_buffer_bytes_per_parameter(framework, e, weight_bytes) for e in experts]),
        state_bytes=column([model_state_bytes_per_parameter(w, settings) for w in weights]),
        expert_state_bytes=column([model_state_bytes_per_parameter(e, settings) for e in experts]),
        optimizer_shards=column([optimizer_shards(w) for w in weights], int),
        expert_optimizer_shards=column([optimizer_shards(e) for e in experts], int),
    )
