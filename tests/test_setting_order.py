"""gbmw.search.setting_order: settings visited by decreasing memory-aware bound, each bound computed only when it
could come first, and the best found equal to a visit of every setting."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gbmw.search.setting_order import SettingsBestFirst
from gbmw.search.units import Setting


def make_settings(throughput_bounds: list[float]) -> list[Setting]:
    return [Setting(pp=1, micro_batch=1, num_micro_batches=index + 1, tables=None, allowed=np.ones((1, 1), bool),
                    throughput_bound=bound) for index, bound in enumerate(sorted(throughput_bounds, reverse=True))]


def visit(settings, memory_bounds, values):
    """Run the order as the planner does: `values[id]` is what searching a setting finds (≤ its memory bound)."""
    computed, visited, best = [], [], [0.0]

    def memory_bound(setting):
        computed.append(setting.num_micro_batches)
        return memory_bounds[setting.num_micro_batches]

    for setting in SettingsBestFirst(settings, memory_bound, lambda: best[0]):
        visited.append(setting.num_micro_batches)
        best[0] = max(best[0], values[setting.num_micro_batches])
    return best[0], visited, computed


def test_by_hand():
    # throughput bounds 10, 9, 8, 5; memory bounds 6, 8.5, 7, 4; what a search finds 6, 7, 6.5, 4
    settings = make_settings([10, 9, 8, 5])
    memory_bounds = {1: 6.0, 2: 8.5, 3: 7.0, 4: 4.0}
    values = {1: 6.0, 2: 7.0, 3: 6.5, 4: 4.0}
    best, visited, computed = visit(settings, memory_bounds, values)
    # setting 2 (8.5) first, found 7; setting 3's bound 7 does not beat 7, setting 1's 6 neither; setting 4's
    # throughput bound 5 ends it without its memory bound (the U_t order visits 1, 2 and computes 1, 2, 3)
    assert (best, visited, computed) == (7.0, [2], [1, 2, 3])


def test_unsorted_settings_are_refused():
    settings = make_settings([3, 2])
    settings.reverse()
    with pytest.raises(ValueError, match="sorted by decreasing throughput bound"):
        list(SettingsBestFirst(settings, lambda s: 1.0, lambda: 0.0))


@pytest.mark.parametrize("seed", range(200))
def test_best_equals_every_setting_and_bounds_are_lazy(seed):
    rng = random.Random(seed)
    count = rng.randint(1, 12)
    # coarse values so that ties between bounds and values occur often
    throughput = [rng.randint(1, 10) for _ in range(count)]
    settings = make_settings(throughput)
    memory_bounds = {s.num_micro_batches: float(rng.randint(0, int(s.throughput_bound))) for s in settings}
    values = {key: float(rng.randint(0, int(bound))) for key, bound in memory_bounds.items()}
    best, visited, computed = visit(settings, memory_bounds, values)
    assert best == max(values.values(), default=0.0)  # nothing better was left unvisited
    assert len(set(visited)) == len(visited) and set(visited) <= set(computed)
    assert len(set(computed)) == len(computed)  # each memory bound computed once
    # visits come in non-increasing memory bound, each above the best found before it
    seen = 0.0
    for earlier, later in zip(visited, visited[1:]):
        assert memory_bounds[earlier] >= memory_bounds[later]
    for key in visited:
        assert memory_bounds[key] > seen
        seen = max(seen, values[key])
