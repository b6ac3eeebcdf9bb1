"""The order the outer search visits its settings in: decreasing memory-aware bound, each bound computed lazily.

Every setting (gbmw.search.units.Setting) carries two upper bounds of the samples/s any of its plans reaches: the
cheap throughput bound U_t (gbmw.search.bounds.setting_bounds, computed for all) and the tighter memory-aware bound
U_m ≤ U_t (gbmw.search.bounds.stage_knapsack_bound, a few ms each). Visiting by U_t and skipping a setting whose U_m
cannot beat the best found (the order before 2026-12) searches settings that a better plan, found later, would have
skipped: GPT-3 65B on 64 H100s searches its optimum's setting 19th of the settings sorted by U_t, though its U_m is
the 4th largest.

Best-first on U_m without computing every U_m: the settings are sorted by U_t; U_m of the next one is computed only
while its U_t exceeds the largest U_m not yet visited — an unexamined setting's U_m ≤ U_t ≤ that largest, so it
cannot come first. A setting is visited while its U_m exceeds the best samples/s found so far; the search ends when
no examined U_m and no unexamined U_t does. Which plan wins is unchanged (any setting skipped or left unvisited is
bounded by the best found); only ties between settings may resolve differently from the U_t order.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from gbmw.search.units import Setting


class SettingsBestFirst:
    """Iterates `settings` (sorted by decreasing throughput bound) by decreasing `memory_bound(setting)` while that
    exceeds `best_samples_per_s()`, read before each step (the search raises it as it finds plans).
    `examined` counts the settings whose throughput bound has been passed over or whose memory bound computed."""

    def __init__(self, settings: list[Setting], memory_bound: Callable[[Setting], float],
                 best_samples_per_s: Callable[[], float]):
        if any(later.throughput_bound > earlier.throughput_bound for earlier, later in zip(settings, settings[1:])):
            raise ValueError("settings must come sorted by decreasing throughput bound")
        self.settings, self.memory_bound, self.best_samples_per_s = settings, memory_bound, best_samples_per_s
        self.examined = 0
        self._waiting: list[tuple[float, int, Setting]] = []  # (−memory bound, index, setting): a max-heap

    def __iter__(self) -> Iterator[Setting]:
        while True:
            floor = self.best_samples_per_s()
            while self.examined < len(self.settings):
                setting = self.settings[self.examined]
                if setting.throughput_bound <= floor:  # it and every later one are bounded by the best found
                    self.examined = len(self.settings)
                    break
                if self._waiting and setting.throughput_bound <= -self._waiting[0][0]:
                    break  # no unexamined setting can come before the waiting one
                self.examined += 1
                bound = self.memory_bound(setting)
                if bound > floor:
                    heapq.heappush(self._waiting, (-bound, self.examined, setting))
            if not self._waiting or -self._waiting[0][0] <= floor:
                return
            yield heapq.heappop(self._waiting)[2]
