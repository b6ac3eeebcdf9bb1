"""Every layer's time inside whole-model passes for `gbmw profile model` (paper Sec. 5, Cost Estimator: the
per-sample computation time of each layer is profiled).

The runtime's own modules (gbmw.adapters.runtime.model) run forward and backward on this device:
- time: every layer timed inside whole-model forward/backward passes at each batch size, the mean over
  the fastest quarter of the passes (timing.py says why); backward measured separately (the analytic
  default is 2 × forward);
- the runtime's mechanisms, each timed the way training runs them: whole-model passes with every layer
  checkpointed (`ckpt_time_s`) and, on two or more processes, on ranks 0 and 1 whole-model passes with
  every layer TP 2 and with every layer FSDP2-sharded over the pair (`tp2_time_s`, `sdp2_time_s`), all at
  the larger batch.
InModelLayerTimer says how module hooks split a pass into per-layer windows.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from ..runtime.model import build_layer, initial_value, layer_names, synthetic_batch
from ..runtime.tensor_parallel import TensorParallel, partition_dims, shard_for_rank
from .timing import fast_quarter


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _build(architecture: Any, name: str, tp: TensorParallel, device: torch.device, dtype: torch.dtype):
    layer = build_layer(architecture, name, tp, dtype).to(device)
    dims = partition_dims(layer)
    with torch.no_grad():
        for key, parameter in layer.named_parameters():
            shape = list(parameter.shape)
            if dims[key] is not None:
                shape[dims[key]] *= tp.size
            full = initial_value(f"{name}.{key}", torch.Size(shape), seed=0)
            parameter.copy_(shard_for_rank(full, dims[key], tp))
    return layer


class InModelLayerTimer:
    """Every layer's forward and backward time inside whole-model passes on `batch` samples: module hooks
    inside full forward/backward passes, so each layer runs with the caches, allocator state, autograd
    bookkeeping and (on the profiling pair) the collectives of real training rather than alone in a hot
    loop. `tp`: every layer tensor-parallel over the pair (megatron-core layers); `shard_over`: every layer
    sharded over the pair by FSDP2 as the runtime's `sdp` (gathers in forward and backward, a reduce-scatter
    per call); `checkpointed`: every layer wrapped for activation checkpointing as the runtime's `+ckpt`
    (its backward includes the recomputed forward). Both ranks of the pair make the same calls.

    The windows tile the pass: a layer's forward runs from its forward pre-hook to the next layer's (the
    last layer's to its own backward pre-hook), its backward from its backward pre-hook to the
    next-executed layer's, so what runs between two layers
    (FSDP2's reduce-scatter after a layer's input gradient) belongs to the layer before it; the embedding's
    backward (token ids need no gradient, so it has no backward hooks) is the tail of the pass after the
    first block's input gradient."""

    def __init__(self, architecture: Any, device: torch.device, dtype: torch.dtype, batch: int,
                 tp: TensorParallel | None = None, shard_over: TensorParallel | None = None,
                 checkpointed: bool = False):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        self.names = layer_names(architecture)
        self.device = device
        self.layers = [_build(architecture, name, tp or TensorParallel.single(), device, dtype) for name in self.names]
        if checkpointed:  # as the runtime's `+ckpt` (gbmw.adapters.runtime.engine)
            self.layers = [checkpoint_wrapper(layer) for layer in self.layers]
        if shard_over is not None:
            for layer in self.layers:
                _shard_over_pair(layer, shard_over, device)
        pair = tp or shard_over
        self.group = pair.group if pair is not None else None
        data = synthetic_batch(architecture, batch, step=0, seed=0)
        self.inputs = data["inputs"].to(device)
        self.labels = {key: value.to(device) for key, value in data.items() if key != "inputs"}
        self.marks: dict[tuple[str, str], float] = {}
        self.samples: dict[str, list[tuple[float, float]]] = {name: [] for name in self.names}
        for name, layer in zip(self.names, self.layers):  # prepend: before FSDP2's own hooks (its gathers count)
            layer.register_forward_pre_hook(self._mark((name, "forward start")), prepend=True)
            layer.register_forward_hook(self._mark((name, "forward end")))
            if name != "embedding":
                layer.register_full_backward_pre_hook(self._mark((name, "backward start")), prepend=True)
                layer.register_full_backward_hook(self._mark((name, "backward end")))
        self.run(keep=False)  # warm-up

    def _mark(self, key):
        def hook(*_):
            _synchronise(self.device)
            self.marks[key] = time.perf_counter()
        return hook

    def run(self, keep: bool = True) -> None:
        """Two forward and backward passes back to back, as an iteration's micro-batches run: the first after
        other work (the optimizer step in training, the round's other timers here), the second warm. Keeps
        every layer's (forward s, backward s) averaged over the two."""
        first, second = self._pass(), self._pass()
        if keep:
            for name in self.names:
                self.samples[name].append(((first[name][0] + second[name][0]) / 2,
                                           (first[name][1] + second[name][1]) / 2))

    def _pass(self) -> dict[str, tuple[float, float]]:
        names, marks = self.names, self.marks
        marks.clear()
        if self.group is not None:
            dist.barrier(group=self.group)
        x = self.inputs
        for name, layer in zip(names, self.layers):
            x = layer(x, self.labels) if name == "head" else layer(x)
        x.backward()
        _synchronise(self.device)
        finished = time.perf_counter()
        times = {}
        for position, name in enumerate(names):
            last = position == len(names) - 1
            # the last layer's forward runs on to its backward: the loss scaling and autograd's start belong to it
            forward_end = marks[(name, "backward start")] if last else marks[(names[position + 1], "forward start")]
            if name == "embedding":
                backward = finished - marks[(names[1], "backward end")]
            elif position == 1:
                backward = marks[(name, "backward end")] - marks[(name, "backward start")]
            else:
                backward = marks[(names[position - 1], "backward start")] - marks[(name, "backward start")]
            times[name] = (forward_end - marks[(name, "forward start")], backward)
        return times

    def fastest(self, chosen: list[int] | None = None) -> dict[str, tuple[float, float]]:
        """Per layer: (forward s, backward s), the means over the fastest quarter of the runs (timing.py), or
        over the runs `chosen`."""
        if chosen is None:
            passes = len(self.samples[self.names[0]])
            totals = [sum(f + b for f, b in (values[index] for values in self.samples.values()))
                      for index in range(passes)]
            chosen = fast_quarter(totals)
        return {name: (sum(values[index][0] for index in chosen) / len(chosen),
                       sum(values[index][1] for index in chosen) / len(chosen))
                for name, values in self.samples.items()}


def _shard_over_pair(layer: torch.nn.Module, pair: TensorParallel, device: torch.device) -> None:
    """FSDP2 over the profiling pair, as gbmw.adapters.runtime.sharding applies it to an `sdp` layer (a
    reduce-scatter per call, as on every micro-batch of the runtime)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    fully_shard(layer, mesh=DeviceMesh.from_group(pair.group, device.type), reshard_after_forward=True)
    layer.set_gradient_divide_factor(1.0)
    layer.set_force_sum_reduction_for_comms(True)
