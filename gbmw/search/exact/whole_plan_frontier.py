"""The exact search's frontier machinery (gbmw.search.exact.whole_plan_search): memory on an exact grid, the
non-dominated filter with the time columns Eq. (9) allows, and the partial plans (a trie node: `PartialPlans`) and
stage options the search keeps (the compiled step that extends partial plans by one layer:
gbmw.search.exact.frontier_step)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from gbmw.cost.framework_memory import ADAM_CHUNK_ELEMENTS
from gbmw.search.exact.frontier_order import stash_order
from gbmw.search.stage_dp.pareto import backtrack

# ---------------------------------------------------------------------------------------------------- memory


class MemoryGrid:
    """Memory terms on a grid of `step_bytes` (a power of two) on which every sum the search and stage_estimate
    form is exact in float64: all terms are multiples of the step and every sum stays below 2^53 steps."""

    def __init__(self, largest_sum: float):
        self.step_bytes = 2.0 ** (math.ceil(math.log2(max(largest_sum, 1.0))) - 52)
        self.rounded = False
        """Some term was not on the grid and was rounded up."""

    def up(self, values) -> np.ndarray:
        """`values` rounded up to the grid (unchanged where already on it)."""
        values = np.asarray(values, dtype=np.float64)
        on_grid = np.ceil(values / self.step_bytes) * self.step_bytes
        self.rounded = self.rounded or bool((on_grid != values).any())
        return on_grid


# ---------------------------------------------------------------------------------------------------- kernels


BLOCK_ROWS = 32
"""Kept rows per block of the non-dominated filter (`_nondominated`); BLOCKS_PER_SPAN blocks make a span."""
BLOCKS_PER_SPAN = 32


@njit(cache=True)
def _beaten(values: np.ndarray, index: int, row_values: np.ndarray, first_column: int) -> bool:
    """Row `index` of `values` is no greater than `row_values` in every column from `first_column` on."""
    for c in range(first_column, values.shape[1]):
        if values[index, c] > row_values[c]:
            return False
    return True


@njit(cache=True)
def _nondominated(columns: np.ndarray, group: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Mask of the rows no other row of the same group matches or beats (≤) in every column (of equal rows the
    first in `order` is kept); `order` sorts the rows by group, first column and the sum of their columns, so a row
    can only be matched or beaten by one before it (float addition is monotone: a row no greater in every column has no
    greater sum). A row is kept when no kept row of its group before it matches or beats it — whichever of them is
    tried first, so the kept set is fixed by the order alone — and those have no greater first column: only the
    others are compared. The search for one that beats it is fast:

    * the last row found to beat one is tried first: neighbours in the order are mostly beaten by the same row;
    * the kept rows are copied, in order, into blocks of BLOCK_ROWS, and those into spans of BLOCKS_PER_SPAN
      blocks, each block and span with its columnwise minimum: a block or span whose minimum is above the row in
      some column holds no row that beats it and is skipped whole (the newest first)."""
    rows, width = columns.shape
    span_rows = BLOCK_ROWS * BLOCKS_PER_SPAN
    keep = np.zeros(rows, np.bool_)
    kept = np.empty((rows, width))
    block_least = np.empty((rows // BLOCK_ROWS + 1, width))
    span_least = np.empty((rows // span_rows + 1, width))
    kept_count = 0
    group_start = 0
    previous_group = -1
    last = -1
    row_values = np.empty(width)
    for position in range(rows):
        row = order[position]
        for c in range(width):
            row_values[c] = columns[row, c]
        if group[row] != previous_group:
            previous_group = group[row]
            group_start = kept_count
            last = -1
        if last >= 0 and _beaten(kept, last, row_values, 1):
            continue
        dominated = False
        span = (kept_count - 1) // span_rows if kept_count > 0 else -1
        while span >= 0 and span * span_rows + span_rows > group_start and not dominated:
            if _beaten(span_least, span, row_values, 1):
                block = min((kept_count - 1) // BLOCK_ROWS, (span + 1) * BLOCKS_PER_SPAN - 1)
                while (block >= span * BLOCKS_PER_SPAN and block * BLOCK_ROWS + BLOCK_ROWS > group_start
                       and not dominated):
                    if _beaten(block_least, block, row_values, 1):
                        for k in range(min(block * BLOCK_ROWS + BLOCK_ROWS, kept_count) - 1,
                                       max(block * BLOCK_ROWS, group_start) - 1, -1):
                            if _beaten(kept, k, row_values, 1):
                                dominated = True
                                last = k
                                break
                    block -= 1
            span -= 1
        if not dominated:
            keep[row] = True
            block, span = kept_count // BLOCK_ROWS, kept_count // span_rows
            for c in range(width):
                kept[kept_count, c] = row_values[c]
                if kept_count % BLOCK_ROWS == 0 or row_values[c] < block_least[block, c]:
                    block_least[block, c] = row_values[c]
                if kept_count % span_rows == 0 or row_values[c] < span_least[span, c]:
                    span_least[span, c] = row_values[c]
            kept_count += 1
    return keep


def nondominated(columns: np.ndarray, group: np.ndarray | None = None) -> np.ndarray:
    """Indices of the rows of `columns` ([rows, values]) that no other row (of the same `group`) matches or beats
    in every value; of equal rows one is kept."""
    rows = columns.shape[0]
    if rows <= 1:
        return np.arange(rows)
    group = np.zeros(rows, np.int64) if group is None else group.astype(np.int64)
    total = columns[:, 0].copy()
    for c in range(1, columns.shape[1]):
        total += columns[:, c]
    order = np.lexsort((total, columns[:, 0], group))
    return np.nonzero(_nondominated(np.ascontiguousarray(columns), group, order))[0]


def time_columns(no_sync: np.ndarray, sync: np.ndarray, optimizer: np.ndarray) -> np.ndarray:
    """Columns under which a stage (or a partial partition) that no other matches or beats is kept, given its N
    (or Σ N), S (or max S) and U (or max U): (N, N + S, N + U, N + S + U).

    Completing two alternatives A and B the same way (the same later layers and stages, so the same additions to
    N and S, and the same other stages: a = their max N, c their max S, d their max U), Eq. (9) gives
        T_A − T_B = (m − 1)·(max(N_A, a) − max(N_B, a)) + (N_A − N_B) + (max(S_A, c) − max(S_B, c))
                    + (max(U_A, d) − max(U_B, d))
                  ≤ (N_A − N_B) + max(0, S_A − S_B) + max(0, U_A − U_B)      when N_A ≤ N_B,
    as max is monotone and 1-Lipschitz: so A is never slower when it is no worse in all four columns. That keeps
    fewer alternatives than (N, S, U), where A must also have no more S and U."""
    return _filled(np.empty((no_sync.shape[0], 4)), 0, no_sync, sync, optimizer)


def _filled(columns: np.ndarray, first: int, no_sync: np.ndarray, sync: np.ndarray, optimizer: np.ndarray
            ) -> np.ndarray:
    """`columns` with `time_columns` written into its columns from `first` on."""
    columns[:, first] = no_sync
    np.add(no_sync, sync, out=columns[:, first + 1])
    np.add(no_sync, optimizer, out=columns[:, first + 2])
    np.add(columns[:, first + 1], optimizer, out=columns[:, first + 3])
    return columns


def option_columns(no_sync, sync, stash, forward, backward, params, step_s: float) -> np.ndarray:
    """Columns under which one option of a layer that no other of its layout matches or beats is kept.

    Appended to a partial plan (s, x, N, S, p) — stash, backward excess, no-sync time, synchronisation extra,
    parameters — an option gives s + stash, x' = max(x − forward, backward), N + no_sync, S + sync, p + params,
    and the stage DP keeps the partial plans no other matches or beats in `plan_columns`. Option A leaves a
    partial plan no worse than option B does, whatever the plan, when it is no worse in

        stash, stash + backward, stash − forward, min(params, chunk), and `time_columns` of (no_sync, sync, params · step)

    as s + x' = s + max(x + stash − forward, stash + backward) grows with both terms (x ≥ 0), and min(p + params,
    chunk) with min(params, chunk). This keeps fewer options than comparing each term on its own: ZeRO-2's larger
    backward buffer, for one, no longer keeps plain data parallelism whose stash is larger by more."""
    columns = np.empty((stash.shape[0], 8))
    columns[:, 0] = stash
    np.add(stash, backward, out=columns[:, 1])
    np.subtract(stash, forward, out=columns[:, 2])
    np.minimum(params, float(ADAM_CHUNK_ELEMENTS), out=columns[:, 3])
    return _filled(columns, 4, no_sync, sync, params * step_s)


def plan_columns(stash, excess, no_sync, sync, params, step_s: float, single_stage_m: float | None) -> np.ndarray:
    """Columns under which a partial plan of a stage that no other (of its last layout) matches or beats is kept:
    the stash, the peak so far (stash + excess: later layers' peaks grow with it, at most one for one), the
    optimizer step's reserve parameters min(p, chunk) (gbmw.cost.framework_memory), and the times — one stage alone
    (`single_stage_m` = m): m · N + S + U, its Eq. (9) time; else `time_columns` of (N, S, U), U = p · step time.
    Completing two partial plans the same way adds the same N, S and p to both, so the argument of `time_columns`
    holds for the stage they complete; p is compared only through U and the reserve, so a plan whose few more
    replicated parameters (a norm, a bias) cost less step time than its lower N saves is not kept beside it."""
    columns = np.empty((stash.shape[0], 4 if single_stage_m is not None else 7))
    columns[:, 0] = stash
    np.add(stash, excess, out=columns[:, 1])
    np.minimum(params, float(ADAM_CHUNK_ELEMENTS), out=columns[:, 2])
    optimizer = params * step_s
    if single_stage_m is not None:
        columns[:, 3] = single_stage_m * no_sync + sync + optimizer
        return columns
    return _filled(columns, 3, no_sync, sync, optimizer)


class PartialPlans:
    """Partial plans after some layers of a stage: per plan its terms, layout, last strategy and parent."""

    __slots__ = ("stash", "excess", "no_sync", "sync", "params", "layout", "strategy", "parent", "previous", "depth",
                 "_by_stash")

    def __init__(self, stash, excess, no_sync, sync, params, layout, strategy, parent, previous, depth):
        self.stash, self.excess, self.no_sync, self.sync, self.params = stash, excess, no_sync, sync, params
        self.layout, self.strategy, self.parent, self.previous, self.depth = layout, strategy, parent, previous, depth
        self._by_stash = None

    def by_stash(self) -> np.ndarray:
        """The plans' indices by stash (gbmw.search.exact.frontier_order.stash_order), computed once."""
        if self._by_stash is None:
            self._by_stash = stash_order(self.stash)
        return self._by_stash

    @classmethod
    def root(cls) -> "PartialPlans":
        zero = np.zeros(1)
        return cls(zero, zero.copy(), zero.copy(), zero.copy(), zero.copy(), np.zeros(1, np.int64),
                   np.full(1, -1), np.full(1, -1), None, 0)

    def __len__(self) -> int:
        return self.stash.shape[0]

    def backtrack(self, index: int) -> list[int]:
        return backtrack(self, index)


@dataclass
class StageOptions:
    """The fitting options of one stage position no other matches or beats in N, S and U (`time_columns`)."""

    no_sync_s: np.ndarray
    sync_s: np.ndarray
    optimizer_s: np.ndarray
    node: PartialPlans
    index: np.ndarray
    """Plan index in `node` (its strategies by backtracking)."""

    def __len__(self) -> int:
        return self.no_sync_s.shape[0]

    def strategies(self, option: int) -> list[int]:
        return self.node.backtrack(int(self.index[option]))
