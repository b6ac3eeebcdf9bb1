"""A memory-aware lower bound of Eq. (9) for the partial plans of a stage that may still end at any of several
layers: the exact search (gbmw.whole_plan_search) prunes the first stage's partial plans by it.

gbmw.stage_suffix_bound bounds what the layers after a partial plan add when the stage must hold all of them (the
last stage). A stage that ends at some layer e of a range holds only layers [l, e) more, and e is not known yet.

**One end.** A partial plan of stage j on layers [first, l) has no-sync time N so far, stash s and parameters q
(gbmw.whole_plan_search's terms). A completion on layers [l, e) under strategies s_i fits the budget E only if the
stage's peak, at least its whole stash plus the optimizer step's reserve (gbmw.framework_memory: 4 bytes ×
min(parameters, one chunk), never falling as parameters are added), is at most E, so

    Σ_{i∈[l,e)} mem(s_i, i) ≤ F = E − s − reserve(q),       mem = O_ms' + k_j · O_f

(O_ms' of gbmw.bounds.least_state_bytes: a tied weight counted at most once; the received and side inputs and the
backward excess only add). For every λ ≥ 0 (weak duality, as in gbmw.stage_knapsack_bound) the stage's no-sync time
is then at least

    N_j(e) ≥ N + max(Σ_{i∈[l,e)} min_s c(s, i),  max_λ Σ_{i∈[l,e)} min_s [c(s, i) + λ · mem(s, i)] − λ · F)

(c: the no-sync time; the transitions R of Eq. (4) and the send to the next stage are ≥ 0). The sums are
differences of the suffix sums gbmw.stage_suffix_bound keeps per λ.

**Any end.** With the later stages on layers [e, L) their max and Σ of N are at least `after_max`[e] and
`after_sum`[e] (gbmw.stage_knapsack_bound's partition tables, which need no knowledge of this stage), so for the
first stage (no stage before it)

    T ≥ min_e (m − 1) · max(N_0(e), after_max[e]) + N_0(e) + after_sum[e] + S + U

with S and U the partial plan's synchronisation and step times so far (both only grow). A partial plan whose bound
exceeds the incumbent's time is pruned; the kernel stops at the first end whose bound does not.

**Rounding.** Each segment sum is a difference of two suffix sums of at most L terms; the same error bound as
gbmw.stage_suffix_bound, (4 L + 16) ulps of the magnitudes (|suffix| from l on, which covers the suffix from e on,
and |λ · F|), is subtracted, so a bound is never above the exact value. The search's memory terms are rounded up to
its grid, so F computed from them is at most the exact memory left: the bound is only lower. The comparison with the
incumbent keeps the search's relative slack (gbmw.whole_plan_search.INCUMBENT_SLACK) for the times' own roundings.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from gbmw.stage_suffix_bound import SuffixTimeBound

_EPSILON = float(np.finfo(np.float64).eps)


@njit(cache=True)
def _may_beat(no_sync, extra_s, free, suffix_s, suffix_abs, lambdas, start, ends, least_segment_s, after_max,
              after_sum, m, limit_s, error_ulps):
    """Per partial plan: whether the bound of some end in `ends` is at most `limit_s` (see the module)."""
    plans, points = no_sync.shape[0], lambdas.shape[0]
    keep = np.zeros(plans, np.bool_)
    for p in range(plans):
        for k in range(ends.shape[0]):
            if not np.isfinite(after_max[k]):
                continue
            e = ends[k]
            segment = least_segment_s[k]
            if e > start:
                for j in range(points):
                    penalty = lambdas[j] * free[p]
                    value = (suffix_s[j, start] - suffix_s[j, e] - penalty
                             - error_ulps * _EPSILON * (suffix_abs[j, start] + abs(penalty)))
                    if value > segment:
                        segment = value
            stage = no_sync[p] + segment
            slowest = max(stage, after_max[k])
            if (m - 1.0) * slowest + stage + after_sum[k] + extra_s[p] <= limit_s:
                keep[p] = True
                break
    return keep


class SegmentTimeBound:
    """The bound of the module for a stage keeping `in_flight` micro-batches, among the strategies `allowed` per
    layer."""

    def __init__(self, costs, allowed: np.ndarray, in_flight: float):
        self.suffix = SuffixTimeBound(costs, allowed, in_flight)
        least = np.where(allowed, costs.tables.time_no_grad_sync_s, np.inf).min(axis=0)
        self.least_prefix_s = np.concatenate(([0.0], np.cumsum(least)))

    def may_beat(self, start: int, ends: np.ndarray, no_sync_s: np.ndarray, extra_s: np.ndarray,
                 free_bytes: np.ndarray, after_max_s: np.ndarray, after_sum_s: np.ndarray, micro_batches: float,
                 limit_s: float) -> np.ndarray:
        """Mask of the partial plans (on layers up to `start`; their N `no_sync_s`, S + U `extra_s`, memory left
        `free_bytes`) whose bound is at most `limit_s` for some end e in `ends` (later stages' least max and Σ of N
        `after_max_s`, `after_sum_s` per end)."""
        suffix = self.suffix
        ends = np.asarray(ends, dtype=np.int64)
        least_segment = self.least_prefix_s[ends] - self.least_prefix_s[start]
        return _may_beat(np.asarray(no_sync_s, float), np.asarray(extra_s, float), np.asarray(free_bytes, float),
                         suffix.suffix_s, suffix.suffix_abs, suffix.lambdas, start, ends, least_segment,
                         np.asarray(after_max_s, float), np.asarray(after_sum_s, float), float(micro_batches),
                         float(limit_s), 4.0 * suffix.layers + 16.0)
