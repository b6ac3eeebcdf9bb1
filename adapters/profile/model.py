"""`gbmw profile model`: per-layer time and memory measured on the local device (paper Sec. 5, Cost Estimator:
the per-sample computation time of each layer is profiled; memory comes from the tensors themselves).

For every layer of the planner's ModelSpec the runtime's own module (gbmw.adapters.runtime.model) runs
forward and backward on this device at two batch sizes:
- time: median of `repeats` timed runs at each batch size, as a line: seconds per sample (the slope; the
  paper's per-sample time) and seconds per call (the intercept: launches and Python, which make tiny
  micro-batches slow); backward measured separately (the analytic default is 2 × forward); and torch
  Adam's step time per parameter;
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

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from gbmw.models import build_model
from gbmw.spec import ModelSpec

from ..runtime.model import build_layer, initial_value, layer_names, synthetic_batch
from ..runtime.tensor_parallel import TensorParallel, shard_for_rank, partition_dims
from .activations import SavedActivationMeter


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
    """The same with the layer sharded over the two ranks by FSDP2 (no gradient sync: most micro-batches)."""


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


MIN_TIMED_SECONDS = 0.1
"""Short runs repeat until at least this much time is timed (up to 50 × repeats): a 50 µs layer call needs
hundreds of runs for a stable median on a loaded machine."""


def _median_time_s(run: Callable[[], None], repeats: int, device: torch.device) -> float:
    times: list[float] = []
    while len(times) < repeats or (sum(times) < MIN_TIMED_SECONDS and len(times) < 50 * repeats):
        _synchronise(device)
        started = time.perf_counter()
        run()
        _synchronise(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def time_layers_in_model(architecture: Any, device: torch.device, dtype: torch.dtype, batch: int,
                         repeats: int) -> dict[str, tuple[float, float]]:
    """Median (forward s, backward s) of every layer while the whole model trains on `batch` samples: timed
    by module hooks inside full forward/backward passes, so each layer runs with the caches, allocator
    state and autograd bookkeeping of real training rather than alone in a hot loop."""
    names = layer_names(architecture)
    layers = [_build(architecture, name, TensorParallel.single(), device, dtype) for name in names]
    data = synthetic_batch(architecture, batch, step=0, seed=0)
    labels = {key: value.to(device) for key, value in data.items() if key != "inputs"}
    marks: dict[tuple[str, str], float] = {}

    def mark(key):
        def hook(*_):
            _synchronise(device)
            marks[key] = time.perf_counter()
        return hook

    for name, layer in zip(names, layers):
        layer.register_forward_pre_hook(mark((name, "forward start")))
        layer.register_forward_hook(mark((name, "forward end")))
        if name != "embedding":  # token ids need no gradient: the embedding's backward is the pass's tail (below)
            layer.register_full_backward_pre_hook(mark((name, "backward start")))
            layer.register_full_backward_hook(mark((name, "backward end")))
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for run in range(repeats + 2):
        marks.clear()
        x = data["inputs"].to(device)
        for name, layer in zip(names, layers):
            x = layer(x, labels) if name == "head" else layer(x)
        x.backward()
        _synchronise(device)
        finished = time.perf_counter()
        if run < 2:
            continue  # warm-up
        for position, name in enumerate(names):
            forward = marks[(name, "forward end")] - marks[(name, "forward start")]
            if name == "embedding":  # from the next layer's backward end to the end of the pass
                backward = finished - marks[(names[position + 1], "backward end")]
            else:
                backward = marks[(name, "backward end")] - marks[(name, "backward start")]
            samples[name].append((forward, backward))
    return {name: (statistics.median(f for f, _ in values), statistics.median(b for _, b in values))
            for name, values in samples.items()}


def measure_layer(architecture: Any, name: str, device: torch.device, dtype: torch.dtype, batches: tuple[int, int],
                  repeats: int, tp_pair: TensorParallel | None,
                  in_model: dict[int, dict[str, tuple[float, float]]] | None = None) -> LayerMeasurement:
    small, large = batches
    layer = _build(architecture, name, TensorParallel.single(), device, dtype)
    in_model = in_model or {batch: time_layers_in_model(architecture, device, dtype, batch, repeats)
                            for batch in batches}
    forward_s = {batch: in_model[batch][name][0] for batch in batches}
    backward_s = {batch: in_model[batch][name][1] for batch in batches}
    forward_slope, forward_intercept = _line(forward_s, small, large)
    backward_slope, backward_intercept = _line(backward_s, small, large)
    saved_small, input_small = _saved_bytes(architecture, name, layer, small, device, dtype)
    saved_large, input_large = _saved_bytes(architecture, name, layer, large, device, dtype)
    per_sample = (saved_large - saved_small) / (large - small)
    boundary = (input_large - input_small) / (large - small)
    split = tp2_seconds = sdp2_seconds = None
    if tp_pair is not None:
        tp_layer = _build(architecture, name, tp_pair, device, dtype)
        tp_small, _ = _saved_bytes(architecture, name, tp_layer, small, device, dtype)
        tp_large, _ = _saved_bytes(architecture, name, tp_layer, large, device, dtype)
        split = max(0.0, 2 * (per_sample - (tp_large - tp_small) / (large - small)))
        tp2_seconds = _step_seconds(tp_layer, architecture, name, large, device, dtype, repeats, tp_pair.group)
        sharded = _build(architecture, name, TensorParallel.single(), device, dtype)
        _shard_over_pair(sharded, tp_pair, device)
        sdp2_seconds = _step_seconds(sharded, architecture, name, large, device, dtype, repeats, tp_pair.group)
    return LayerMeasurement(name, forward_slope, backward_slope, forward_intercept, backward_intercept, boundary,
                            per_sample - boundary, split, tp2_seconds, sdp2_seconds)


def _step_seconds(layer, architecture, name, batch, device, dtype, repeats, group) -> float:
    """Median forward + backward of one call on the profiling pair (FSDP2 hooks and collectives included),
    both ranks starting together: a barrier before each timed run, outside the timing."""
    x, labels = _layer_inputs(architecture, name, batch, device, dtype)
    _run_layer(layer, name, x, labels).backward()
    times = []
    for _ in range(repeats):
        dist.barrier(group=group)
        _synchronise(device)
        started = time.perf_counter()
        _run_layer(layer, name, x, labels).backward()
        _synchronise(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _shard_over_pair(layer: torch.nn.Module, pair: TensorParallel, device: torch.device) -> None:
    """FSDP2 over the profiling pair, as gbmw.adapters.runtime.sharding applies it to an `sdp` layer."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    fully_shard(layer, mesh=DeviceMesh.from_group(pair.group, device.type), reshard_after_forward=True)
    layer.set_force_sum_reduction_for_comms(True)
    layer.set_requires_gradient_sync(False)


def _line(seconds: dict[int, float], small: int, large: int) -> tuple[float, float]:
    """(seconds per sample, seconds per call) through the two measurements; a noisy negative intercept
    becomes 0 with the slope through the larger batch."""
    slope = (seconds[large] - seconds[small]) / (large - small)
    intercept = seconds[small] - small * slope
    if intercept < 0 or slope < 0:
        return seconds[large] / large, 0.0
    return slope, intercept


def measure_optimizer_step_s_per_parameter(architecture: Any, device: torch.device, dtype: torch.dtype,
                                           repeats: int) -> float:
    """torch Adam's step over every parameter of the model (the runtime's optimizer, one group per layer
    kind as the engine builds it), median time over the parameter count."""
    parameters = [parameter for name in layer_names(architecture)
                  for parameter in build_layer(architecture, name, TensorParallel.single(), dtype).to(device).parameters()]
    for parameter in parameters:
        parameter.grad = torch.randn_like(parameter)
    optimizer = torch.optim.Adam(parameters, lr=1e-4)
    optimizer.step()  # creates the moments
    seconds = _median_time_s(optimizer.step, repeats, device)
    return seconds / sum(parameter.numel() for parameter in parameters)


def profile_model(architecture: Any, precision: str, device: torch.device, batches: tuple[int, int] = (2, 8),
                  repeats: int = 5, tp_pair: TensorParallel | None = None,
                  progress: Callable[[str], None] = lambda text: None) -> ModelSpec:
    """The analytic ModelSpec with every layer's time and stashed activations replaced by measurements."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(precision)
    if dtype is None:
        from gbmw.errors import SpecError

        raise SpecError(f"--precision {precision!r}: the profiler measures fp32 or bf16 layers")
    analytic = build_model(architecture, precision)
    progress("whole-model passes (per-layer times in context)")
    in_model: dict = {batch: time_layers_in_model(architecture, device, dtype, batch, repeats) for batch in batches}
    layers = []
    for index, (name, spec) in enumerate(zip(layer_names(architecture), analytic.layers)):
        progress(f"layer {index + 1}/{len(analytic.layers)} {name}")
        measured = measure_layer(architecture, name, device, dtype, batches, repeats, tp_pair, in_model)
        analytic_intermediate = (spec.intermediate_activation_bytes_per_sample
                                 + spec.intermediate_tp_split_activation_bytes_per_sample)
        if measured.tp_split_bytes_per_sample is not None:
            split = min(measured.tp_split_bytes_per_sample, measured.intermediate_bytes_per_sample)
        else:
            share = spec.intermediate_tp_split_activation_bytes_per_sample / analytic_intermediate if analytic_intermediate else 0
            split = measured.intermediate_bytes_per_sample * share
        layers.append(spec.model_copy(update=dict(
            forward_time_per_sample_s=measured.forward_s_per_sample,
            backward_time_per_sample_s=measured.backward_s_per_sample,
            forward_overhead_s=measured.forward_overhead_s,
            backward_overhead_s=measured.backward_overhead_s,
            profiled_batch=batches[1],
            tp2_time_s=measured.tp2_seconds,
            sdp2_time_s=measured.sdp2_seconds,
            boundary_activation_bytes_per_sample=measured.boundary_bytes_per_sample,
            intermediate_activation_bytes_per_sample=measured.intermediate_bytes_per_sample - split,
            intermediate_tp_split_activation_bytes_per_sample=split,
        )))
    how = "TP split measured over 2 processes" if tp_pair is not None else "TP split taken from the analytic model (one process)"
    source = (f"gbmw profile model on {device} ({torch.__version__}), batches {batches[0]} and {batches[1]}, "
              f"median of {repeats}; {how}")
    progress("optimizer step")
    optimizer_s = measure_optimizer_step_s_per_parameter(architecture, device, dtype, repeats)
    return analytic.model_copy(update=dict(layers=tuple(layers), family="profiled", source=source,
                                           architecture=architecture.model_dump_json(exclude_defaults=True),
                                           optimizer_step_s_per_parameter=optimizer_s))


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
                      say: Callable[[str], None]) -> ModelSpec:
    """`gbmw profile model`: on one process, or on every process of a torchrun/deepspeed launch (ranks 0 and 1
    also measure the TP split; rank 0 writes the YAML)."""
    import os
    from pathlib import Path

    from gbmw.errors import SpecError
    from gbmw.models import load_architecture
    from gbmw.plan import write_new_file
    from gbmw.spec import resolve_recipe

    from ..runtime.launch import init_distributed
    from ..runtime.model import check_runtime_supports

    if Path(output).exists():
        raise SpecError(f"-o {output}: exists; gbmw never overwrites a file — choose a new name")
    if batches[0] < 1 or batches[1] <= batches[0]:
        raise SpecError(f"--batches {batches[0]},{batches[1]}: give two batch sizes, the second larger, e.g. 2,8")
    architecture = load_architecture(resolve_recipe(model_reference, "models"))
    check_runtime_supports(architecture)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    context = init_distributed() if launched else None
    try:
        device = torch.device(context.device if context else ("cuda" if torch.cuda.is_available() else "cpu"))
        pair = tp_pair_for_profiling() if context else None
        rank = context.rank if context else 0
        spec = profile_model(architecture, precision, device, batches, repeats, pair,
                             progress=say if rank == 0 else (lambda text: None))
        if rank == 0:
            write_new_file(output, model_spec_yaml(spec))
            say(f"wrote {output}: {len(spec.layers)} layers measured on {device} ({spec.source})")
        return spec
    finally:
        if context is not None:
            dist.destroy_process_group()
