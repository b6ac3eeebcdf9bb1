"""One layer's entry of `gbmw profile model`: its times from the whole-model timings (layer_timers.py) at two
batch sizes, and the tensors its forward stashes.

- time: a line through the two batch sizes: seconds per sample (the slope; the paper's per-sample time)
  and seconds per call (the intercept: launches and Python, which make tiny micro-batches slow);
- stashed activations: the bytes autograd saves (adapters/profile/activations.py), as the slope between
  the two batch sizes, so anything that does not grow with the batch (position indices) is left out; the
  layer input is the boundary (Sec. 3.1 `bnd`), the rest intermediate;
- which part of the intermediate bytes TP divides: launched with two or more processes, the layer is
  measured again with TP over ranks 0 and 1 (S₁ = R + T, S₂ = R + T/2, so T = 2(S₁ − S₂)); on one
  process the analytic model's split of that layer is used (model_profiler.py), and the profile's
  `source` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..runtime.model import synthetic_batch
from ..runtime.tensor_parallel import TensorParallel
from .activations import SavedActivationMeter
from .layer_timers import _build


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


def _saved_bytes(architecture, name, layer, batch, device, dtype) -> tuple[int, int]:
    """(saved bytes, the input's bytes if saved else 0) of one forward."""
    x, labels = _layer_inputs(architecture, name, batch, device, dtype)
    with SavedActivationMeter(layer.parameters()) as meter:
        _run_layer(layer, name, x, labels)
    return meter.bytes, (x.untyped_storage().nbytes() if meter.holds(x) else 0)


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


def _line(seconds: dict[int, float], small: int, large: int) -> tuple[float, float]:
    """(seconds per sample, seconds per call) through the two measurements; a noisy negative intercept
    becomes 0 with the slope through the larger batch."""
    slope = (seconds[large] - seconds[small]) / (large - small)
    intercept = seconds[small] - small * slope
    if intercept < 0 or slope < 0:
        return seconds[large] / large, 0.0
    return slope, intercept
