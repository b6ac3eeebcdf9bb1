"""The reference form of the stage DP step's order and filter (tests/frontier_step_reference.py: `merged_order`,
`nondominated_plans`): the merged order is lexsort's, row for row, and the filter keeps what `nondominated` of
`plan_columns` keeps, whatever order the rows come in."""

import numpy as np
import pytest
from frontier_step_reference import _plan_rows, merged_order, nondominated_plans

from gbmw.cost.framework_memory import ADAM_CHUNK_ELEMENTS
from gbmw.search.exact.frontier_order import SHORT_RUN
from gbmw.search.exact.whole_plan_frontier import nondominated, plan_columns

pytestmark = pytest.mark.unit


def _lexsort_of_rows_by_key(group, first, total, key):
    by_key = np.argsort(key)
    return by_key[np.lexsort((total[by_key], first[by_key], group[by_key]))]


@pytest.mark.parametrize("seed", range(40))
def test_merged_order_is_lexsorts(seed):
    generator = np.random.default_rng(seed)
    rows = int(generator.integers(0, 2000))
    group = np.sort(generator.integers(0, generator.integers(1, 8), rows))
    # few levels: long runs of equal first columns (beyond SHORT_RUN) and of equal totals
    first = generator.integers(0, generator.integers(1, 60), rows).astype(float)
    total = generator.integers(0, generator.integers(1, 5), rows).astype(float)
    if seed % 2:  # blocks sorted by the first column, as a stage DP step makes them
        for start in range(0, rows, 97):
            first[start:start + 97] = np.sort(first[start:start + 97])
    key = generator.permutation(rows).astype(np.int64)
    assert np.array_equal(merged_order(group, first, total, key), _lexsort_of_rows_by_key(group, first, total, key))


def test_merged_order_sorts_long_runs_of_equal_first_columns():
    rows = 10 * SHORT_RUN
    first, total = np.zeros(rows), np.tile([2.0, 1.0], rows // 2)
    key = np.arange(rows)[::-1].copy()
    group = np.zeros(rows, np.int64)
    assert np.array_equal(merged_order(group, first, total, key), _lexsort_of_rows_by_key(group, first, total, key))


def test_merged_order_wants_rows_by_group():
    with pytest.raises(ValueError):
        merged_order(np.array([1, 0]), np.zeros(2), np.zeros(2), np.arange(2))


@pytest.mark.parametrize("single_stage_m", [None, 3.0])
def test_plan_rows_are_plan_columns(single_stage_m):
    generator = np.random.default_rng(1)
    stash, excess, no_sync, sync = (generator.random(500) * scale for scale in (1e9, 1e8, 1.0, 0.1))
    params = generator.integers(0, 2**24, 500).astype(float)
    columns = plan_columns(stash, excess, no_sync, sync, params, 1e-9, single_stage_m)
    rows, total = _plan_rows(stash, excess, no_sync, sync, params, 1e-9, float(ADAM_CHUNK_ELEMENTS),
                             -1.0 if single_stage_m is None else single_stage_m)
    assert np.array_equal(rows, columns)
    expected = columns[:, 0].copy()
    for c in range(1, columns.shape[1]):  # left to right, as nondominated adds them
        expected += columns[:, c]
    assert np.array_equal(total, expected)


@pytest.mark.parametrize("seed", range(12))
def test_nondominated_plans_keeps_what_nondominated_keeps(seed):
    """Rows as a DP step makes them: by layout, each option's block by stash, listed by key; ties included."""
    generator = np.random.default_rng(seed)
    rows = 1500
    layout = np.sort(generator.integers(0, 4, rows))
    stash = generator.integers(0, 30, rows).astype(float) * 2.0**20
    for start in range(0, rows, 50):
        stash[start:start + 50] = np.sort(stash[start:start + 50])
    excess = generator.integers(0, 6, rows) * 2.0**20
    no_sync, sync = generator.integers(0, 8, rows) * 0.5, generator.integers(0, 3, rows) * 0.25
    params = generator.integers(0, 4, rows) * 2.0**22
    key = generator.permutation(rows).astype(np.int64)
    kept = nondominated_plans(stash, excess, no_sync, sync, params, layout, key, 2.0**-30, None)
    by_key = np.argsort(key)
    columns = plan_columns(stash, excess, no_sync, sync, params, 2.0**-30, None)
    assert np.array_equal(kept, by_key[nondominated(columns[by_key], layout[by_key])])
