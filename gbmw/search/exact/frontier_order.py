"""The order in which the exact search's Pareto filter (gbmw.search.exact.whole_plan_frontier.nondominated) visits the
new partial plans of a stage DP step (Eq. (4), Algorithm 3 without a memory grid), found by merging sorted runs instead
of sorting from scratch.

The filter visits rows by (group, first column, sum of the columns), equal rows in the order they were made — the
order `np.lexsort((total, first, group))` gives rows listed in that order. One step of the stage DP
(`extend_candidates`) makes a partial plan of each kept one and each option of the next layer; its first column is the
stash, the parent's plus the option's (exact: both on the search's memory grid). Visiting the options by layout (the
filter's group) and the parents by their stash (`stash_order`) makes the rows come by group, each option's block
already sorted by the first column: a natural merge of those few runs per group, then a short sort of each run of
equal stashes by (total, key), replaces lexsort's three stable sorts of all rows, the dearest part of the exact search
before (GPT-3 65B on 64 H100s: ~6.7M rows, 1.2 s of its 6.4 s). `key` is a row's place in the order the DP made them
before (option-major, parents in their stored order), so the order is exactly lexsort's on those rows: the same rows
are kept, the same of equal ones, and each node of the trie holds the same rows in the same order as before.
"""

from __future__ import annotations

import numpy as np
from numba import njit


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


SHORT_RUN = 16
"""Runs of equal first columns up to this many rows are ordered by insertion sort, longer ones by two stable sorts."""


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


def stash_order(stash: np.ndarray) -> np.ndarray:
    """The kept partial plans by stash (equal stashes in stored order): the order in which `extend_candidates` visits
    them, so that each option's block of new rows is sorted by its first column."""
    return np.argsort(stash, kind="stable")
