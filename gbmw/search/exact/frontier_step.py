"""One step of the exact stage DP (gbmw.search.exact.whole_plan_search) in one compiled pass: every kept partial plan ×
every option of the next layer, pruned as `extend_candidates` prunes, and filtered as `nondominated_plans` filters —
the same rows kept, the same of equal ones — without writing the rows the filter drops.

The two-pass form this replaced is the tests' reference (tests/frontier_step_reference.py): there
`extend_candidates` writes every new partial plan (GPT-3 65B on 64 H100s: ~8.5M in a batch sweep), `_plan_rows` their
filter columns, `merged_order` their order and `_nondominated` keeps ~6 % of them. The filter visits each layout's
rows by (stash, total of the columns, key) and keeps a row when no kept row of its layout before it matches or beats
it, so what it keeps is fixed by that order alone (gbmw.search.exact.whole_plan_frontier `_nondominated`). Here the
rows of one layout are made in that very order: the options of the layout are a handful of blocks, each sorted by
stash (the parents are visited by stash and an option adds one stash to all of them); a merge of the blocks' heads
gives, stash by stash, the run of rows with that stash, which is sorted by (total, key) as `merged_order` sorts it,
then filtered row by row with the same float operations (`_plan_rows`) and the same comparisons. (A row that a kept
row of an earlier stash matches or beats is dropped before its run is sorted: that row comes before it in any order,
so the filter drops it wherever it lies in its run, and a dropped row never decides another's fate.) So the kept rows,
their values and their keys are exactly those of `nondominated_plans(*extend_candidates(...))`
(tests/test_frontier_step.py checks it on random steps, ties included); the caller sorts them by key as before.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from gbmw.search.exact.frontier_order import SHORT_RUN
from gbmw.search.exact.whole_plan_frontier import BLOCK_ROWS, BLOCKS_PER_SPAN, _beaten


@njit(cache=True)
def _fill_block(block, o, stash, excess, no_sync, sync, params, layout, o_no_sync, o_sync, o_stash, o_forward,
                o_backward, o_params, o_layout, transition, budget, reserve_per_parameter, chunk, m, step_s, rest_s,
                limit_s, rest_stash, rest_carry, rest_params, later_s, sharing_stages, values, positions):
    """Row `block` of `values` ([block, plan, (s, x, t, y, q)]) and `positions`: the parents (given in stash order)
    that pass `extend_candidates`' memory and incumbent tests with option `o` (the same float operations), each
    with its new terms; returns their count."""
    count = 0
    for i in range(stash.shape[0]):
        s = stash[i] + o_stash[o]
        x = excess[i] - o_forward[o]
        if x < o_backward[o]:
            x = o_backward[o]
        q = params[i] + o_params[o]
        least = max(s + x + rest_carry, s + rest_stash)
        if least + reserve_per_parameter * min(q + rest_params, chunk) > budget:
            continue
        t = no_sync[i] + o_no_sync[o] + transition[layout[i], o_layout[o]]
        y = sync[i] + o_sync[o]
        if m * t + y + step_s * (q + rest_params) + rest_s > limit_s:
            continue
        if sharing_stages > 0:
            slowest = max(t, (t + later_s) / sharing_stages)
            if (m - 1) * slowest + t + later_s + y + step_s * q > limit_s:
                continue
        values[block, count, 0], values[block, count, 1], values[block, count, 2] = s, x, t
        values[block, count, 3], values[block, count, 4] = y, q
        positions[block, count] = i
        count += 1
    return count


@njit(cache=True)
def _write_columns(columns, row, s, x, t, y, q, step_s, chunk, single_stage_m, width):
    """`_plan_rows`' columns of one plan into `columns[row]`, and their sum left to right."""
    optimizer = q * step_s
    columns[row, 0] = s
    columns[row, 1] = s + x
    columns[row, 2] = min(q, chunk)
    if single_stage_m >= 0:
        columns[row, 3] = single_stage_m * t + y + optimizer
    else:
        columns[row, 3] = t
        columns[row, 4] = t + y
        columns[row, 5] = t + optimizer
        columns[row, 6] = columns[row, 4] + optimizer
    value = columns[row, 0]
    for c in range(1, width):
        value += columns[row, c]
    return value


@njit(cache=True)
def _beaten_row(kept, index, columns, row, width):
    """Kept row `index` is no greater than `columns[row]` in every column but the first (`_beaten`)."""
    for c in range(1, width):
        if kept[index, c] > columns[row, c]:
            return False
    return True


@njit(cache=True)
def _order_run(order, total, key, count):
    """`order[:count]` sorted by (total, key), keys distinct: insertion sort where short, as `merged_order`."""
    if count <= SHORT_RUN:
        for i in range(1, count):
            r = order[i]
            j = i - 1
            while j >= 0 and (total[r] < total[order[j]] or (total[r] == total[order[j]] and key[r] < key[order[j]])):
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = r
        return
    rows = order[:count]
    rows[:] = rows[np.argsort(key[rows])]
    rows[:] = rows[np.argsort(total[rows], kind="mergesort")]


@njit(cache=True)
def extend_and_filter(stash, excess, no_sync, sync, params, layout, parent_order, option_order,
                      o_no_sync, o_sync, o_stash, o_forward, o_backward, o_params, o_layout,
                      transition, budget, reserve_per_parameter, chunk, m, step_s, rest_s, limit_s,
                      rest_stash, rest_carry, rest_params, later_s, sharing_stages, single_stage_m):
    """The rows `nondominated_plans` keeps of `extend_candidates`' rows for these arguments (the same ones; see the
    module), in the filter's order: (stash, excess, no_sync, sync, params, layout, option, parent, key).
    `single_stage_m` < 0 stands for None."""
    points, options = stash.shape[0], o_no_sync.shape[0]
    width = 4 if single_stage_m >= 0 else 7
    largest, start = 1, 0
    while start < options:  # the most options one layout has
        end = start + 1
        while end < options and o_layout[option_order[end]] == o_layout[option_order[start]]:
            end += 1
        largest = max(largest, end - start)
        start = end
    group_rows = points * largest
    span_rows = BLOCK_ROWS * BLOCKS_PER_SPAN
    kept = np.empty((group_rows, width))
    block_least = np.empty((group_rows // BLOCK_ROWS + 1, width))
    span_least = np.empty((group_rows // span_rows + 1, width))
    # the parents in stash order, contiguous; each option's new rows (a block) compacted, in that order
    by_stash = (stash[parent_order], excess[parent_order], no_sync[parent_order], sync[parent_order],
                params[parent_order], layout[parent_order])
    block_values = np.empty((largest, points, 5))  # s, x, t, y, q
    block_positions = np.empty((largest, points), np.int64)
    block_rows = np.empty(largest, np.int64)
    heads = np.empty(largest, np.int64)
    run_values = np.empty((group_rows, 5))  # s, x, t, y, q of the rows of one stash
    run_columns = np.empty((group_rows, width))
    run_total = np.empty(group_rows)
    run_key = np.empty(group_rows, np.int64)
    run_option = np.empty(group_rows, np.int64)
    run_parent = np.empty(group_rows, np.int64)
    run_order = np.empty(group_rows, np.int64)
    row_values = np.empty(width)
    capacity = points * options
    n_stash, n_excess, n_no_sync = np.empty(capacity), np.empty(capacity), np.empty(capacity)
    n_sync, n_params = np.empty(capacity), np.empty(capacity)
    n_layout, n_option = np.empty(capacity, np.int64), np.empty(capacity, np.int64)
    n_parent, n_key = np.empty(capacity, np.int64), np.empty(capacity, np.int64)
    count = 0
    start = 0
    while start < options:
        end = start + 1
        while end < options and o_layout[option_order[end]] == o_layout[option_order[start]]:
            end += 1
        blocks = end - start
        for b in range(blocks):
            block_rows[b] = _fill_block(b, option_order[start + b], *by_stash, o_no_sync, o_sync, o_stash, o_forward,
                                        o_backward, o_params, o_layout, transition, budget, reserve_per_parameter,
                                        chunk, m, step_s, rest_s, limit_s, rest_stash, rest_carry, rest_params,
                                        later_s, sharing_stages, block_values, block_positions)
            heads[b] = 0
        kept_count = 0
        last = -1
        while True:
            least_stash, found = 0.0, False
            for b in range(blocks):
                if heads[b] < block_rows[b] and (not found or block_values[b, heads[b], 0] < least_stash):
                    least_stash, found = block_values[b, heads[b], 0], True
            if not found:
                break
            run = 0
            for b in range(blocks):  # every row of that stash, block by block
                o = option_order[start + b]
                h = heads[b]
                while h < block_rows[b] and block_values[b, h, 0] == least_stash:
                    s, x, t = least_stash, block_values[b, h, 1], block_values[b, h, 2]
                    y, q = block_values[b, h, 3], block_values[b, h, 4]
                    total = _write_columns(run_columns, run, s, x, t, y, q, step_s, chunk, single_stage_m, width)
                    # a row a kept row of an earlier stash beats is dropped whatever the order within the run:
                    # try the last row found to beat one before sorting (most rows: the filter keeps ~6 %)
                    if last < 0 or not _beaten_row(kept, last, run_columns, run, width):
                        p = parent_order[block_positions[b, h]]
                        run_values[run, 0], run_values[run, 1], run_values[run, 2] = s, x, t
                        run_values[run, 3], run_values[run, 4] = y, q
                        run_total[run] = total
                        run_key[run], run_option[run], run_parent[run], run_order[run] = o * points + p, o, p, run
                        run += 1
                    h += 1
                heads[b] = h
            _order_run(run_order, run_total, run_key, run)
            for position in range(run):  # `_nondominated`'s test, the layout's kept rows from 0
                r = run_order[position]
                for c in range(width):
                    row_values[c] = run_columns[r, c]
                if last >= 0 and _beaten(kept, last, row_values, 1):
                    continue
                dominated = False
                span = (kept_count - 1) // span_rows if kept_count > 0 else -1
                while span >= 0 and not dominated:
                    if _beaten(span_least, span, row_values, 1):
                        block = min((kept_count - 1) // BLOCK_ROWS, (span + 1) * BLOCKS_PER_SPAN - 1)
                        while block >= span * BLOCKS_PER_SPAN and not dominated:
                            if _beaten(block_least, block, row_values, 1):
                                for k in range(min(block * BLOCK_ROWS + BLOCK_ROWS, kept_count) - 1,
                                               block * BLOCK_ROWS - 1, -1):
                                    if _beaten(kept, k, row_values, 1):
                                        dominated = True
                                        last = k
                                        break
                            block -= 1
                    span -= 1
                if dominated:
                    continue
                block, span = kept_count // BLOCK_ROWS, kept_count // span_rows
                for c in range(width):
                    kept[kept_count, c] = row_values[c]
                    if kept_count % BLOCK_ROWS == 0 or row_values[c] < block_least[block, c]:
                        block_least[block, c] = row_values[c]
                    if kept_count % span_rows == 0 or row_values[c] < span_least[span, c]:
                        span_least[span, c] = row_values[c]
                kept_count += 1
                n_stash[count], n_excess[count] = run_values[r, 0], run_values[r, 1]
                n_no_sync[count], n_sync[count], n_params[count] = run_values[r, 2], run_values[r, 3], run_values[r, 4]
                n_layout[count], n_option[count] = o_layout[run_option[r]], run_option[r]
                n_parent[count], n_key[count] = run_parent[r], run_key[r]
                count += 1
        start = end
    return (n_stash[:count], n_excess[:count], n_no_sync[:count], n_sync[:count], n_params[:count],
            n_layout[:count], n_option[:count], n_parent[:count], n_key[:count])
