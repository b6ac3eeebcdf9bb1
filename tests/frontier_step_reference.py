"""The exact stage DP's step as it was computed before the fused pass (gbmw.search.exact.frontier_step) became the
one implementation: `extend_candidates` writes every new partial plan, `_plan_rows` their filter columns,
`merged_order` their order (lexsort's, found by merging sorted runs) and `nondominated_plans` keeps what
gbmw.search.exact.whole_plan_frontier's `_nondominated` keeps of them. Kept here, line for line, as the independent
reference tests/test_frontier_step.py and tests/test_frontier_order.py compare the fused step with, row for row.

The filter visits rows by (group, first column, sum of the columns), equal rows in the order they were made — the
order `np.lexsort((total, first, group))` gives. Visiting the options by layout (the filter's group) and the parents
by their stash (gbmw.search.exact.frontier_order.stash_order) makes the rows come by group, each option's block
already sorted by the first column: a natural merge of those runs per group, then a short sort of each run of equal
stashes by (total, key), gives exactly lexsort's order on those rows (`key`: a row's place in the order the DP made
them, option-major, parents in their stored order)."""

from __future__ import annotations

import numpy as np
from numba import njit

from gbmw.cost.framework_memory import ADAM_CHUNK_ELEMENTS
from gbmw.search.exact.frontier_order import SHORT_RUN
from gbmw.search.exact.whole_plan_frontier import _nondominated


@njit(cache=True)
def extend_candidates(stash, excess, no_sync, sync, params, layout, parent_order, option_order,
                       o_no_sync, o_sync, o_stash, o_forward, o_backward, o_params, o_layout,
                       transition, budget, reserve_per_parameter, chunk, m, step_s, rest_s, limit_s,
                       rest_stash, rest_carry, rest_params, later_s, sharing_stages):
    """Every kept partial plan × every option of the next layer that can still fit and still beat the incumbent.
    `rest_s` bounds from below what the layers outside the partial plan add to Eq. (9); `rest_stash`, `rest_carry`
    and `rest_params` what later layers of the same stage surely add to its stash, to E (each adds at least
    O_ms + (k − 1) · O_f: its forward memory can lower the excess by at most O_f) and to its parameters (0 when the
    stage may end here). `later_s` bounds the no-sync time of layers outside the partial plan that `sharing_stages`
    stages, this one included, share with it (the first stage: the layers after it, over this and the later
    stages; a middle stage: every other layer, over all P): the slowest of them takes at least the average,
    (N + later_s) / sharing_stages (0: not used). Options are visited in `option_order` (by layout) and parents in
    `parent_order` (by stash: gbmw.search.exact.frontier_order); each new plan's `key`, option · parents + parent, is its
    place in the option-major, parent-minor order."""
    points, options = stash.shape[0], o_no_sync.shape[0]
    capacity = points * options
    n_stash = np.empty(capacity)
    n_excess = np.empty(capacity)
    n_no_sync = np.empty(capacity)
    n_sync = np.empty(capacity)
    n_params = np.empty(capacity)
    n_layout = np.empty(capacity, np.int64)
    n_option = np.empty(capacity, np.int64)
    n_parent = np.empty(capacity, np.int64)
    n_key = np.empty(capacity, np.int64)
    count = 0
    for visited in range(options):
        o = option_order[visited]
        for i in range(points):
            p = parent_order[i]
            s = stash[p] + o_stash[o]
            x = excess[p] - o_forward[o]
            if x < o_backward[o]:
                x = o_backward[o]
            q = params[p] + o_params[o]
            least = max(s + x + rest_carry, s + rest_stash)
            if least + reserve_per_parameter * min(q + rest_params, chunk) > budget:
                continue
            t = no_sync[p] + o_no_sync[o] + transition[layout[p], o_layout[o]]
            y = sync[p] + o_sync[o]
            if m * t + y + step_s * (q + rest_params) + rest_s > limit_s:
                continue
            if sharing_stages > 0:
                slowest = max(t, (t + later_s) / sharing_stages)
                if (m - 1) * slowest + t + later_s + y + step_s * q > limit_s:
                    continue
            n_stash[count], n_excess[count], n_no_sync[count], n_sync[count] = s, x, t, y
            n_params[count], n_layout[count], n_option[count], n_parent[count] = q, o_layout[o], o, p
            n_key[count] = o * points + p
            count += 1
    return (n_stash[:count], n_excess[:count], n_no_sync[:count], n_sync[:count], n_params[:count],
            n_layout[:count], n_option[:count], n_parent[:count], n_key[:count])


@njit(cache=True)
def _before(first, total, key, a, b) -> bool:
    """Row a comes before row b: by first column, then total, then key (keys are distinct)."""
    if first[a] != first[b]:
        return first[a] < first[b]
    if total[a] != total[b]:
        return total[a] < total[b]
    return key[a] < key[b]


@njit(cache=True)
def _insertion_sort(rows, first, total, key):
    """Sort a few `rows` (indices) in place by `_before`."""
    for i in range(1, rows.shape[0]):
        row = rows[i]
        j = i - 1
        while j >= 0 and _before(first, total, key, row, rows[j]):
            rows[j + 1] = rows[j]
            j -= 1
        rows[j + 1] = row


@njit(cache=True)
def _merge_runs(rows, values, row_buffer, value_buffer):
    """Sort `rows` in place by `values` (aligned with them, sorted along), merging their natural ascending runs
    pairwise: a bottom-up natural merge sort, O(n log runs), stable; the buffers are scratch of the same length."""
    n = rows.shape[0]
    if n < 2:
        return
    starts = np.empty(n + 1, np.int64)
    runs = 0
    starts[0] = 0
    for i in range(1, n):
        if values[i] < values[i - 1]:
            runs += 1
            starts[runs] = i
    runs += 1
    starts[runs] = n
    source_rows, source_values, target_rows, target_values = rows, values, row_buffer, value_buffer
    passes = 0
    while runs > 1:
        merged = 0
        r = 0
        while r < runs:
            low, middle = starts[r], starts[r + 1]
            high = starts[r + 2] if r + 1 < runs else middle
            i, j, out = low, middle, low
            while i < middle and j < high:
                if source_values[j] < source_values[i]:
                    target_rows[out], target_values[out] = source_rows[j], source_values[j]
                    j += 1
                else:
                    target_rows[out], target_values[out] = source_rows[i], source_values[i]
                    i += 1
                out += 1
            while i < middle:
                target_rows[out], target_values[out] = source_rows[i], source_values[i]
                i += 1
                out += 1
            while j < high:
                target_rows[out], target_values[out] = source_rows[j], source_values[j]
                j += 1
                out += 1
            starts[merged] = low
            merged += 1
            r += 2
        starts[merged] = n
        runs = merged
        source_rows, target_rows = target_rows, source_rows
        source_values, target_values = target_values, source_values
        passes += 1
    if passes % 2 == 1:  # the sorted rows are in the buffers
        rows[:] = row_buffer
        values[:] = value_buffer


@njit(cache=True)
def merged_order(group, first, total, key):
    """The permutation that sorts rows by (group, first, total, key): what `np.lexsort((total, first, group))` gives
    for the rows listed by `key` (see the module), for rows that come by group (`extend_candidates` visits the options
    by layout). Each group's rows are merged by first column from their sorted blocks; then each run of equal first
    columns (most rows share their stash with a few others: strategies of equal memory; GPT-3 65B's runs average about
    4 rows) is ordered by (total, key), by insertion sort, or by two stable sorts where long."""
    n = group.shape[0]
    for i in range(1, n):
        if group[i] < group[i - 1]:
            raise ValueError("merged_order: rows must come by group")
    order = np.arange(n)
    values = first.copy()
    row_buffer = np.empty(n, np.int64)
    value_buffer = np.empty(n)
    low = 0
    while low < n:
        high = low + 1
        while high < n and group[high] == group[low]:
            high += 1
        _merge_runs(order[low:high], values[low:high], row_buffer[low:high], value_buffer[low:high])
        low = high
    low = 0
    while low < n:
        high = low + 1
        while high < n and values[high] == values[low] and group[order[high]] == group[order[low]]:
            high += 1
        if high - low <= SHORT_RUN:
            _insertion_sort(order[low:high], first, total, key)
        else:  # by key, then stably by total
            rows = order[low:high]
            rows[:] = rows[np.argsort(key[rows], kind="mergesort")]
            rows[:] = rows[np.argsort(total[rows], kind="mergesort")]
        low = high
    return order


def nondominated_plans(stash, excess, no_sync, sync, params, layout, key, step_s: float,
                       single_stage_m: float | None) -> np.ndarray:
    """`nondominated(plan_columns(...), layout)` of a stage DP step's new partial plans listed in the order of their
    distinct `key`s (`extend_candidates`), as indices sorted by key: the columns and their sums are written in one
    compiled pass (`_plan_rows`, the same float operations as `plan_columns`), and the filter's order is found by
    merging the options' blocks (gbmw.search.exact.frontier_order) instead of lexsort."""
    rows = stash.shape[0]
    if rows <= 1:
        return np.arange(rows)
    columns, total = _plan_rows(stash, excess, no_sync, sync, params, step_s, float(ADAM_CHUNK_ELEMENTS),
                                single_stage_m if single_stage_m is not None else -1.0)
    order = merged_order(layout, stash, total, key)
    kept = np.nonzero(_nondominated(columns, layout, order))[0]
    return kept[np.argsort(key[kept])]


@njit(cache=True)
def _plan_rows(stash, excess, no_sync, sync, params, step_s, chunk, single_stage_m):
    """`plan_columns` (single_stage_m < 0: None) and each row's sum of them, left to right as `nondominated` adds
    them."""
    rows = stash.shape[0]
    width = 4 if single_stage_m >= 0 else 7
    columns = np.empty((rows, width))
    total = np.empty(rows)
    for i in range(rows):
        optimizer = params[i] * step_s
        columns[i, 0] = stash[i]
        columns[i, 1] = stash[i] + excess[i]
        columns[i, 2] = min(params[i], chunk)
        if single_stage_m >= 0:
            columns[i, 3] = single_stage_m * no_sync[i] + sync[i] + optimizer
        else:
            columns[i, 3] = no_sync[i]
            columns[i, 4] = no_sync[i] + sync[i]
            columns[i, 5] = no_sync[i] + optimizer
            columns[i, 6] = columns[i, 4] + optimizer
        value = columns[i, 0]
        for c in range(1, width):
            value += columns[i, c]
        total[i] = value
    return columns, total
