"""What a rank of the runtime holds during a training step: model states and stashed activations.

The estimator's memory (paper Sec. 3.1: O_ms + O_f, from tensor shapes) is compared here with the tensors
the runtime really holds, on any device:
- model states: the bytes of this rank's parameters (its TP slice, its ZeRO shard), their gradients and
  the optimizer's states, read from the tensors themselves once the step has all of them (after the
  optimizer step, before gradients are dropped); storages shared by two names (a tied weight) count once;
- stashed activations: every tensor autograd saves in a micro-batch's forward (SavedActivationMeter),
  held until that micro-batch's backward ends; the peak is the largest sum over the micro-batches in
  flight at once — what the 1F1B schedule really keeps, not a formula.
Not held here and not measured: transient buffers (a checkpointed layer's recomputation, FSDP2's gathered
parameters of the running layer, kernel workspaces). The estimator's `backward extra` for them is reported
apart (gbmw validate prints both).
"""

from __future__ import annotations

import torch

from ..runtime.sharding import local_value
from .activations import SavedActivationMeter


class HeldMemoryProbe:
    """Attach to a HybridEngine for one step (`engine.observer = HeldMemoryProbe(engine)`); read after it."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._meters: dict[int, SavedActivationMeter] = {}
        self._live: dict[int, int] = {}
        self.peak_activation_bytes = 0
        self.model_state_bytes = 0

    def forward_context(self, index: int) -> "_ForwardWindow":
        meter = SavedActivationMeter(self.engine._all_parameters())
        self._meters[index] = meter
        return _ForwardWindow(self, index, meter)

    def _forward_finished(self, index: int) -> None:
        self._live[index] = self._meters.pop(index).bytes
        self.peak_activation_bytes = max(self.peak_activation_bytes, sum(self._live.values()))

    def backward_finished(self, index: int) -> None:
        self._live.pop(index, None)

    def step_finished(self) -> None:
        storages: dict[int, int] = {}
        for parameter in self.engine._all_parameters():
            tensors = [parameter, parameter.grad] + list(self.engine.optimizer.state.get(parameter, {}).values())
            for tensor in tensors:
                if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
                    local = local_value(tensor)
                    storages[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
        self.model_state_bytes = sum(storages.values())


class _ForwardWindow:
    def __init__(self, probe: HeldMemoryProbe, index: int, meter: SavedActivationMeter):
        self.probe, self.index, self.meter = probe, index, meter

    def __enter__(self):
        self.meter.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.meter.__exit__(*exc)
        self.probe._forward_finished(self.index)
