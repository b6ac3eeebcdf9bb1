"""`gbmw profile model`: per-layer time and memory measured on the local device (paper Sec. 5, Cost Estimator:
the per-sample computation time of each layer is profiled; memory comes from the tensors themselves).

For every layer of the planner's ModelSpec the runtime's own module (gbmw.adapters.runtime.model) runs
forward and backward on this device at two batch sizes:
- every layer timed inside whole-model passes, plain, checkpointed, and on the profiling pair with TP 2
  and with FSDP2 (layer_timers.py);
- one Slice-Gather and one pipeline transfer on the profiling pair (pair_timers.py);
- the runtime's Adam step time per parameter (optimizer_step_timer.py);
- each layer's time as a line over the batch size, its stashed activations and the part TP divides
  (layer_measurement.py).
All of them run interleaved, round after round, for at least `min_seconds` (`run_rounds`).
Parameters, FLOPs, TP all-reduce bytes, heads and ties stay those of the analytic model (they are shapes,
not measurements). The result is a ModelSpec YAML (`layers:`) that `gbmw plan` reads in place of the
analytic costs.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from gbmw.specs.model_spec import LayerTimings, ModelSpec, ModelTimings
from gbmw.specs.models import build_model

from ..runtime.model import layer_names
from ..runtime.tensor_parallel import TensorParallel
from .layer_measurement import measure_layer
from .layer_timers import InModelLayerTimer
from .optimizer_step_timer import OptimizerStepTimer
from .pair_timers import PipelineSendTimer, SliceGatherTimer

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
        more = torch.tensor([float(rounds < repeats or time.perf_counter() - started < min_seconds)],
                            device=_collective_device(pair_group))
        if pair_group is not None:
            dist.broadcast(more, group_src=0, group=pair_group)
        if not more.item():
            return rounds


def _collective_device(group) -> torch.device:
    """Where a tensor for a collective over `group` must live: the current CUDA device under NCCL (it reduces
    device tensors only), else the CPU."""
    if group is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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
                      say: Callable[[str], None], min_seconds: float = MIN_PROFILE_SECONDS,
                      seq_length: int | None = None, flash_attention: bool | None = None) -> ModelSpec:
    """`gbmw profile model`: on one process, or on every process of a torchrun/deepspeed launch (ranks 0 and 1
    also measure the TP split; rank 0 writes the YAML), at `seq_length` tokens per sample (None: the model file's)."""
    import os
    from pathlib import Path

    from gbmw.errors import SpecError
    from gbmw.specs.bundled import resolve_recipe
    from gbmw.specs.files import write_new_file
    from gbmw.specs.models import load_architecture

    from ..runtime.launch import finish_distributed, start_after_checking
    from ..runtime.model import check_runtime_supports

    def read_inputs():
        if Path(output).exists():
            raise SpecError(f"-o {output}: exists; gbmw never overwrites a file — choose a new name")
        if batches[0] < 1 or batches[1] <= batches[0]:
            raise SpecError(f"--batches {batches[0]},{batches[1]}: give two batch sizes, the second larger, e.g. 2,8")
        architecture = load_architecture(resolve_recipe(model_reference, "models"), seq_length, flash_attention)
        check_runtime_supports(architecture)
        return architecture

    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    architecture, context = start_after_checking(read_inputs) if launched else (read_inputs(), None)
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
