"""The global gradient norm's sums of squares in float64, a chunk at a time (the engine's gradient clipping,
gbmw.adapters.runtime.engine.HybridEngine._clip_gradients; its memory passes are priced in
gbmw.cost.runtime_passes)."""

from __future__ import annotations

import torch

NORM_CHUNK_ELEMENTS = 2**22
"""Elements squared in float64 at a time for the gradient norm: its transient memory is 16 bytes per element
of one chunk (64 MiB), not of the largest gradient (an embedding's 16 bytes × vocabulary × hidden)."""


def sum_of_squares_float64(tensor: torch.Tensor) -> torch.Tensor:
    """Σ x² of every element, each squared and summed in float64, a chunk at a time."""
    flat = tensor.reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=tensor.device)
    for start in range(0, flat.numel(), NORM_CHUNK_ELEMENTS):
        total += flat[start:start + NORM_CHUNK_ELEMENTS].double().square().sum()
    return total
