"""The exact stage DP's dominance rules (gbmw.search.exact.whole_plan_frontier `option_columns`, `plan_columns`):
an option or partial plan dropped because another matches or beats it in those columns must never be the better
one once both are completed the same way.

Checked directly, beside the brute force of tests/test_search_exact.py: random partial plans (stash s, backward
excess x ≥ 0, times N and S, parameters p) are extended by the same random later layers, each adding its stash,
forward and backward memory, times and parameters as `extend_candidates` does, and the finished stage's peak
(s + x), step reserve (bytes × min(p, chunk)) and Eq. (9) time against fixed other stages are compared. Values
are small integers, so every sum is exact and the comparisons test the rules, not rounding.
"""

import numpy as np
import pytest

from gbmw.cost.framework_memory import ADAM_CHUNK_ELEMENTS
from gbmw.search.exact.whole_plan_frontier import option_columns, plan_columns

pytestmark = pytest.mark.unit

CHUNK = float(ADAM_CHUNK_ELEMENTS)


def _no_worse(a: np.ndarray, b: np.ndarray) -> bool:
    return bool((a <= b).all())


def _append(plan, option):
    """`extend_candidates`' arithmetic: (s, x, N, S, p) + one layer's (stash, forward, backward, N, S, p)."""
    s, x, n, y, p = plan
    stash, forward, backward, no_sync, sync, params = option
    return s + stash, max(x - forward, backward), n + no_sync, y + sync, p + params


def _finished(plan, later, others, m, step_s):
    """(peak, reserve parameters, T) of the stage after `later` layers, with the other stages' max N, Σ N, max S,
    max U fixed: Eq. (9) T = (m − 1)·max N + Σ N + max S + max U."""
    for option in later:
        plan = _append(plan, option)
    s, x, n, y, p = plan
    max_n, sum_n, max_s, max_u = others
    time = (m - 1) * max(n, max_n) + n + sum_n + max(y, max_s) + max(p * step_s, max_u)
    return s + x, min(p, CHUNK), time


def _random_option(rng):
    params = float(rng.choice([rng.integers(0, 8), ADAM_CHUNK_ELEMENTS + rng.integers(0, 8)]))
    return (float(rng.integers(0, 8)), float(rng.integers(0, 4)), float(rng.integers(0, 8)),
            float(rng.integers(0, 8)), float(rng.integers(0, 4)), params)


def _random_plan(rng):
    return (float(rng.integers(0, 16)), float(rng.integers(0, 8)), float(rng.integers(0, 16)),
            float(rng.integers(0, 8)), float(rng.choice([rng.integers(0, 16), ADAM_CHUNK_ELEMENTS])))


def _plan_columns(plan, step_s):
    """`plan_columns` of one partial plan (s, x, N, S, p) of a stage among several."""
    return plan_columns(*(np.array([value]) for value in plan), step_s, None)[0]


def _columns_of(a, b, step_s):
    """`option_columns` of options a and b, given as (stash, forward, backward, no-sync, sync, parameters)."""
    stash, forward, backward, no_sync, sync, params = (np.array(pair) for pair in zip(a, b))
    return option_columns(no_sync, sync, stash, forward, backward, params, step_s)


def test_a_dominated_option_never_completes_better():
    rng = np.random.default_rng(7)
    step_s, compared = 0.5, 0
    for _ in range(20000):
        a, b = _random_option(rng), _random_option(rng)
        columns = _columns_of(a, b, step_s)
        if not _no_worse(columns[0], columns[1]):
            continue
        compared += 1
        plan, later = _random_plan(rng), [_random_option(rng) for _ in range(rng.integers(0, 3))]
        others = (float(rng.integers(0, 16)), float(rng.integers(0, 32)), float(rng.integers(0, 8)),
                  float(rng.integers(0, 8)))
        m = int(rng.integers(1, 6))
        peak_a, reserve_a, time_a = _finished(_append(plan, a), later, others, m, step_s)
        peak_b, reserve_b, time_b = _finished(_append(plan, b), later, others, m, step_s)
        assert peak_a <= peak_b and reserve_a <= reserve_b and time_a <= time_b, (a, b, plan, later, others, m)
    assert compared > 1000  # the rule was exercised


def test_a_dominated_partial_plan_never_completes_better():
    rng = np.random.default_rng(11)
    step_s, compared = 0.25, 0
    for _ in range(20000):
        a, b = _random_plan(rng), _random_plan(rng)
        if not _no_worse(_plan_columns(a, step_s), _plan_columns(b, step_s)):
            continue
        compared += 1
        later = [_random_option(rng) for _ in range(rng.integers(0, 4))]
        others = (float(rng.integers(0, 16)), float(rng.integers(0, 32)), float(rng.integers(0, 8)),
                  float(rng.integers(0, 8)))
        m = int(rng.integers(1, 6))
        peak_a, reserve_a, time_a = _finished(a, later, others, m, step_s)
        peak_b, reserve_b, time_b = _finished(b, later, others, m, step_s)
        assert peak_a <= peak_b and reserve_a <= reserve_b and time_a <= time_b, (a, b, later, others, m)
    assert compared > 1000


def test_the_old_componentwise_rule_would_keep_what_the_new_one_drops():
    """Plain DP (small backward buffer, large stash) beside ZeRO-2 (larger backward buffer, stash smaller by more,
    faster): compared term by term neither wins; after any partial plan ZeRO-2 is no worse, and the rule says so."""
    dp = (33.5, 2.7, 1.0, 35.4, 3.6, 805.0)  # stash, forward, backward, no-sync, sync, parameters
    z2 = (26.0, 2.7, 4.0, 34.2, 1.8, 100.0)
    columns = _columns_of(z2, dp, 0.01)
    assert _no_worse(columns[0], columns[1])
    assert not z2[2] <= dp[2]  # the backward buffer alone would have kept plain DP
