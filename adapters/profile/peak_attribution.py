"""Where a traced peak's memory lives: every storage alive at the moment of a rank's peak (gbmw.adapters.profile
.fake_memory), summed by the source lines that made it.

MemTracker gives the peak's bytes by category (parameters, optimizer states, and "activation" and "temporary" as it
tells them apart), which says how much a step holds, not what. This tracker also notes, for every storage an
operator creates, the innermost gbmw source lines on the Python stack (the runtime's, the estimator's names
for what it holds are its docstrings), the operator and the shape of the tensor that first viewed it; at each new
peak it sums the live storages by (category, lines, operator, shape). `--attribute N` of benchmarks/memory_at_scale.py
prints the N largest groups beside each stage's estimate. (A storage made while the peak's own operator runs has no
lines yet: its group reads "the peak's own output".)

Recording a stack per new storage slows a trace about twofold; the plain trace does not do it.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._pytree import tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

from .fake_memory import StepPeakTracker

SOURCE_LINES = 3
"""gbmw frames named per storage, innermost first."""
OWN_OUTPUT = ("the peak's own output", "", (), "")
_ROOT = Path(__file__).resolve().parents[2]
PROJECT_SOURCES = (str(_ROOT / "gbmw") + os.sep, str(_ROOT / "adapters") + os.sep)
"""Where gbmw's own source files live (the gbmw package and its adapters)."""


@dataclass(frozen=True)
class PeakGroup:
    category: str
    """MemTracker's category of the storages (parameter, optimizer state, activation, temporary)."""
    lines: str
    """The innermost gbmw source lines that made them, `file:line < caller:line …`."""
    operator: str
    shape: tuple
    """The shape of the tensor that first viewed the storage (a flat buffer may hold more)."""
    dtype: str
    bytes: int


class PeakAttributingTracker(StepPeakTracker):
    """StepPeakTracker that also keeps, at each new peak, the live storages grouped by where they were made."""

    def __init__(self) -> None:
        super().__init__()
        self._sources = WeakIdKeyDictionary()
        self._operator = ""
        self._best_bytes = 0
        self.peak_operator = ""
        self.peak_in_backward = False
        self.peak_groups: list[PeakGroup] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._operator = str(func)
        result = super().__torch_dispatch__(func, types, args, kwargs)
        tree_map_only(torch.Tensor, self._note_source, result)
        return result

    def _note_source(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage in self._sources:
            return
        frames = [frame for frame in traceback.extract_stack()
                  if frame.filename.startswith(PROJECT_SOURCES) and frame.filename != __file__]
        lines = " < ".join(f"{os.path.basename(frame.filename)}:{frame.lineno}"
                           for frame in reversed(frames[-SOURCE_LINES:]))
        self._sources[storage] = (lines, self._operator, tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""))

    def _update_peak_stats(self, peak_state) -> None:
        super()._update_peak_stats(peak_state)
        total = sum(snapshot["Total"] for snapshot in self._curr_mem_snap.values())
        if total > self._best_bytes:
            self._best_bytes = total
            self.peak_operator, self.peak_in_backward = self._operator, self._mod_tracker.is_bw
            self.peak_groups = self._live_groups()

    def _live_groups(self) -> list[PeakGroup]:
        sums: Counter = Counter()
        for storage, (info, _reference) in list(self._WINFO.items()):
            lines, operator, shape, dtype = self._sources.get(storage, OWN_OUTPUT)
            category = str(getattr(info.reftype, "value", info.reftype))
            sums[(category, lines, operator, shape, dtype)] += info.mem_consumed
        return [PeakGroup(*key, size) for key, size in sums.most_common()]
