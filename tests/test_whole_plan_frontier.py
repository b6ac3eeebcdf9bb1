"""gbmw.search.exact.whole_plan_frontier.nondominated against the definition, row by row: a row is kept when no row of
its group matches or beats it in every column, and of equal rows exactly one is kept."""

import numpy as np
import pytest

from gbmw.search.exact.whole_plan_frontier import BLOCK_ROWS, BLOCKS_PER_SPAN, nondominated

pytestmark = pytest.mark.unit


def _by_definition(columns: np.ndarray, group: np.ndarray) -> set[int]:
    """Rows no other row of the group matches or beats; of equal rows, the one with the lowest index (the first in
    `nondominated`'s stable sort)."""
    kept = set()
    for row in range(columns.shape[0]):
        same = group == group[row]
        no_worse = same & (columns <= columns[row]).all(axis=1)
        strictly = no_worse & (columns < columns[row]).any(axis=1)
        equal_before = no_worse & ~strictly & (np.arange(columns.shape[0]) < row)
        if not strictly.any() and not equal_before.any():
            kept.add(row)
    return kept


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("rows, width, levels, groups", [(3 * BLOCK_ROWS + 5, 7, 6, 3), (1000, 4, 40, 1),
                                                         (600, 7, 1000, 5), (2, 3, 2, 1)])
def test_nondominated_keeps_exactly_the_pareto_rows(seed, rows, width, levels, groups):
    generator = np.random.default_rng(seed)
    # correlated columns, like stash and peak or N and N + S: long fronts with many kept rows, and ties
    base = generator.integers(0, levels, size=(rows, 1))
    columns = (base + generator.integers(0, levels, size=(rows, width))).astype(float)
    group = generator.integers(0, groups, size=rows)
    assert nondominated(columns, group).tolist() == sorted(_by_definition(columns, group))


def test_nondominated_keeps_a_front_longer_than_a_span():
    """Rows on a front (the first two columns trade against each other) are mostly kept: more kept rows than one
    span of blocks holds, so that whole blocks and spans are skipped and searched."""
    generator = np.random.default_rng(0)
    rows = 3 * BLOCK_ROWS * BLOCKS_PER_SPAN
    first = generator.integers(0, 10 * rows, size=rows)
    columns = np.stack([first, 10 * rows - first + generator.integers(0, 50, size=rows),
                        generator.integers(0, 4, size=rows)], axis=1).astype(float)
    group = generator.integers(0, 2, size=rows)
    kept = nondominated(columns, group).tolist()
    assert len(kept) > BLOCK_ROWS * BLOCKS_PER_SPAN
    assert kept == sorted(_by_definition(columns, group))
