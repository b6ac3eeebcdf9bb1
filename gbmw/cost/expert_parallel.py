"""What expert parallelism changes in a mixture-of-experts layer's cost (gbmw.space.strategy: `+epN`).

A layer under strategy S with TP degree t, one data-parallel axis of degree d and EP degree e (e | d) runs its
attention, router and shared experts exactly as a dense layer under S. Its routed experts (E of them, each an MLP
whose TP is the layer's) are split over the e ranks of an EP group, E / e on each (Lepikhin et al., "GShard",
2020, Sec. 2; Rajbhandari et al., "DeepSpeed-MoE", 2022, Sec. 5; megatron-core's MoEAlltoAllTokenDispatcher):

* parameters: a rank holds E / e experts, 1/t of each; their gradients are synchronised over the
  expert-data-parallel group, d / e ranks whose neighbours are t·e ranks apart (EP sits inside DP), with the
  ZeRO flavour of S's data-parallel axis over that group (`expert_view`);
* communication: the tokens a rank routes (samples · s · k copies; under +sp 1/t of them per TP rank, its
  sequence slice: megatron-core, which needs +sp where EP meets TP; without +sp every TP rank of a replica routes
  all of them — gbmw's runtime, whose TP peers hold the same tokens and routing, and DeepSpeed-MoE's experts under
  TP, which keep the duplicate tokens) go to the ranks holding their experts in one all-to-all over the EP group
  and come back in another — two in forward, two in backward, two more in a full
  recomputation — blocking, not overlapped with compute (megatron-core overlaps them only with
  `--overlap-moe-expert-parallel-comm`, which gbmw does not assume);
* load: the busiest rank of the EP group receives `expert_load_factor` times the mean of the routed tokens (the
  model's stated assumption for dropless routing; 1 under a capacity factor, whose padding is in the counts), so
  its expert compute, the tokens it holds and what it receives grow by that factor — the group waits for it.
  With e = 1 a rank computes all experts for its own tokens and the load does not matter.

With a sequence axis of degree c (cp, ulysses) every rank routes its own 1/c of each sample's tokens (`samples`
counts them: a micro-batch over data-parallel × sequence ranks), and the EP group is e ranks of the weights' merged
data-parallel axis (Strategy.gradient_view, the experts' states and gradients too: `expert_view` is taken of it):
megatron-core's expert grid, which folds the cp ranks into EP and EDP.

A dense layer (num_experts 0) is unchanged by `+ep`: stock frameworks set one EP degree for the model and it
touches its MoE layers only.

An expert TP degree a other than t (`+etpN`, gbmw.space.expert_tensor_parallel: megatron-core's ETP, the stage's W
ranks laid out again as a · e · W/(a·e), TP innermost, +sp) changes three terms and leaves the rest:

* parameters: a rank holds E / e experts, 1/a of each; their gradients are synchronised over the W / (a·e) ranks
  a·e apart, with the ZeRO flavour of S's data-parallel axis (plain all-reduce without one);
* communication: the all-to-alls carry the same bytes (each rank dispatches its own 1/t of its replica's routed
  tokens) over the EP group of e ranks a apart; the experts' all-gather of the received tokens and the
  reduce-scatter of their output run over the ETP group (a ranks, on the TP group's links) instead of TP's:
  an all-reduce's bytes of a/t of the routed copies (`expert_dispatch_bytes_per_sample`, the share of the layer's
  TP bytes that the experts' TP moves), none at a = 1 (megatron-core's MoEAlltoAllTokenDispatcher: A2A over EP,
  then AG over ETP; RS over ETP, then A2A back);
* what does not change: a rank computes a/t of its EP group's routed tokens with 1/a of the weights — the expert
  FLOPs, hidden activations and backward workspace per rank are those at a = t, and so is the busiest rank's
  load. The routed copies' stash under +sp is a sequence slice's (1/t) except the experts' input: megatron-core
  all-gathers the copies over the ETP group before the experts run and the first linear keeps what it was given, a/t
  of the TP group's copies (`expert_input_gathered_bytes`; exact at a = 1, where a rank keeps its own tokens; the
  default a = t keeps them whole). The largest weight gradient of the backward workspace stays TP-split (the
  attention's projections are the larger in the MoE models bundled).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gbmw.cost.comm import CommModel
from gbmw.space.strategy import DATA_PARALLEL_AXES, Strategy
from gbmw.specs.model_spec import ModelSpec


def expert_view(strategy: Strategy) -> Strategy:
    """The strategy the routed experts' states see: the data-parallel axis at degree d / e (gone at 1), no EP —
    so that model_states and framework_memory shard the experts' states over the expert-data-parallel group. Under
    `+etpN`: tp at the ETP degree, then the data-parallel axis' flavour (dp without one) at the EDP degree."""
    if strategy.ep == 1:
        return strategy
    if strategy.expert_tp is not None:
        axis = next((axis for axis, _ in strategy.dims if axis in DATA_PARALLEL_AXES), "dp")
        dims = tuple((name, degree) for name, degree in (("tp", strategy.expert_tp),
                                                          (axis, strategy.expert_data_parallel)) if degree > 1)
        return Strategy(dims, strategy.ckpt, strategy.selective, strategy.sp and strategy.expert_tp > 1)
    dims = []
    for axis, degree in strategy.dims:
        if axis in DATA_PARALLEL_AXES:
            degree //= strategy.ep
        if degree > 1:
            dims.append((axis, degree))
    return Strategy(tuple(dims), strategy.ckpt, strategy.selective, strategy.sp and strategy.tp > 1)


def expert_data_parallel_group(strategy: Strategy) -> tuple[str, int, int]:
    """(axis, degree, stride) of the group the experts' gradients are synchronised over (EP > 1); with a sequence
    axis, over `gradient_view`'s data-parallel axis (the sequence ranks merged into it)."""
    if strategy.expert_tp is not None:
        axis = next((axis for axis, _ in strategy.dims if axis in DATA_PARALLEL_AXES), "dp")
        return axis, strategy.expert_data_parallel, strategy.expert_tp * strategy.ep
    weights = strategy.gradient_view
    axis = next(axis for axis, _ in weights.dims if axis in DATA_PARALLEL_AXES)
    return axis, strategy.expert_data_parallel, weights.stride(axis) * strategy.ep


def expert_alltoall_group(strategy: Strategy) -> tuple[int, int]:
    """(size, stride) of the EP group the dispatch and combine all-to-alls run over (EP > 1): the EP ranks of the
    data-parallel axis (with a sequence axis, of `gradient_view`'s: sequence ranks first), or under `+etpN` EP ranks
    ETP apart."""
    if strategy.expert_tp is not None:
        return strategy.ep, strategy.expert_tp
    weights = strategy.gradient_view
    axis = next(axis for axis, _ in weights.dims if axis in DATA_PARALLEL_AXES)
    return strategy.ep, weights.stride(axis)


def expert_tp_bytes_per_sample(model: ModelSpec, strategy: Strategy) -> tuple[np.ndarray, np.ndarray]:
    """(the layer's TP all-reduce bytes per sample, the ETP group's) under `strategy`: under `+etpN` the experts'
    share (`expert_dispatch_bytes_per_sample`) leaves the TP group's and a/t of it goes to the ETP group's (the
    module); otherwise the layer's bytes and none."""
    arrays = model.arrays
    if strategy.expert_tp is None:
        return arrays.tp_allreduce_bytes_per_sample, np.zeros(model.num_layers)
    return (np.maximum(arrays.tp_allreduce_bytes_per_sample - arrays.expert_dispatch_bytes_per_sample, 0.0),
            arrays.expert_dispatch_bytes_per_sample * strategy.expert_tp / strategy.tp)


@dataclass
class ExpertParallelCosts:
    """Per-layer arrays (0 on dense layers, and on every layer under EP 1) for one micro-batch on one rank."""

    expert_parameters: np.ndarray
    """TP-local routed-expert parameters of the whole layer (before EP divides them)."""
    rank_expert_parameters: np.ndarray
    """The routed-expert parameters one rank holds: E / e experts, 1/ETP of each (0 under EP 1, where the experts
    stay with the layer's other parameters)."""
    alltoall_forward_s: np.ndarray
    """The dispatch and combine all-to-alls of one forward pass (backward runs as many)."""
    extra_forward_compute_s: np.ndarray
    """The busiest rank's expert compute beyond the mean (forward; backward is twice it)."""
    extra_activation_bytes: np.ndarray
    """The busiest rank's stashed routed-token activations beyond the mean."""


def expert_parallel_costs(model: ModelSpec, strategy: Strategy, samples: float, comm: CommModel,
                          sustained_flops: float) -> ExpertParallelCosts:
    """The terms of the module for every layer of `model` under `strategy`, `samples` samples per rank."""
    arrays = model.arrays
    tp = strategy.tp
    expert_parameters = arrays.expert_parameter_count / tp
    zeros = np.zeros(model.num_layers)
    rank_experts = (arrays.expert_parameter_count / strategy.expert_tensor_parallel / strategy.ep if strategy.ep > 1
                    else zeros)
    if strategy.ep == 1 or not arrays.expert_parameter_count.any():
        return ExpertParallelCosts(expert_parameters, rank_experts, zeros, zeros, zeros)
    load = arrays.expert_load_factor
    size, stride = expert_alltoall_group(strategy)
    per_byte = comm.alltoall_s(1.0, size, stride) - comm.alltoall_s(0.0, size, stride)
    latency = comm.alltoall_s(0.0, size, stride)
    received = arrays.expert_dispatch_bytes_per_sample * samples / (tp if strategy.sp else 1) * load
    alltoall = np.where(received > 0, 2 * (received * per_byte + latency), 0.0)
    extra_compute = (load - 1) * arrays.expert_forward_flops_per_sample * samples / tp / sustained_flops
    extra_memory = (load - 1) * (arrays.expert_activation_bytes_per_sample
                                 + arrays.expert_tp_split_activation_bytes_per_sample / tp) * samples
    return ExpertParallelCosts(expert_parameters, rank_experts, alltoall, extra_compute, extra_memory)


def expert_input_gathered_bytes(expert_input_bytes, tp, expert_tp):
    """What megatron-core's ETP all-gather adds to a +sp layer's stash beyond the sequence slice's share: the experts'
    input is kept at ETP/TP of `expert_input_bytes` (the TP group's routed copies, as the slice's stash counts them
    whole) where the slice's share is 1/TP — (ETP − 1)/TP of it (module docstring). Arrays broadcast."""
    return expert_input_bytes * (expert_tp - 1) / tp
