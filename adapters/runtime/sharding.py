"""Data parallelism of one layer: plain DP (gradient all-reduce) or sharded DP (ZeRO; paper Sec. 2.2).

Which implementation and why:
- `dp`: gradients are summed over the layer's data-parallel group once per iteration, after the
  last micro-batch's backward (paper App. C: the last micro-batch carries the gradient
  synchronisation): per group, the gradients of every layer of the stage that uses that group in flat buckets
  of at most ALLREDUCE_BUCKET_ELEMENTS (`synchronise_plain_gradients`), as DDP and DeepSpeed bucket them.
  Nothing is sharded.
- `sdp` (ZeRO-3), `z2dp` (ZeRO-2) and `z1dp` (ZeRO-1): torch FSDP2 `fully_shard` on the layer's own
  data-parallel group (a one-dimensional DeviceMesh over that group). gbmw plans choose the strategy
  per layer, so neighbouring layers shard over different groups; DeepSpeed's ZeRO engine shards
  every parameter of a model over one data-parallel group and cannot express that, while FSDP2
  wraps each layer with its own mesh, composes with megatron-core's TP parameters (it shards each
  rank's TP slice) and runs on gloo. `sdp` frees the gathered parameters after forward and gathers
  them again for backward; `z1dp`/`z2dp` keep them gathered from forward to backward
  (`reshard_after_forward=False`). Gradients follow ZeRO's stages as the estimator prices them
  (gbmw/cost/layer_cost.py): `sdp` and `z2dp` reduce-scatter every micro-batch and accumulate sharded gradients;
  `z1dp` accumulates unsharded gradients and reduce-scatters them once, on the last micro-batch. (After
  that reduce-scatter FSDP2 keeps only the shard, so between iterations ZeRO-1 holds less than the
  estimator's unsharded gradients.)
  Each layer is its own FSDP2 root, and a root keeps its last reduce-scatter input (the layer's unsharded
  gradients, copied into one flat buffer) until the whole autograd backward ends — one buffer per sharded layer of
  the stage at the end of every micro-batch's backward. One FSDP2 root over the stage (torchtitan's wrapping)
  keeps one: a layer's backward frees the previous layer's buffer before it reduces its own. The stage's layers
  share one list of buffers in flight (`ReduceScatterInFlight`) and so behave as under one root.
  Where a whole stage is uniform DeepSpeed's ZeRO could run it too; one implementation for every plan
  keeps the runtime's behaviour the same whatever the planner mixes, and benchmarks/runtime_overhead.py
  measures per-layer FSDP2 against DeepSpeed ZeRO-3 on a uniform plan.

Gradients are SUMMED over the group, never averaged: each rank back-propagates its own share of the
global loss (see gbmw.adapters.runtime.engine), so layers with different data-parallel degrees get
exact gradients without rescaling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from gbmw.cost.framework_memory import ADAM_CHUNK_ELEMENTS
from gbmw.errors import PlanError
from gbmw.space.strategy import DATA_PARALLEL_AXES, Strategy

SHARDED_FLAVOURS = ("sdp", "z2dp", "z1dp")
ALLREDUCE_BUCKET_ELEMENTS = ADAM_CHUNK_ELEMENTS
"""Elements of one flat all-reduce bucket of plain-DP gradients: the optimizer step's chunk, so that its reserve
covers the bucket."""


def data_parallel_flavour(strategy: Strategy) -> str | None:
    """The one data-parallel axis of a strategy (None without data parallelism)."""
    axes = [axis for axis, _ in strategy.dims if axis in DATA_PARALLEL_AXES]
    if len(axes) > 1:
        raise PlanError(
            f"strategy {strategy.name} mixes data-parallel flavours {axes}; the runtime runs one per layer "
            "(the paper's space never mixes dp and sdp, Takeaway #3): use one of them at their product degree"
        )
    return axes[0] if axes else None


@dataclass
class LayerDataParallel:
    """How one layer's gradients are synchronised on this rank."""

    flavour: str | None
    group: object
    size: int

    @property
    def sharded(self) -> bool:
        return self.flavour in SHARDED_FLAVOURS

    def wrap(self, module: nn.Module, mesh, in_flight: "ReduceScatterInFlight | None",
             ignored: set[nn.Parameter] | None = None) -> nn.Module:
        """Apply FSDP2 over `mesh` (this group's) for sharded flavours (in place; returns the module), leaving the
        `ignored` parameters unsharded; a layer's root joins its reduce-scatter buffers to the stage's `in_flight`
        (None for a unit inside a layer, whose buffers are its root's: gbmw.adapters.runtime.expert_data_parallel)."""
        if not self.sharded or self.size == 1:
            return module
        from torch.distributed.fsdp import fully_shard

        fully_shard(module, mesh=mesh, reshard_after_forward=self.flavour == "sdp", ignored_params=ignored or None)
        module.set_gradient_divide_factor(1.0)  # sum, not average (see the module docstring); per unit, not recursive
        module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        if in_flight is not None:
            in_flight.join(module)
        return module

    def set_gradient_sync(self, module: nn.Module, last_micro_batch: bool) -> None:
        """Before a micro-batch's backward: `sdp`/`z2dp` reduce-scatter every micro-batch, `z1dp` only on the
        last (plain `dp` is synchronised after the schedule, synchronise_plain_gradients)."""
        if self.sharded and self.size > 1:
            module.set_requires_gradient_sync(last_micro_batch or self.flavour != "z1dp")


class ReduceScatterInFlight:
    """The reduce-scatter inputs a stage's FSDP2 layers hold, at most one at a time, as one root over the stage.

    FSDP2 keeps a finished reduce-scatter's input alive in its communication context until the next reduce-scatter
    of that context needs the room (on a GPU the collective may still read it), capped at one buffer; a root's
    context is cleared when the autograd backward ends. Per-layer roots have a context each, so each keeps its
    buffer to the end. FSDP2 makes a root's list anew in its lazy initialisation (the first forward); a forward
    pre-hook, which runs after FSDP2's own, puts this one shared list in its place. (This reaches into FSDP2's
    state — `_get_fsdp_state()._comm_ctx` of torch 2.13; tests/test_fake_memory.py checks the buffers held.)"""

    def __init__(self) -> None:
        self.states: list = []

    def join(self, module: nn.Module) -> None:
        module.register_forward_pre_hook(self._share)

    def _share(self, module: nn.Module, args) -> None:
        module._get_fsdp_state()._comm_ctx.reduce_scatter_states = self.states


def synchronise_plain_gradients(layers: list[tuple[LayerDataParallel, list[nn.Parameter]]], group_key) -> None:
    """Plain DP: sum the accumulated gradients of every `dp` layer's parameters over its group (a mixture-of-experts
    layer gives its routed experts' apart, with their expert-data-parallel group), in flat buckets of at most
    ALLREDUCE_BUCKET_ELEMENTS elements per group (layers in stage order, groups in first-use order: the same on
    every rank of the group), as DDP and DeepSpeed bucket them. A gradient larger than a bucket is reduced in place.
    The bucket is the only copy: the estimator's reserve for the optimizer step (the same number of fp32 elements,
    gbmw.cost.framework_memory.step_reserve_bytes) covers it, as the two never coexist."""
    buckets: dict = {}
    for data_parallel, parameters in layers:
        if data_parallel.sharded or data_parallel.size == 1:
            continue
        grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
        key = group_key(data_parallel)
        group_grads = buckets.setdefault(key, (data_parallel.group, {}))[1]
        group_grads.update((id(grad), grad) for grad in grads)  # a tied weight shared by two layers: once
    for group, grads in buckets.values():
        for bucket in _buckets(list(grads.values()), ALLREDUCE_BUCKET_ELEMENTS):
            if len(bucket) == 1:
                dist.all_reduce(bucket[0], group=group)
                continue
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat, group=group)
            for grad, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                grad.copy_(reduced)
            del flat


def _buckets(tensors: list[torch.Tensor], max_elements: int) -> list[list[torch.Tensor]]:
    """Consecutive runs of `tensors` of at most `max_elements` elements in all (a larger tensor alone)."""
    runs: list[list[torch.Tensor]] = []
    size = 0
    for tensor in tensors:
        if not runs or size + tensor.numel() > max_elements:
            runs.append([])
            size = 0
        runs[-1].append(tensor)
        size += tensor.numel()
    return runs


def local_value(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter (FSDP2 parameters are DTensors; others are plain tensors)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """The data-parallel-unsharded tensor (a collective over the layer's group for DTensors)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`full` laid out as `like`: a DTensor with like's mesh and placements (no communication), or itself."""
    if not hasattr(like, "device_mesh"):
        return full.to(like.device, like.dtype)
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full.to(like.device, like.dtype), like.device_mesh, like.placements, src_data_rank=None)
