"""One layer's candidate strategies at one position of a stage: what a step of the stage DP (Eq. (4)) chooses
from, in the terms both DP engines read (gbmw.search.stage_dp.grid_frontier, gbmw.search.stage_dp.pareto)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numba import njit


@njit(cache=True)
def dominated_options(time, stash, forward, backward, layout) -> np.ndarray:
    """Options another option of the same layout beats in every respect (no slower, no more stash or
    backward extra, at least as much forward stash — which lowers the excess). Ties keep the first."""
    n = time.shape[0]
    dropped = np.zeros(n, np.bool_)
    for i in range(n):
        for j in range(n):
            if i == j or dropped[j] or layout[i] != layout[j]:
                continue
            if (time[j] <= time[i] and stash[j] <= stash[i] and backward[j] <= backward[i]
                    and forward[j] >= forward[i]):
                dropped[i] = True
                break
    return dropped


@dataclass(frozen=True)
class LayerOptions:
    """The candidate strategies of one layer at one stage position. Memory is in bytes; the exact engine
    counts it in whole units of its own (`in_units`)."""

    strategy: np.ndarray
    """Index into the stage's strategy list."""
    time_s: np.ndarray
    """The layer's share of the stage objective, (m − 1)·c_no_sync + c, plus what the position adds (the
    input received from the previous stage)."""
    states: np.ndarray
    """O_ms, less a tied weight whose twin the stage already holds."""
    forward: np.ndarray
    """O_f of one micro-batch, with the side input when this layer is the first of the stage to read one."""
    backward: np.ndarray
    """O_b."""
    layout: np.ndarray
    """Activation-layout id of each strategy (R depends on layouts only)."""
    in_flight: int
    """Micro-batches whose activations the stage stashes (1F1B: min(P − i, m))."""

    @property
    def stash(self) -> np.ndarray:
        """O_ms + k · O_f: the layer's share of the stage's forward memory E_f (Eq. (3)) with k micro-batches."""
        return self.states + self.in_flight * self.forward

    def in_units(self, unit_bytes: int) -> "LayerOptions":
        """Memory rounded up to whole units of `unit_bytes` (a plan the exact engine accepts never exceeds its
        budget by this rounding)."""
        return replace(self, states=to_units(self.states, unit_bytes), forward=to_units(self.forward, unit_bytes),
                       backward=to_units(self.backward, unit_bytes))

    def pruned(self) -> "LayerOptions":
        """Without the options another option of the same layout beats in every respect."""
        keep = ~dominated_options(self.time_s, self.stash, self.forward, self.backward, self.layout)
        return replace(self, **{name: getattr(self, name)[keep]
                                for name in ("strategy", "time_s", "states", "forward", "backward", "layout")})


def to_units(values_bytes: np.ndarray, unit_bytes: int) -> np.ndarray:
    """Memory in whole units, rounded up."""
    return np.ceil(np.asarray(values_bytes, dtype=np.float64) / unit_bytes - 1e-9).astype(np.int64).clip(min=0)
