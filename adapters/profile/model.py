"""`gbmw profile model`: per-layer time and memory measured on the local device (paper Sec. 5, Cost Estimator:
the per-sample computation time of each layer is profiled; memory comes from the tensors themselves).

For every layer of the planner's ModelSpec the runtime's own module (gbmw.adapters.runtime.model) runs
forward and backward on this device at two batch sizes:
- time: every layer timed inside whole-model forward/backward passes at each batch size, the mean over
  the fastest quarter of the passes (timing.py says why), as a line: seconds per sample (the slope; the
  paper's per-sample time) and seconds per call (the intercept: launches and Python, which make tiny
  micro-batches slow); backward measured separately (the analytic default is 2 × forward); and the
  runtime's Adam step time per parameter;
- the runtime's mechanisms, each timed the way training runs them: whole-model passes with every layer
  checkpointed (`ckpt_time_s`) and, on two or more processes, on ranks 0 and 1 whole-model passes with
  every layer TP 2 and with every layer FSDP2-sharded over the pair (`tp2_time_s`, `sdp2_time_s`), all at
  the larger batch; one Slice-Gather between a sliced and a replicated layout (`slice_gather_time_s`) and
  one pipeline transfer (`p2p_time_s`) of that batch's hidden state. The estimator charges what these show
  beyond compute and its modelled collectives as a per-call framework cost. All of them run interleaved,
  round after round, for at least `min_seconds`;
- stashed activations: the bytes autograd saves (adapters/profile/activations.py), as the slope between
  the two batch sizes, so anything that does not grow with the batch (position indices) is left out; the
  layer input is the boundary (Sec. 3.1 `bnd`), the rest intermediate;
- which part of the intermediate bytes TP divides: launched with two or more processes, the layer is
  measured again with TP over ranks 0 and 1 (S₁ = R + T, S₂ = R + T/2, so T = 2(S₁ − S₂)); on one
  process the analytic model's split of that layer is used, and the profile's `source` says so.
Parameters, FLOPs, TP all-reduce bytes, heads and ties stay those of the analytic model (they are shapes,
not measurements). The result is a ModelSpec YAML (`layers:`) that `gbmw plan` reads in place of the
analytic costs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from gbmw.models import build_model
from gbmw.model_spec import LayerTimings, ModelSpec, ModelTimings

from ..runtime.local_adam import LocalShardAdam
from ..runtime.model import build_layer, initial_value, layer_names, synthetic_batch
from ..runtime.tensor_parallel import TensorParallel, shard_for_rank, partition_dims
from .activations import SavedActivationMeter
from .timing import fast_mean_s, fast_quarter


@dataclass(frozen=True)
class LayerMeasurement:
    name: str
    forward_s_per_sample: float
    backward_s_per_sample: float
    forward_overhead_s: float
    """Intercept of forward time against batch size: the cost of a call that does not grow with samples."""
    backward_overhead_s: float
    boundary_bytes_per_sample: float
    intermediate_bytes_per_sample: float
    """Stashed bytes per sample other than the layer input (one device, no TP)."""
    tp_split_bytes_per_sample: float | None
    """The part of `intermediate_bytes_per_sample` TP divides (None: not measured, one process)."""
    tp2_seconds: float | None = None
    """Forward + backward of one call at the larger batch with TP over the two profiling ranks."""
    sdp2_seconds: float | None = None
    """The same with the layer sharded over the two ranks by FSDP2 (gathers and a reduce-scatter per call)."""
    tp2_forward_seconds: float | None = None
    """The forward part of tp2_seconds."""


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _layer_inputs(architecture: Any, name: str, batch: int, device: torch.device, dtype: torch.dtype):
    data = synthetic_batch(architecture, batch, step=0, seed=0)
    labels = {key: value.to(device) for key, value in data.items() if key != "inputs"}
    if name == "embedding":
        return data["inputs"].to(device), labels
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(batch, architecture.seq_length, architecture.hidden_size, generator=generator)
    return hidden.to(device, dtype).requires_grad_(), labels


def _run_layer(layer: torch.nn.Module, name: str, x: torch.Tensor, labels) -> torch.Tensor:
    output = layer(x, labels) if name == "head" else layer(x)
    return output if output.dim() == 0 else output.sum()  # sum saves nothing: only the layer's own tensors count


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


def _saved_bytes(architecture, name, layer, batch, device, dtype) -> tuple[int, int]:
    """(saved bytes, the input's bytes if saved else 0) of one forward."""
    x, labels = _layer_inputs(architecture, name, batch, device, dtype)
    with SavedActivationMeter(layer.parameters()) as meter:
        _run_layer(layer, name, x, labels)
    return meter.bytes, (x.untyped_storage().nbytes() if meter.holds(x) else 0)


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


class PairCallTimer:
    """One call of a runtime mechanism on the profiling pair, in both directions per run(): each direction
    after a barrier on the pair, timed on this rank; a sample is the mean of the two directions."""

    def __init__(self, device: torch.device, pair: TensorParallel, message_bytes: int):
        self.device, self.pair, self.bytes = device, pair, message_bytes
        self.samples: list[float] = []
        for _ in range(2):
            self._both()  # warm-up

    def call(self, direction: int) -> None:
        raise NotImplementedError

    def _both(self) -> float:
        total = 0.0
        for direction in (0, 1):
            dist.barrier(group=self.pair.group)
            _synchronise(self.device)
            started = time.perf_counter()
            self.call(direction)
            _synchronise(self.device)
            total += time.perf_counter() - started
        return total / 2

    def run(self) -> None:
        self.samples.append(self._both())

    def fastest(self, chosen: list[int] | None = None) -> float:
        """One call (the mean of the two directions): fast-quarter seconds (or over the runs `chosen`)."""
        return fast_mean_s(self.samples, chosen)


class SliceGatherTimer(PairCallTimer):
    """The runtime's Slice-Gather (gbmw.adapters.runtime.redistribute), forward and backward: a micro-batch's
    hidden state re-laid from sliced in two to replicated (direction 0), and back (direction 1)."""

    def __init__(self, architecture: Any, device: torch.device, dtype: torch.dtype, batch: int,
                 pair: TensorParallel):
        from ..runtime.redistribute import BatchLayout

        self.sliced, self.replicated = BatchLayout((0, 1), 2), BatchLayout((0, 0), 1)
        self.full = torch.randn(batch, architecture.seq_length, architecture.hidden_size, device=device, dtype=dtype)
        self.half = self.sliced.take(self.full, pair.rank).clone()
        super().__init__(device, pair, self.full.numel() * self.full.element_size())

    def call(self, direction: int) -> None:
        from ..runtime.redistribute import relayout

        source, target, value = ((self.sliced, self.replicated, self.half) if direction == 0
                                 else (self.replicated, self.sliced, self.full))
        x = value.detach().requires_grad_()
        relayout(x, source, target, self.pair.rank, self.pair.group).sum().backward()


class PipelineSendTimer(PairCallTimer):
    """The runtime's stage-to-stage transfer (gbmw.adapters.runtime.pipeline.PipelineLinks): a micro-batch's
    hidden state from the pair's first rank to its second (direction 0), then back (direction 1)."""

    def __init__(self, architecture: Any, device: torch.device, dtype: torch.dtype, batch: int,
                 pair: TensorParallel):
        from ..runtime.pipeline import PipelineLinks

        peer = dist.get_process_group_ranks(pair.group)[1 - pair.rank]
        self.links = PipelineLinks(peer, peer)
        self.message = torch.randn(batch, architecture.seq_length, architecture.hidden_size, device=device, dtype=dtype)
        super().__init__(device, pair, self.message.numel() * self.message.element_size())

    def call(self, direction: int) -> None:
        if self.pair.rank == direction:
            self.links.exchange([(self.message, self.links.next_rank)], [])
        else:
            self.links.exchange([], [(torch.empty_like(self.message), self.links.previous_rank)])


MIN_PROFILE_SECONDS = 20.0
"""Passes repeat, interleaved, for at least this long: this machine alternates fast and slow phases of a few
seconds each (timing.py), and the fast passes of each kind must come from fast phases."""


def run_rounds(runners: list, repeats: int, min_seconds: float, pair_group=None,
               progress: Callable[[str], None] = lambda text: None) -> int:
    """Call run() of every runner once per round, for at least `repeats` rounds and `min_seconds`; returns
    the number of rounds. With a group (the profiling pair, or every rank for validate) its ranks agree each
    round whether to go on (the clock of the group's first rank)."""
    started = reported = time.perf_counter()
    rounds = 0
    while True:
        for runner in runners:
            runner.run()
        rounds += 1
        if time.perf_counter() - reported >= 5.0:
            reported = time.perf_counter()
            progress(f"  {rounds} rounds, {reported - started:.0f} of at least {min_seconds:.0f} s")
        more = torch.tensor([float(rounds < repeats or time.perf_counter() - started < min_seconds)])
        if pair_group is not None:
            dist.broadcast(more, group_src=0, group=pair_group)
        if not more.item():
            return rounds


def measure_layer(architecture: Any, name: str, device: torch.device, dtype: torch.dtype, batches: tuple[int, int],
                  tp_pair: TensorParallel | None, in_model: dict[int, dict[str, tuple[float, float]]],
                  pair_in_model: dict[str, dict[str, tuple[float, float]]] | None = None) -> LayerMeasurement:
    """One layer's measurement from whole-model timings (`in_model` per batch size; `pair_in_model` with
    keys "tp" and "sdp" at the larger batch on the profiling pair, given when `tp_pair` is)."""
    small, large = batches
    layer = _build(architecture, name, TensorParallel.single(), device, dtype)
    forward_s = {batch: in_model[batch][name][0] for batch in batches}
    backward_s = {batch: in_model[batch][name][1] for batch in batches}
    forward_slope, forward_intercept = _line(forward_s, small, large)
    backward_slope, backward_intercept = _line(backward_s, small, large)
    saved_small, input_small = _saved_bytes(architecture, name, layer, small, device, dtype)
    saved_large, input_large = _saved_bytes(architecture, name, layer, large, device, dtype)
    per_sample = (saved_large - saved_small) / (large - small)
    boundary = (input_large - input_small) / (large - small)
    split = tp2_seconds = tp2_forward_seconds = sdp2_seconds = None
    if tp_pair is not None:
        tp_layer = _build(architecture, name, tp_pair, device, dtype)
        tp_small, _ = _saved_bytes(architecture, name, tp_layer, small, device, dtype)
        tp_large, _ = _saved_bytes(architecture, name, tp_layer, large, device, dtype)
        split = max(0.0, 2 * (per_sample - (tp_large - tp_small) / (large - small)))
        tp2_seconds = sum(pair_in_model["tp"][name])
        tp2_forward_seconds = pair_in_model["tp"][name][0]
        sdp2_seconds = sum(pair_in_model["sdp"][name])
    return LayerMeasurement(name, forward_slope, backward_slope, forward_intercept, backward_intercept, boundary,
                            per_sample - boundary, split, tp2_seconds, sdp2_seconds, tp2_forward_seconds)


def _shard_over_pair(layer: torch.nn.Module, pair: TensorParallel, device: torch.device) -> None:
    """FSDP2 over the profiling pair, as gbmw.adapters.runtime.sharding applies it to an `sdp` layer (a
    reduce-scatter per call, as on every micro-batch of the runtime)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    fully_shard(layer, mesh=DeviceMesh.from_group(pair.group, device.type), reshard_after_forward=True)
    layer.set_gradient_divide_factor(1.0)
    layer.set_force_sum_reduction_for_comms(True)


def _line(seconds: dict[int, float], small: int, large: int) -> tuple[float, float]:
    """(seconds per sample, seconds per call) through the two measurements; a noisy negative intercept
    becomes 0 with the slope through the larger batch."""
    slope = (seconds[large] - seconds[small]) / (large - small)
    intercept = seconds[small] - small * slope
    if intercept < 0 or slope < 0:
        return seconds[large] / large, 0.0
    return slope, intercept


class OptimizerStepTimer:
    """The runtime's Adam step (local_adam) over every parameter of the model, one timing per run()."""

    def __init__(self, architecture: Any, device: torch.device, dtype: torch.dtype):
        self.device = device
        self.parameters = [parameter for name in layer_names(architecture) for parameter in
                           build_layer(architecture, name, TensorParallel.single(), dtype).to(device).parameters()]
        for parameter in self.parameters:
            parameter.grad = torch.randn_like(parameter)
        self.optimizer = LocalShardAdam(self.parameters, lr=1e-4)
        self.optimizer.step()  # creates the moments
        self.samples: list[float] = []

    def run(self) -> None:
        _synchronise(self.device)
        started = time.perf_counter()
        self.optimizer.step()
        _synchronise(self.device)
        self.samples.append(time.perf_counter() - started)

    def fastest(self, chosen: list[int] | None = None) -> float:
        """The fast-quarter step time (timing.py; or over the runs `chosen`) over the parameter count: seconds
        per parameter."""
        return fast_mean_s(self.samples, chosen) / sum(parameter.numel() for parameter in self.parameters)


def _dtype(precision: str) -> torch.dtype:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(precision)
    if dtype is None:
        from gbmw.errors import SpecError

        raise SpecError(f"--precision {precision!r}: the profiler measures fp32 or bf16 layers")
    return dtype


class ModelProfiler:
    """Every timer of `gbmw profile model`, one run() per round (so the rounds can be interleaved with other
    work, e.g. `gbmw validate --profile-alongside`), and the ModelSpec the measurements give (spec())."""

    def __init__(self, architecture: Any, precision: str, device: torch.device, batches: tuple[int, int],
                 tp_pair: TensorParallel | None):
        self.architecture, self.precision, self.device = architecture, precision, device
        self.batches, self.tp_pair = batches, tp_pair
        self.dtype = dtype = _dtype(precision)
        self.optimizer = OptimizerStepTimer(architecture, device, dtype)
        self.in_model = {batch: InModelLayerTimer(architecture, device, dtype, batch) for batch in batches}
        self.checkpointed = InModelLayerTimer(architecture, device, dtype, batches[1], checkpointed=True)
        self.pair_timers: dict[str, Any] = {}
        if tp_pair is not None:
            self.pair_timers = {
                "tp": InModelLayerTimer(architecture, device, dtype, batches[1], tp=tp_pair),
                "sdp": InModelLayerTimer(architecture, device, dtype, batches[1], shard_over=tp_pair),
                "slice_gather": SliceGatherTimer(architecture, device, dtype, batches[1], tp_pair),
                "p2p": PipelineSendTimer(architecture, device, dtype, batches[1], tp_pair),
            }
        self.timers = [self.optimizer, *self.in_model.values(), self.checkpointed, *self.pair_timers.values()]

    def describe(self) -> str:
        batches = self.batches
        return (f"whole-model passes at batches {batches[0]} and {batches[1]}, and checkpointed at {batches[1]}"
                + (", and on the profiling pair with every layer TP 2 and every layer FSDP2 over 2, a Slice-Gather"
                   " and a pipeline transfer" if self.tp_pair else ""))

    def run(self) -> None:
        for timer in self.timers:
            timer.run()

    def spec(self, how_timed: str, progress: Callable[[str], None] = lambda text: None,
             chosen: list[int] | None = None) -> ModelSpec:
        """The analytic ModelSpec with every layer's time and stashed activations replaced by measurements:
        each timer's fast quarter, or its runs in the rounds `chosen`."""
        architecture, device, dtype, batches, tp_pair = (self.architecture, self.device, self.dtype, self.batches,
                                                          self.tp_pair)
        analytic = build_model(architecture, self.precision)
        in_model = {batch: timer.fastest(chosen) for batch, timer in self.in_model.items()}
        checkpointed = self.checkpointed.fastest(chosen)
        pair_in_model, pair_calls = None, {}
        if tp_pair is not None:
            timers = self.pair_timers
            pair_in_model = {"tp": timers["tp"].fastest(chosen), "sdp": timers["sdp"].fastest(chosen)}
            pair_calls = dict(slice_gather_time_s=timers["slice_gather"].fastest(chosen),
                              slice_gather_bytes=float(timers["slice_gather"].bytes),
                              p2p_time_s=timers["p2p"].fastest(chosen), p2p_bytes=float(timers["p2p"].bytes))
        layers = []
        for index, (name, spec) in enumerate(zip(layer_names(architecture), analytic.layers)):
            progress(f"layer {index + 1}/{len(analytic.layers)} {name}")
            measured = measure_layer(architecture, name, device, dtype, batches, tp_pair, in_model, pair_in_model)
            analytic_intermediate = (spec.intermediate_activation_bytes_per_sample
                                     + spec.intermediate_tp_split_activation_bytes_per_sample)
            if measured.tp_split_bytes_per_sample is not None:
                split = min(measured.tp_split_bytes_per_sample, measured.intermediate_bytes_per_sample)
            else:
                share = (spec.intermediate_tp_split_activation_bytes_per_sample / analytic_intermediate
                         if analytic_intermediate else 0)
                split = measured.intermediate_bytes_per_sample * share
            timings = LayerTimings(
                forward_time_per_sample_s=measured.forward_s_per_sample,
                backward_time_per_sample_s=measured.backward_s_per_sample,
                forward_overhead_s=measured.forward_overhead_s,
                backward_overhead_s=measured.backward_overhead_s,
                profiled_batch=batches[1],
                tp2_time_s=measured.tp2_seconds,
                tp2_forward_time_s=measured.tp2_forward_seconds,
                sdp2_time_s=measured.sdp2_seconds,
                ckpt_time_s=sum(checkpointed[name]),
            )
            layers.append(spec.model_copy(update=dict(
                timings=timings,
                boundary_activation_bytes_per_sample=measured.boundary_bytes_per_sample,
                intermediate_activation_bytes_per_sample=measured.intermediate_bytes_per_sample - split,
                intermediate_tp_split_activation_bytes_per_sample=split,
            )))
        how = ("TP split measured over 2 processes" if tp_pair is not None
               else "TP split taken from the analytic model (one process)")
        source = (f"gbmw profile model on {device} ({torch.__version__}), batches {batches[0]} and {batches[1]}, "
                  f"{how_timed}; {how}")
        timings = ModelTimings(optimizer_step_s_per_parameter=self.optimizer.fastest(chosen), **pair_calls)
        return analytic.model_copy(update=dict(layers=tuple(layers), family="profiled", source=source,
                                               timings=timings))


def profile_model(architecture: Any, precision: str, device: torch.device, batches: tuple[int, int] = (2, 8),
                  repeats: int = 5, tp_pair: TensorParallel | None = None, min_seconds: float = 0.0,
                  progress: Callable[[str], None] = lambda text: None) -> ModelSpec:
    """The analytic ModelSpec with every layer's time and stashed activations replaced by measurements."""
    _dtype(precision)
    profiler = ModelProfiler(architecture, precision, device, batches, tp_pair)
    progress(f"{profiler.describe()}, interleaved for at least {min_seconds:.0f} s")
    run_rounds([profiler], repeats, min_seconds, tp_pair.group if tp_pair is not None else None, progress)
    return profiler.spec(f"fastest quarter of at least {repeats} interleaved whole-model passes over at least "
                         f"{min_seconds:g} s", progress)


def tp_pair_for_profiling() -> TensorParallel | None:
    """TP over ranks 0 and 1 when two or more processes run (all ranks call this; only 0 and 1 measure)."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    group = dist.new_group([0, 1])
    rank = dist.get_rank()
    return TensorParallel(group, 2, rank) if rank < 2 else None


def model_spec_yaml(spec: ModelSpec) -> str:
    """The YAML `gbmw plan` reads as a model (a `layers:` list), with a header saying what it is."""
    import yaml

    data = spec.model_dump(mode="json", exclude_none=True)
    header = (f"# {spec.name}: per-layer costs measured by `gbmw profile model` ({spec.source}).\n"
              "# Use it as a job's `model:` (a path); times are per sample on the profiled device.\n")
    return header + yaml.safe_dump(data, sort_keys=False, width=110)


def run_profile_model(model_reference: str, precision: str, output: str, batches: tuple[int, int], repeats: int,
                      say: Callable[[str], None], min_seconds: float = MIN_PROFILE_SECONDS) -> ModelSpec:
    """`gbmw profile model`: on one process, or on every process of a torchrun/deepspeed launch (ranks 0 and 1
    also measure the TP split; rank 0 writes the YAML)."""
    import os
    from pathlib import Path

    from gbmw.errors import SpecError
    from gbmw.models import load_architecture
    from gbmw.files import write_new_file
    from gbmw.bundled import resolve_recipe

    from ..runtime.launch import finish_distributed, init_distributed
    from ..runtime.model import check_runtime_supports

    if Path(output).exists():
        raise SpecError(f"-o {output}: exists; gbmw never overwrites a file — choose a new name")
    if batches[0] < 1 or batches[1] <= batches[0]:
        raise SpecError(f"--batches {batches[0]},{batches[1]}: give two batch sizes, the second larger, e.g. 2,8")
    architecture = load_architecture(resolve_recipe(model_reference, "models"))
    check_runtime_supports(architecture)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    context = init_distributed() if launched else None
    completed = False
    try:
        device = torch.device(context.device if context else ("cuda" if torch.cuda.is_available() else "cpu"))
        pair = tp_pair_for_profiling() if context else None
        rank = context.rank if context else 0
        spec = profile_model(architecture, precision, device, batches, repeats, pair, min_seconds,
                             progress=say if rank == 0 else (lambda text: None))
        if rank == 0:
            write_new_file(output, model_spec_yaml(spec))
            say(f"wrote {output}: {len(spec.layers)} layers measured on {device} ({spec.source})")
        completed = True
        return spec
    finally:
        if context is not None:
            finish_distributed(completed)
