"""What expert parallelism changes in a mixture-of-experts layer's cost (gbmw.space.strategy: `+epN`).

A layer under strategy S with TP degree t, one data-parallel axis of degree d and EP degree e (e | d) runs its
attention, router and shared experts exactly as a dense layer under S. Its routed experts (E of them, each an MLP
whose TP is the layer's) are split over the e ranks of an EP group, E / e on each (Lepikhin et al., "GShard",
2020, Sec. 2; Rajbhandari et al., "DeepSpeed-MoE", 2022, Sec. 5; megatron-core's MoEAlltoAllTokenDispatcher):

* parameters: a rank holds E / e experts, 1/t of each; their gradients are synchronised over the
  expert-data-parallel group, d / e ranks whose neighbours are t·e ranks apart (EP sits inside DP), with the
  ZeRO flavour of S's data-parallel axis over that group (`expert_view`);
* communication: the tokens a rank routes (samples · s · k copies, 1/t of them per TP rank: megatron-core's
  dispatcher splits the tokens over TP before the dispatch) go to the ranks holding their experts in one
  all-to-all over the EP group and come back in another — two in forward, two in backward, two more in a full
  recomputation — blocking, not overlapped with compute (megatron-core overlaps them only with
  `--overlap-moe-expert-parallel-comm`, which gbmw does not assume);
* load: the busiest rank of the EP group receives `expert_load_factor` times the mean of the routed tokens (the
  model's stated assumption for dropless routing; 1 under a capacity factor, whose padding is in the counts), so
  its expert compute, the tokens it holds and what it receives grow by that factor — the group waits for it.
  With e = 1 a rank computes all experts for its own tokens and the load does not matter.

A dense layer (num_experts 0) is unchanged by `+ep`: stock frameworks set one EP degree for the model and it
touches its MoE layers only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gbmw.cost.comm import CommModel
from gbmw.space.strategy import DATA_PARALLEL_AXES, Strategy
from gbmw.specs.model_spec import ModelSpec


def expert_view(strategy: Strategy) -> Strategy:
    """The strategy the routed experts' states see: the data-parallel axis at degree d / e (gone at 1), no EP —
    so that model_states and framework_memory shard the experts' states over the expert-data-parallel group."""
    if strategy.ep == 1:
        return strategy
    dims = []
    for axis, degree in strategy.dims:
        if axis in DATA_PARALLEL_AXES:
            degree //= strategy.ep
        if degree > 1:
            dims.append((axis, degree))
    return Strategy(tuple(dims), strategy.ckpt, strategy.selective, strategy.sp and strategy.tp > 1)


def expert_data_parallel_group(strategy: Strategy) -> tuple[str, int, int]:
    """(axis, degree, stride) of the group the experts' gradients are synchronised over."""
    axis = next(axis for axis, _ in strategy.dims if axis in DATA_PARALLEL_AXES)
    return axis, strategy.expert_data_parallel, strategy.stride(axis) * strategy.ep


@dataclass
class ExpertParallelCosts:
    """Per-layer arrays (0 on dense layers, and on every layer under EP 1) for one micro-batch on one rank."""

    expert_parameters: np.ndarray
    """TP-local routed-expert parameters of the whole layer (before EP divides them)."""
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
    if strategy.ep == 1 or not arrays.expert_parameter_count.any():
        return ExpertParallelCosts(expert_parameters, zeros, zeros, zeros)
    load = arrays.expert_load_factor
    axis = next(axis for axis, _ in strategy.dims if axis in DATA_PARALLEL_AXES)
    stride = strategy.stride(axis)
    per_byte = comm.alltoall_s(1.0, strategy.ep, stride) - comm.alltoall_s(0.0, strategy.ep, stride)
    latency = comm.alltoall_s(0.0, strategy.ep, stride)
    received = arrays.expert_dispatch_bytes_per_sample * samples / tp * load
    alltoall = np.where(received > 0, 2 * (received * per_byte + latency), 0.0)
    extra_compute = (load - 1) * arrays.expert_forward_flops_per_sample * samples / tp / sustained_flops
    extra_memory = (load - 1) * (arrays.expert_activation_bytes_per_sample
                                 + arrays.expert_tp_split_activation_bytes_per_sample / tp) * samples
    return ExpertParallelCosts(expert_parameters, alltoall, extra_compute, extra_memory)
