"""A memory-aware lower bound of Eq. (9) for the partial plans of a stage that may still end at any of several
layers: the exact search (gbmw.search.exact.whole_plan_search) prunes the partial plans of the first and the middle stages by it.

gbmw.search.bounds.stage_suffix_bound bounds what the layers after a partial plan add when the stage must hold all of them (the
last stage). A stage that ends at some layer e of a range holds only layers [l, e) more, and e is not known yet.

**One completion.** A partial plan of stage i on layers [f, l) has no-sync time N so far, stash s and parameters q
(gbmw.search.exact.whole_plan_search's terms). A completion on layers [l, e) under strategies s_j fits the budget E only if the
stage's peak, at least its whole stash plus the optimizer step's reserve (gbmw.cost.framework_memory: 4 bytes ×
min(parameters, one chunk), never falling as parameters are added), is at most E, so

    Σ_{j∈[l,e)} mem(s_j, j) ≤ F = E − s − reserve(q),       mem = O_ms' + k_i · O_f

(O_ms' of gbmw.search.bounds.setting_bounds.least_state_bytes: a tied weight counted at most once; the received and side inputs and the
backward excess only add). For every λ ≥ 0 (weak duality, as in gbmw.search.bounds.stage_knapsack_bound) the stage's no-sync time
is then at least

    N_i ≥ N + max(Σ_{j∈[l,e)} min_s c(s, j),  max_λ Σ_{j∈[l,e)} min_s [c(s, j) + λ · mem(s, j)] − λ · F) + send[e]

(c: the no-sync time; the transitions R of Eq. (4) are ≥ 0; send[e]: the least send to stage i + 1,
gbmw.search.bounds.stage_boundary_floor). The sums are differences of the suffix sums gbmw.search.bounds.stage_suffix_bound keeps per λ. The
stages before take layers [0, f) and those after [e, L): their max and Σ of N are at least before_max[i, f] ∨
after_max[i + 1, e] and before_sum[i, f] + after_sum[i + 1, e] (gbmw.search.bounds.stage_knapsack_bound's partition tables), so

    T ≥ (m − 1) · max(N_i, other max) + N_i + other Σ + S + U

with S and U the partial plan's synchronisation and step times so far (both only grow).

**Every completion.** A partial plan is pruned when that bound exceeds the incumbent's time for every completion
(f, e) it may have: the first stage has f = 0; a middle stage's partial plans are shared by every first layer f
and by the stages with the same in-flight count k (gbmw.search.exact.whole_plan_search's trie), so every such stage i, every f
for which a partition of [0, f) into i stages exists and every e up to where the later stages still get a layer
each are tried (a superset of the completions the plan really has only keeps more). The kernel stops at the first
completion whose bound does not exceed the incumbent, trying the memory-blind bound (the first term of the max)
first: when it exceeds, so does the memory-aware one.

**Rounding.** Each segment sum is a difference of two suffix sums of at most L terms; the same error bound as
gbmw.search.bounds.stage_suffix_bound, (4 L + 16) ulps of the magnitudes (|suffix| from l on, which covers the suffix from e on,
and |λ · F|), is subtracted, so a bound is never above the exact value. The search's memory terms are rounded up to
its grid, so F computed from them is at most the exact memory left: the bound is only lower. The comparison with the
incumbent keeps the search's relative slack (gbmw.search.exact.whole_plan_search.INCUMBENT_SLACK) for the times' own roundings.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from gbmw.search.bounds.stage_suffix_bound import SuffixTimeBound

_EPSILON = float(np.finfo(np.float64).eps)


@njit(cache=True)
def _may_beat(no_sync, extra_s, free, suffix_s, suffix_abs, lambdas, starts, ends, least_segment_s, send_floor_s,
              other_max, other_sum, m, limit_s, error_ulps):
    """Per partial plan: whether the bound of some completion (`starts`[k], `ends`[k]) is at most `limit_s` (see
    the module). The memory-blind bound of a completion is tried first: the memory-aware one is never below it."""
    plans, points, completions = no_sync.shape[0], lambdas.shape[0], ends.shape[0]
    keep = np.zeros(plans, np.bool_)
    last_exceeding = 0  # the λ that last proved a completion too slow is tried first: neighbours share it
    last_kept = 0  # and the completion that last let a plan through (GPT-3 65B: 60 of 69 tried before it, on average)
    if completions == 0:  # no way to complete the stage: no plan is kept
        return keep
    for p in range(plans):
        for step in range(completions + 1):
            k = last_kept if step == 0 else step - 1
            if step > 0 and k == last_kept:
                continue
            stage = no_sync[p] + least_segment_s[k] + send_floor_s[k]
            if (m - 1.0) * max(stage, other_max[k]) + stage + other_sum[k] + extra_s[p] > limit_s:
                continue
            start, e = starts[k], ends[k]
            exceeds = False
            for step in range(points):  # the bound only grows with each λ: stop at the first that exceeds
                j = (last_exceeding + step) % points
                penalty = lambdas[j] * free[p]
                value = (suffix_s[j, start] - suffix_s[j, e] - penalty
                         - error_ulps * _EPSILON * (suffix_abs[j, start] + abs(penalty)))
                if value > least_segment_s[k]:
                    stage = no_sync[p] + value + send_floor_s[k]
                    if (m - 1.0) * max(stage, other_max[k]) + stage + other_sum[k] + extra_s[p] > limit_s:
                        exceeds = True
                        last_exceeding = j
                        break
            if not exceeds:
                keep[p] = True
                last_kept = k
                break
    return keep


class StageCompletionBound:
    """The bound of the module for the partial plans of the first and middle stages of one setting (`costs`), among
    the strategies `allowed` per layer, with the partition tables of gbmw.search.bounds.stage_knapsack_bound (`tables`: before_max,
    before_sum, after_max, after_sum) and the send floors of gbmw.search.bounds.stage_boundary_floor (`send_floor_s`)."""

    def __init__(self, costs, allowed: np.ndarray, tables, send_floor_s: np.ndarray):
        self.costs, self.allowed, self.tables, self.send_floor_s = costs, allowed, tables, send_floor_s
        self.layers, self.pp = allowed.shape[1], costs.pp
        least = np.where(allowed, costs.tables.time_no_grad_sync_s, np.inf).min(axis=0)
        self.least_prefix_s = np.concatenate(([0.0], np.cumsum(least)))
        self._suffix: dict[float, SuffixTimeBound] = {}
        self._pairs: dict[tuple, tuple] = {}

    def completions(self, stage_indices: tuple[int, ...], done: int) -> tuple[np.ndarray, ...]:
        """(starts, ends, other stages' least max N, least Σ N) of every way a partial plan of `done` layers of one
        of the stages `stage_indices` (none the last) may be completed: stage i from some first layer f (a
        partition of [0, f) into i stages exists) on layers [f + done, e), stages i + 1 … P − 1 on [e, L)."""
        key = (stage_indices, done)
        if key not in self._pairs:
            before_max, before_sum, after_max, after_sum = self.tables
            parts = []
            for i in stage_indices:  # every (f, e) of stage i, f-major then e ascending, as one broadcast
                last_end = self.layers - (self.pp - 1 - i)
                firsts = np.nonzero(np.isfinite(before_max[i, :last_end]))[0]
                firsts = firsts[firsts + done <= last_end][:, None]
                ends = np.arange(last_end + 1)[None, :]
                other_max = np.maximum(before_max[i, firsts], after_max[i + 1, ends])
                other_sum = before_sum[i, firsts] + after_sum[i + 1, ends]
                valid = (ends >= firsts + done) & np.isfinite(other_max) & np.isfinite(other_sum)
                rows, columns = np.nonzero(valid)
                parts.append(np.stack([(firsts[:, 0] + done)[rows], ends[0, columns], other_max[valid],
                                       other_sum[valid]]).astype(float))
            pairs = np.concatenate(parts, axis=1) if parts else np.zeros((4, 0))
            starts, ends = pairs[0].astype(np.int64), pairs[1].astype(np.int64)
            least = self.least_prefix_s[ends] - self.least_prefix_s[starts]
            # the completions whose memory-blind bound is least first: a plan that may beat the incumbent stops early
            order = np.argsort(np.maximum(least + self.send_floor_s[ends], pairs[2]) + pairs[3], kind="stable")
            self._pairs[key] = (starts[order], ends[order], least[order], self.send_floor_s[ends][order],
                                pairs[2][order], pairs[3][order])
        return self._pairs[key]

    def may_beat(self, stage_indices: tuple[int, ...], done: int, no_sync_s: np.ndarray, extra_s: np.ndarray,
                 free_bytes: np.ndarray, micro_batches: float, limit_s: float) -> np.ndarray:
        """Mask of the partial plans (of `done` layers of one of the stages `stage_indices`, which keep the same
        in-flight micro-batches; their N `no_sync_s`, S + U `extra_s`, memory left `free_bytes`) whose bound is at
        most `limit_s` for some completion."""
        in_flight = float(self.costs.in_flight[stage_indices[0]])
        if in_flight not in self._suffix:
            self._suffix[in_flight] = SuffixTimeBound(self.costs, self.allowed, in_flight)
        suffix = self._suffix[in_flight]
        starts, ends, least, send, other_max, other_sum = self.completions(stage_indices, done)
        return _may_beat(np.asarray(no_sync_s, float), np.asarray(extra_s, float), np.asarray(free_bytes, float),
                         suffix.suffix_s, suffix.suffix_abs, suffix.lambdas, starts, ends, least, send, other_max,
                         other_sum, float(micro_batches), float(limit_s), 4.0 * suffix.layers + 16.0)
