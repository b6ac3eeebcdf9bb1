"""Stashed-activation accounting: the bytes autograd keeps from forward to backward.

Every tensor autograd saves for backward passes through `torch.autograd.graph.saved_tensors_hooks`; the
meter records the storage behind it (views of one storage count once) and leaves out the storages of
parameters, which are model states, not activations. That is the paper's O_f (Sec. 3.1, the forward
activation memory of a layer) measured on any device, CPU included, without allocator statistics.
"""

from __future__ import annotations

from typing import Iterable

import torch


class SavedActivationMeter:
    """`with SavedActivationMeter(parameters) as meter: loss = layer(x)` → `meter.bytes`, `meter.storages`."""

    def __init__(self, parameters: Iterable[torch.Tensor] = ()):
        self._excluded = {_storage_key(parameter) for parameter in parameters}
        self.storages: dict[int, int] = {}
        """Storage address → bytes, for every storage a saved tensor lives in."""
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = _storage_key(tensor)
        if key not in self._excluded and not _is_parameter(tensor):
            self.storages[key] = tensor.untyped_storage().nbytes()
        return tensor

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether autograd saved (a view of) this tensor's storage."""
        return _storage_key(tensor) in self.storages

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def __enter__(self) -> "SavedActivationMeter":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def _is_parameter(tensor: torch.Tensor) -> bool:
    """A parameter or a view of one: weights are model states even when FSDP2 hands autograd its gathered
    copy (a Parameter it registers for the layer's forward and frees after), which no fixed set can list."""
    return isinstance(tensor, torch.nn.Parameter) or isinstance(getattr(tensor, "_base", None), torch.nn.Parameter)


def _storage_key(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.untyped_storage().data_ptr()
