"""The exact search of one setting: the estimator's fastest plan over every partition and per-layer strategy
(`Planner(exact=True)`, `gbmw plan --exact`).

A setting fixes the pipeline degree P, the micro-batch size and count m, the schedule and the budget W. A plan
is a partition into P contiguous non-empty stages and one strategy per layer; its time is Eq. (9) as
gbmw.cost.pipeline_schedules writes it,

    T = (m − 1) · max_i N_i + Σ_i N_i + max_i S_i + max_i U_i,

(N_i: stage i's time per micro-batch without gradient synchronisation, S_i: what the synchronisation adds,
U_i: its optimizer step), and it fits when every stage's peak (gbmw.cost.stage_cost.stage_estimate) is at most W.
T never falls when one stage's N, S or U falls, so the search has two exact levels:

1. **Stages** (the stage DP of Eq. (4), Algorithm 3, without a memory grid). For every stage position (index i,
   first layer, layer count) the fitting stage options no other matches or beats in N, S and U (`time_columns`,
   gbmw.search.exact.whole_plan_frontier).
   The DP walks the stage's layers and keeps, per activation layout of the last layer (R of Eq. (4) depends on
   layouts), the partial plans no other matches or beats in all of

       stash  Σ (O_ms + k · O_f)          k in-flight micro-batches (1F1B: min(P − i, m))
       E      stash + backward excess     the peak of Eq. (2) so far (gbmw.search.stage_dp.pareto explains the excess)
       min(p, chunk)  parameters the stage's optimizer steps, as the step reserve of gbmw.cost.framework_memory
              counts them (4 bytes × min(p, one chunk))
       N, N + S, N + U, N + S + U  no-sync time, synchronisation extra and optimizer step U = p · step time so
              far (`time_columns`; one stage alone: m · N + S + U, its Eq. (9) time) — `plan_columns`; a layer's
              options are compared likewise, with stash + backward and stash − forward (`option_columns`)

   and drops a partial plan whose E plus its step reserve exceeds W (neither ever falls as layers are added).
   Every prefix is kept in a trie keyed by what determines a layer's options (its cost class, k, whether a
   previous stage sends to it, the stage-local side input and tied weight), so stage positions that share a
   prefix — all middle stages of a homogeneous model — share its DP.
2. **Partitions**: a DP over the stages in order that keeps, per stage boundary, the partial plans no other
   matches or beats in max N, Σ N, max S and max U (`time_columns`) — Eq. (9) exactly, for any stage being the
   slowest.

Memory is exact, not rounded to units: every memory term of the tables is put on a grid of 2^-q bytes fine enough
that no sum of them can round (`MemoryGrid`, gbmw.search.exact.whole_plan_frontier), so the DP's sums are the very numbers
stage_estimate computes, and a budget equal to a plan's peak keeps that plan. (The estimator's memory terms are byte counts times powers of two —
micro-batch shares, TP and ZeRO degrees — so they lie on that grid; a term that does not is rounded up, the safe
direction, and the budget lowered by the rounding the estimator's own sums could make: then, only then, a plan
within about 1e-13 of the budget may be missed.) Times are summed in another order than stage_estimate's, so they
may differ from it in the last bits; the planner re-estimates the plan it returns.

Pruning by an incumbent (the best plan found so far, of time T_best for this setting's batch): a partial stage
whose m · N + S + U plus the least no-sync time of every layer outside it is above T_best cannot be part of a
faster plan (T ≥ (m − 1) · N_i + Σ_j N_j + S_i + U_i), and likewise for partial partitions. Memory-aware: every
stage must fit the budget with its own stash, so gbmw.search.bounds.stage_knapsack_bound bounds the other stages' max and Σ of N
(`partition_tables`, with the least boundary sends of gbmw.search.bounds.stage_boundary_floor) for stage options, partial
partitions and partial stages; gbmw.search.bounds.stage_suffix_bound what the last stage's remaining layers add within the memory
its partial plan has left (to N, and jointly to m · N + S + U), and gbmw.search.bounds.stage_segment_bound the same for a first or middle stage over its possible ends.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from gbmw.cost.framework_memory import ADAM_CHUNK_ELEMENTS
from gbmw.cost.stage_cost import StageCosts
from gbmw.search.bounds.setting_bounds import least_optimizer_parameters
from gbmw.search.bounds.stage_boundary_floor import boundary_floors_s
from gbmw.search.bounds.stage_knapsack_bound import fill_s, partition_tables, stage_bound_tables
from gbmw.search.bounds.stage_segment_bound import StageCompletionBound
from gbmw.search.bounds.stage_suffix_bound import SuffixTimeBound
from gbmw.search.exact.frontier_step import extend_and_filter
from gbmw.search.exact.whole_plan_frontier import (MemoryGrid, PartialPlans, StageOptions, nondominated, option_columns,
                                                   time_columns)
from gbmw.search.stage_dp.stage_search import cost_classes

INCUMBENT_SLACK = 1e-12
"""Relative slack on the incumbent's time before a partial plan is pruned by it: the bounds sum the same
non-negative times in another order than Eq. (9) does, which moves them by at most a few ulps (≈1e-16 relative
each, fewer than 10^3 terms), far below this; a plan faster than the incumbent by less is as good as it."""


# ---------------------------------------------------------------------------------------------------- stages


class WholePlanSearch:
    """The exact search of one setting (see the module docstring), among the strategies `allowed` per layer."""

    def __init__(self, costs: StageCosts, budget_bytes: float, allowed: np.ndarray,
                 stage_bounds: list[np.ndarray] | None = None):
        """`stage_bounds`: the setting's gbmw.search.bounds.stage_knapsack_bound.stage_bound_tables, where known."""
        tables, model = costs.tables, costs.model
        self.costs, self.tables, self.allowed = costs, tables, allowed
        self.pp, self.m, self.layers = costs.pp, costs.num_micro_batches, model.num_layers
        self.layer_class = cost_classes(model)
        self.reserve_per_parameter = float(tables.step_temporary_bytes_per_parameter)
        self.step_s = float(tables.optimizer_step_s_per_parameter)
        layouts = tables.transition_fraction.shape[0]
        self.layout_data_parallel = np.zeros(layouts)
        self.layout_data_parallel[tables.layout] = tables.data_parallel
        self.layout_tp = np.ones(layouts, dtype=int)
        self.layout_tp[tables.layout] = tables.tp
        self.layout_shards = np.ones(layouts, dtype=int)
        self.layout_shards[tables.layout] = tables.boundary_shards
        self._zero_transition = np.zeros((layouts, layouts))
        masked = np.where(allowed, 1.0, 0.0)
        strategies = np.arange(len(tables.strategies))
        received = np.stack([costs.received_input_bytes(layer, strategies) for layer in range(self.layers)], axis=1)
        side = np.stack([costs.side_input_bytes(layer, strategies) for layer in range(self.layers)], axis=1)
        heaviest = ((tables.model_state_bytes + tables.backward_memory_bytes) * masked).max(axis=0).sum()
        per_micro_batch = ((tables.forward_memory_bytes + received + side) * masked).max(axis=0).sum()
        most_parameters = (tables.optimizer_parameters * masked).max(axis=0).sum()
        reserve = self.reserve_per_parameter * max(most_parameters, ADAM_CHUNK_ELEMENTS)
        grid = MemoryGrid(2 * (heaviest + max(costs.in_flight) * per_micro_batch + reserve))
        # parameters on the memory grid over the reserve's bytes per parameter (4: a power of two), so that the
        # reserve, bytes × min(parameters, chunk), is on the memory grid too
        parameter_grid = MemoryGrid(2 * most_parameters)
        if self.reserve_per_parameter > 0 and math.log2(self.reserve_per_parameter).is_integer():
            parameter_grid.step_bytes = grid.step_bytes / self.reserve_per_parameter
        self.memory_step_bytes = grid.step_bytes
        # every memory term of the stage model, [strategy, layer], on the grids
        self.forward = grid.up(tables.forward_memory_bytes)
        self.states = grid.up(tables.model_state_bytes)
        self.backward = grid.up(tables.backward_memory_bytes)
        self.received = grid.up(received)
        self.side = grid.up(side)
        self.tied_states = grid.up(np.stack([costs.tied_state_bytes(layer, strategies)
                                             for layer in range(self.layers)], axis=1))
        self.params = parameter_grid.up(tables.optimizer_parameters)
        self.tied_params = parameter_grid.up(np.stack([costs.tied_optimizer_parameters(layer, strategies)
                                                       for layer in range(self.layers)], axis=1))
        self.rounded = grid.rounded or parameter_grid.rounded
        """Some term was off the grid and rounded up: then the budget is lowered by what the estimator's own sums of
        such terms may round (at most an ulp of the largest sum per addition, a few additions per layer)."""
        self.budget = float(budget_bytes) - ((4 * self.layers + 16) * grid.step_bytes * max(1.0, self.reserve_per_parameter)
                                             if self.rounded else 0.0)
        least = np.where(allowed, tables.time_no_grad_sync_s, np.inf).min(axis=0)
        self.least_no_sync_s = least
        self.least_prefix_s = np.concatenate(([0.0], np.cumsum(least)))
        # the last stage's later layers, each at its least (ties as if the twin shared the stage)
        in_flight = costs.in_flight[-1]
        ties = costs.tied_to >= 0
        states = self.states - np.where(ties[None, :], self.tied_states, 0.0)
        params = self.params - np.where(ties[None, :], self.tied_params, 0.0)
        sync = tables.time_s - tables.time_no_grad_sync_s

        def suffix(values: np.ndarray) -> np.ndarray:
            least_values = np.where(allowed, values, np.inf).min(axis=0)
            return np.concatenate((np.cumsum(least_values[::-1])[::-1], [0.0]))

        self.least_suffix_s = suffix(tables.time_no_grad_sync_s)
        self.least_sync_suffix_s = suffix(sync)
        self.least_stash_suffix = suffix(states + in_flight * self.forward)
        self.least_carry_suffix = suffix(states + (in_flight - 1) * self.forward)
        self.least_params_suffix = suffix(params)
        # [i, layer]: min max and min Σ of LB_j over the stages before stage i (layers [0, layer)) and from stage i
        # on (layers [layer, L)), under the budget every stage of a plan fits
        partitions = partition_tables(stage_bounds if stage_bounds is not None
                                      else stage_bound_tables(costs, allowed, float(budget_bytes)))
        self.before_max, self.before_sum, self.after_max, self.after_sum = partitions
        self._completion = StageCompletionBound(costs, allowed, partitions, boundary_floors_s(costs, allowed)[1])
        self._suffix: SuffixTimeBound | None = None
        self._joint_suffix: SuffixTimeBound | None = None  # both made with the first last-stage prune
        self._nodes: dict[tuple, PartialPlans] = {}
        self._options: dict[tuple, tuple] = {}
        self._stages: dict[tuple[int, int], list[StageOptions | None]] = {}
        self.limit_s = np.inf

    # ------------------------------------------------------------------ one layer's options

    def _layer_options(self, layer: int, stage_index: int, first: int, side_first: bool):
        receives = stage_index > 0 and layer == first
        twin = self.costs.twin_in_stage(layer, first)
        in_flight = self.costs.in_flight[stage_index]
        key = (layer, receives, in_flight, side_first, twin)
        if key in self._options:
            return self._options[key]
        tables, costs = self.tables, self.costs
        chosen = np.nonzero(self.allowed[:, layer])[0]
        no_sync = tables.time_no_grad_sync_s[chosen, layer].copy()
        sync = tables.time_s[chosen, layer] - tables.time_no_grad_sync_s[chosen, layer]
        forward = self.forward[chosen, layer]
        states = self.states[chosen, layer]
        params = self.params[chosen, layer]
        if receives:  # receive the activation, send its gradient back
            no_sync = no_sync + costs.strategies_send_s(layer, chosen)
            forward = forward + self.received[chosen, layer]
        if side_first:
            forward = forward + self.side[chosen, layer]
        if twin:
            states = states - self.tied_states[chosen, layer]
            params = params - self.tied_params[chosen, layer]
        stash = states + in_flight * forward
        backward = self.backward[chosen, layer]
        layout = tables.layout[chosen]
        # drop options another of the same layout matches or beats after any partial plan (`option_columns`)
        keep = nondominated(option_columns(no_sync, sync, stash, forward, backward, params, self.step_s), layout)
        result = (chosen[keep], no_sync[keep], sync[keep], stash[keep], forward[keep], backward[keep], params[keep],
                  layout[keep])
        self._options[key] = result
        return result

    # ------------------------------------------------------------------ stage DP

    def _stage_may_beat(self, stage_indices: tuple, done: int, no_sync, sync, params, stash) -> np.ndarray:
        """Whether a plan completing partial plans of `done` layers of one of `stage_indices` (the first stage, or the
        middle ones sharing the DP) may beat the incumbent (gbmw.search.bounds.stage_segment_bound)."""
        free = self.budget - stash - self.reserve_per_parameter * np.minimum(params, float(ADAM_CHUNK_ELEMENTS))
        return self._completion.may_beat(stage_indices, done, no_sync, sync + params * self.step_s, free, self.m,
                                         self.limit_s * (1 + INCUMBENT_SLACK))

    def _last_stage_may_beat(self, end: int, first: int, no_sync, sync, params, stash) -> np.ndarray:
        """Whether T may beat the incumbent: T ≥ m · N_last + S_last + U_last + the other stages' least no-sync time (as
        `extend_candidates`), what layers [end, L) add to m · N + S + U bounded within the memory left
        (gbmw.search.bounds.stage_suffix_bound) two ways: N under the memory with S and U at their least, and the three
        jointly (the better of the two; the joint one prices a layer's short compute and its long synchronisation
        together: t5-large-48 at 20 GiB, P = 1, micro-batch 384, 0.41 → 0.12 s for the setting)."""
        if self._suffix is None:
            in_flight, tables = self.costs.in_flight[-1], self.tables
            self._suffix = SuffixTimeBound(self.costs, self.allowed, in_flight)
            joint = (self.m * tables.time_no_grad_sync_s + (tables.time_s - tables.time_no_grad_sync_s)
                     + self.step_s * least_optimizer_parameters(self.costs))
            self._joint_suffix = SuffixTimeBound(self.costs, self.allowed, in_flight, joint)
        free = self.budget - stash
        rest_s = np.maximum(self._suffix.lower_s(end, free), self.least_suffix_s[end])
        so_far = self.m * no_sync + sync + self.step_s * params + self.least_prefix_s[first]
        # the rest's m · N + S + U bounded apart (N under the memory left, S and U at their least) and jointly
        rest_apart = self.m * rest_s + self.step_s * self.least_params_suffix[end] + self.least_sync_suffix_s[end]
        rest_jointly = self._joint_suffix.lower_s(end, free)
        return so_far + np.maximum(rest_apart, rest_jointly) <= self.limit_s * (1 + INCUMBENT_SLACK)

    def _extend(self, node: PartialPlans, options, transition: np.ndarray, rest_s: float,
                rest: tuple = (0.0, 0.0, 0.0, 0.0, 0), lower_bound=None) -> PartialPlans:
        strategy, no_sync, sync, stash, forward, backward, params, layout = options
        budget = self.budget
        # every new partial plan and the Pareto filter in one pass (gbmw.search.exact.frontier_step: the rows
        # `nondominated_plans` keeps of `extend_candidates`' rows), then the incumbent bound on the kept ones: the two
        # commute, and the filter keeps the fewer (GPT-3 65B on 64 H100s: ~6 % of ~8.5M new plans in a batch sweep)
        columns = extend_and_filter(
            node.stash, node.excess, node.no_sync, node.sync, node.params, node.layout, node.by_stash(),
            np.argsort(layout, kind="stable"), no_sync, sync, stash, forward, backward, params, layout, transition, budget,
            self.reserve_per_parameter, float(ADAM_CHUNK_ELEMENTS), float(self.m), self.step_s, rest_s,
            self.limit_s * (1 + INCUMBENT_SLACK), *rest, float(self.m) if self.pp == 1 else -1.0)
        n_stash, n_excess, n_no_sync, n_sync, n_params, n_layout, n_option, n_parent, n_key = columns
        keep = np.argsort(n_key)
        if lower_bound is not None:
            keep = keep[lower_bound(n_no_sync[keep], n_sync[keep], n_params[keep], n_stash[keep])]
        return PartialPlans(n_stash[keep], n_excess[keep], n_no_sync[keep], n_sync[keep], n_params[keep], n_layout[keep],
                     strategy[n_option[keep]], n_parent[keep], node, node.depth + 1)

    def stage_options(self, stage_index: int, first: int) -> list[StageOptions | None]:
        """[count − 1]: the options of stage `stage_index` holding layers [first, first + count)."""
        key = (stage_index, first)
        if key in self._stages:
            return self._stages[key]
        costs = self.costs
        last_end = self.layers - (self.pp - 1 - stage_index)
        ends = [self.layers] if stage_index == self.pp - 1 else range(first + 1, last_end + 1)
        last = stage_index == self.pp - 1
        # The last stage holds every layer from `first` on: its DP is not shared with other first layers, and the
        # layers still to come bound it (their least time, m-fold, and their least memory).
        node_key: tuple = ("root", costs.in_flight[stage_index], stage_index > 0) + (("last", first) if last else ())
        node = self._nodes.setdefault(node_key, PartialPlans.root())
        sharing = (0,) if stage_index == 0 else tuple(i for i in range(1, self.pp - 1) if costs.in_flight[i]
                                                      == costs.in_flight[stage_index])
        seen_side = False
        found: list[StageOptions | None] = [None] * (last_end - first)
        inside_s = 0.0
        for layer in range(first, last_end):
            side_first = costs.side_bytes[layer] > 0 and not seen_side
            seen_side = seen_side or costs.side_bytes[layer] > 0
            element = (self.layer_class[layer], layer == first, side_first, costs.twin_in_stage(layer, first))
            inside_s += self.least_no_sync_s[layer]
            node_key = (id(node), element)
            child = self._nodes.get(node_key)
            if child is None:
                options = self._layer_options(layer, stage_index, first, side_first)
                transition = self._zero_transition if layer == first else costs.transition_s(layer)
                # the layers outside this stage prefix take at least their least no-sync time, on any stage
                if last:
                    rest_s = (self.least_prefix_s[first] + self.m * self.least_suffix_s[layer + 1]
                              + self.least_sync_suffix_s[layer + 1])
                    rest = (self.least_stash_suffix[layer + 1], self.least_carry_suffix[layer + 1],
                            self.least_params_suffix[layer + 1], 0.0, 0)
                elif stage_index == 0:  # starts at layer 0: its DP is not shared either
                    rest_s = self.least_suffix_s[layer + 1]
                    rest = (0.0, 0.0, 0.0, self.least_suffix_s[layer + 1], self.pp)
                else:  # shared by every first layer: all P stages share the layers outside the prefix
                    rest_s = max(self.least_prefix_s[-1] - inside_s, 0.0)
                    rest = (0.0, 0.0, 0.0, rest_s, self.pp)
                bound = (partial(self._last_stage_may_beat, layer + 1, first) if last else
                         partial(self._stage_may_beat, sharing, layer + 1 - first))
                child = self._nodes[node_key] = self._extend(node, options, transition, rest_s, rest, bound)
            node = child
            if len(node) == 0:
                break
            if layer + 1 in ends:
                found[layer - first] = self._finish(node, stage_index, first, layer + 1)
        self._stages[key] = found
        return found

    def _finish(self, node: PartialPlans, stage_index: int, first: int, end: int) -> StageOptions | None:
        no_sync = node.no_sync
        if stage_index < self.pp - 1:  # send the output to the next stage, and receive its gradient
            no_sync = no_sync + self.costs.boundary_send_s(end, self.layout_data_parallel, self.layout_tp,
                                                           self.layout_shards)[node.layout]
        optimizer = node.params * self.step_s
        outside = self.least_prefix_s[first] + self.least_prefix_s[-1] - self.least_prefix_s[end]
        slowest_other = max(self.before_max[stage_index, first], self.after_max[stage_index + 1, end])
        others = self.before_sum[stage_index, first] + self.after_sum[stage_index + 1, end]
        lower = np.maximum(self.m * no_sync + outside,
                           fill_s(self.m, np.maximum(no_sync, slowest_other)) + no_sync + others)
        useful = lower + node.sync + optimizer <= self.limit_s * (1 + INCUMBENT_SLACK)
        index = np.nonzero(useful)[0]
        if index.shape[0] == 0:
            return None
        keep = index[nondominated(time_columns(no_sync[index], node.sync[index], optimizer[index]))]
        return StageOptions(no_sync[keep], node.sync[keep], optimizer[keep], node, keep)

    # ------------------------------------------------------------------ partitions (Eq. (9))

    def solve(self, limit_s: float = np.inf) -> tuple[float, tuple[int, ...], list[int]] | None:
        """(T, partition, strategy indices) of the fastest plan that fits, among those with T ≤ `limit_s` (up to
        INCUMBENT_SLACK), or None."""
        self.limit_s = limit_s
        self._nodes.clear()
        self._stages.clear()
        m, layers, pp = self.m, self.layers, self.pp
        slack_limit = limit_s * (1 + INCUMBENT_SLACK)
        # per boundary layer: (max N, Σ N, max S, max U) rows, and back-pointers (previous row, first, option)
        frontier = {0: (np.zeros((1, 4)), [None])}
        for stage_index in range(pp):
            grown: dict[int, tuple[list, list]] = {}
            for first, (rows, back) in frontier.items():
                for position, options in enumerate(self.stage_options(stage_index, first)):
                    if options is None:
                        continue
                    end = first + position + 1
                    combined = np.empty((len(rows) * len(options), 4))
                    combined[:, 0] = np.maximum.outer(rows[:, 0], options.no_sync_s).ravel()
                    combined[:, 1] = np.add.outer(rows[:, 1], options.no_sync_s).ravel()
                    combined[:, 2] = np.maximum.outer(rows[:, 2], options.sync_s).ravel()
                    combined[:, 3] = np.maximum.outer(rows[:, 3], options.optimizer_s).ravel()
                    later = max(self.least_prefix_s[-1] - self.least_prefix_s[end], self.after_sum[stage_index + 1, end])
                    lower = (fill_s(m, np.maximum(combined[:, 0], self.after_max[stage_index + 1, end]))
                             + combined[:, 1] + combined[:, 2] + combined[:, 3] + later)
                    useful = np.nonzero(lower <= slack_limit)[0]
                    if useful.shape[0] == 0:
                        continue
                    entry = grown.setdefault(end, ([], []))
                    entry[0].append(combined[useful])
                    entry[1].extend((first, int(row), options, int(option))
                                    for row, option in zip(*np.divmod(useful, len(options))))
            frontier = {}
            for end, (parts, back) in grown.items():
                rows = np.concatenate(parts)
                keep = nondominated(np.concatenate([rows[:, :1], time_columns(rows[:, 1], rows[:, 2], rows[:, 3])],
                                                   axis=1))
                frontier[end] = (rows[keep], [back[k] for k in keep])
            # keep the back-pointers of every stage to rebuild the plan
            setattr(self, f"_back_{stage_index}", {end: back for end, (_, back) in frontier.items()})
            self._frontier_after = frontier
            if not frontier:
                return None
        if layers not in frontier:
            return None
        rows, back = frontier[layers]
        times = (m - 1) * rows[:, 0] + rows[:, 1] + rows[:, 2] + rows[:, 3]
        best = int(np.argmin(times))
        if times[best] > slack_limit:
            return None
        # rebuild: follow the back-pointers stage by stage, last first
        partition: list[int] = []
        strategies: list[list[int]] = []
        end, row = layers, best
        for stage_index in range(pp - 1, -1, -1):
            first, previous_row, options, option = getattr(self, f"_back_{stage_index}")[end][row]
            partition.append(end - first)
            strategies.append(options.strategies(option))
            end, row = first, previous_row
        return float(times[best]), tuple(partition[::-1]), [s for stage in strategies[::-1] for s in stage]
