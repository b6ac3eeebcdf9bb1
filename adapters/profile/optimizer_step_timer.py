"""The optimizer step for `gbmw profile model`: the runtime's Adam step (local_adam) over every parameter of
the model on this device, timed once per round; the mean over the fastest quarter of the rounds (timing.py)
over the parameter count is the profile's `optimizer_step_s_per_parameter`.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..runtime.local_adam import LocalShardAdam
from ..runtime.model import build_layer, layer_names
from ..runtime.tensor_parallel import TensorParallel
from .layer_timers import _synchronise
from .timing import fast_mean_s


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
