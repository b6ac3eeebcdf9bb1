"""The order in which the exact stage DP visits its kept partial plans (Eq. (4), Algorithm 3 without a memory grid):
by stash (`stash_order`), so that each option's block of new rows comes sorted by its first column, the stash — what
lets the fused step (gbmw.search.exact.frontier_step) merge the blocks into the Pareto filter's order (group, stash,
total, key) instead of sorting all rows. Runs of equal stashes up to SHORT_RUN rows are ordered by insertion sort.
(The merged order's reference form, `merged_order`, lives with the tests: tests/frontier_step_reference.py.)"""

from __future__ import annotations

import numpy as np

SHORT_RUN = 16
"""Runs of equal first columns up to this many rows are ordered by insertion sort, longer ones by two stable sorts."""


def stash_order(stash: np.ndarray) -> np.ndarray:
    """The kept partial plans by stash (equal stashes in stored order): the order in which the stage DP's step visits
    them, so that each option's block of new rows is sorted by its first column."""
    return np.argsort(stash, kind="stable")
