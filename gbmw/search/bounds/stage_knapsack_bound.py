"""A memory-aware upper bound of a setting's throughput: every stage's no-sync time bounded from below under the
memory it must fit in (a Lagrangian relaxation of its knapsack), combined over every partition by Eq. (9).

gbmw.search.bounds.setting_bounds.throughput_upper_bound lets the stages share one memory pool of P · E and balances their times
perfectly; with 1F1B the first stage keeps P micro-batches' activations (gbmw.cost.pipeline_schedules) and must still
fit E on its own, so that bound can be far above any plan (GPT-3 65B on 64 devices: 52 samples/s against 46).
This one bounds each stage on its own.

**One stage.** Stage j of P holds layers [a, c) under strategies s_l and keeps k_j micro-batches in flight. If it
fits the budget E (gbmw.cost.stage_cost.stage_estimate),

    E ≥ peak_j ≥ E_f,j = Σ_{l∈[a,c)} O_ms'(s_l, l) + k_j · O_f(s_l, l)                                          (i)

— Eq. (3) ≤ Eq. (2) with k_j micro-batches stashed: the backward excess, the received and side inputs and the
optimizer step's reserve only add to the peak, and O_ms' (gbmw.search.bounds.setting_bounds.least_state_bytes) counts a tied weight at
most once — and its no-sync time is

    N_j ≥ Σ_{l∈[a,c)} c_no_sync(s_l, l)                                                                          (ii)

(the transitions R of Eq. (4) are ≥ 0; the sends to neighbouring stages are at least the floors of
gbmw.search.bounds.stage_boundary_floor, added to LB_j below). For any λ ≥ 0, adding λ · (E_f,j − E)
≤ 0 to (ii) and taking each layer's least term gives weak duality for this multiple-choice knapsack:

    N_j ≥ LB_j(a, c) = max_λ  Σ_{l∈[a,c)} min_s [c_no_sync(s, l) + λ · mem_j(s, l)] − λ · E,
    mem_j = O_ms' + k_j · O_f.

Any λ gives a valid bound, so a fixed grid of λ (from 0 to the steepest trade of time for memory of any layer)
loses only tightness. A smaller k in place of k_j only lowers mem_j, so LB stays valid with k_j rounded down to a
power of two (fewer distinct tables for deep pipelines).

**The pipeline.** Eq. (9) as gbmw.cost.pipeline_schedules writes it, T = (m − 1) · max_j N_j + Σ_j N_j + max_j S_j +
max_j U_j, is at least

    (m − 1) · min_p max_j LB_j(p_j) + min_p Σ_j LB_j(p_j) + S_lower

over partitions p into P contiguous non-empty stages (each minimum by a DP over stage boundaries; taking them
separately only lowers the sum), with S_lower the synchronisation bound of gbmw.search.bounds.setting_bounds. The throughput bound is
B / T_lower.

**Rounding.** λ · E can be far larger than the times, so the differences of prefix sums that give Σ_l − λ · E lose
low bits, and stage_estimate's own float sums may put a stage whose exact E_f,j is a few ulps above E at E; each LB
has an error bound of (4 L + 16) ulps of its magnitudes subtracted (about twice what both need: L roundings of the
prefix sums and a few per term, and as many in stage_estimate's sums), so it stays below every stage that fits
by stage_estimate. Stages whose lightest choices exceed E by more than that margin get LB = inf.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from gbmw.cost.stage_cost import StageCosts
from gbmw.search.bounds.setting_bounds import BOUND_SLACK, least_optimizer_parameters, least_state_bytes
from gbmw.search.bounds.stage_boundary_floor import boundary_floors_s, with_boundary_floors

LAMBDA_POINTS = 24
"""λ values per stage table (geometric between the least and greatest time-per-byte trade of any layer, and 0)."""

_EPSILON = np.finfo(np.float64).eps


def trade_rates(time_s: np.ndarray, memory_bytes: np.ndarray) -> tuple[float, float]:
    """(least, greatest) positive seconds saved per byte spent between two allowed strategies of one layer
    (`time_s` inf where not allowed); (0, 0) when no layer trades time for memory. A rate is a pair of strategies of
    one layer, so layers whose columns are equal (the blocks of one kind) give the same rates: each distinct column
    is compared once (S² pairs per distinct layer, not per layer: 10× fewer for Mixtral-8x7B's 34 layers)."""
    both = np.concatenate((time_s, memory_bytes)).T
    distinct = list({column.tobytes(): layer for layer, column in enumerate(both)}.values())
    time_s, memory_bytes = time_s[:, distinct], memory_bytes[:, distinct]
    finite = np.isfinite(time_s)
    t = np.where(finite, time_s, np.nan)
    dt = t[:, None, :] - t[None, :, :]
    dm = memory_bytes[None, :, :] - memory_bytes[:, None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = dt / dm
    rate = rate[(dt > 0) & (dm > 0) & np.isfinite(rate)]
    if rate.size == 0:
        return 0.0, 0.0
    return float(rate.min()), float(rate.max())


def lambda_grid(low: float, high: float, points: int = LAMBDA_POINTS) -> np.ndarray:
    """0 and `points` λ values spread geometrically over [low, high] (only 0 when high is 0; from `high` alone when
    low is 0: one stash that trades nothing beside another that does). Every λ ≥ 0 gives a valid bound (weak duality):
    the grid only decides how tight it is."""
    if high <= 0:
        return np.zeros(1)
    return np.concatenate(([0.0], np.geomspace(low if low > 0 else high, high, points)))


def stage_time_lower_bounds(time_s: np.ndarray, memory_bytes: np.ndarray, budget_bytes: float,
                            lambdas: np.ndarray) -> np.ndarray:
    """[a, c]: LB(a, c) for layers [a, c) (see the module; -inf where a ≥ c), at the best λ of `lambdas`:
    a lower bound of Σ_l time_s[s_l, l] over every choice s with Σ_l memory_bytes[s_l, l] ≤ budget_bytes (inf
    where even the lightest choices exceed it). `time_s` is inf where a strategy is not allowed. Compiled
    (`_lower_bounds`): the same float operations as the numpy expressions its docstring gives, element by element."""
    time_s, memory_bytes = np.ascontiguousarray(time_s, float), np.ascontiguousarray(memory_bytes, float)
    return _lower_bounds(time_s, memory_bytes, float(budget_bytes), np.ascontiguousarray(lambdas, float),
                         (4 * time_s.shape[1] + 16) * _EPSILON)


@njit(cache=True)
def _lower_bounds(time_s, memory_bytes, budget_bytes, lambdas, margin):
    """`stage_time_lower_bounds`, operation for operation the numpy form it replaced (tests/test_stage_knapsack_bound.py
    keeps it as the reference), without its [λ, a, c] temporaries:

        combined = np.where(allowed, time_s + λ · memory_bytes, inf).min(over strategies)         [λ, layer]
        prefix, prefix_abs = 0 and the running sums of combined, of |combined|                   [λ, layer + 1]
        bounds = max over λ of (prefix[c] − prefix[a] − λ · E) − margin · (prefix_abs[c] + λ · E)   (NaN kept)
        inf where (lightest[c] − lightest[a]) − margin · lightest[c] > E (lightest: running sums of each layer's
        least memory), −inf where a ≥ c

    (margin = (4 L + 16) ulps: the module's rounding allowance)."""
    strategies, layers = time_s.shape
    points = lambdas.shape[0]
    prefix = np.zeros((points, layers + 1))
    prefix_abs = np.zeros((points, layers + 1))
    penalty = np.empty(points)
    for j in range(points):
        penalty[j] = lambdas[j] * budget_bytes
        for layer in range(layers):
            least = np.inf
            for s in range(strategies):
                if np.isfinite(time_s[s, layer]):
                    value = time_s[s, layer] + lambdas[j] * memory_bytes[s, layer]
                    if value < least or np.isnan(value):
                        least = value
                    if np.isnan(least):
                        break
            # np.cumsum: a running sum, its first term the term itself
            prefix[j, layer + 1] = least if layer == 0 else prefix[j, layer] + least
            prefix_abs[j, layer + 1] = abs(least) if layer == 0 else prefix_abs[j, layer] + abs(least)
    lightest = np.zeros(layers + 1)
    for layer in range(layers):
        least = np.inf
        for s in range(strategies):
            if np.isfinite(time_s[s, layer]) and (memory_bytes[s, layer] < least or np.isnan(memory_bytes[s, layer])):
                least = memory_bytes[s, layer]
                if np.isnan(least):
                    break
        lightest[layer + 1] = least if layer == 0 else lightest[layer] + least
    bounds = np.full((layers + 1, layers + 1), -np.inf)
    for a in range(layers + 1):
        for c in range(a + 1, layers + 1):
            best = 0.0
            for j in range(points):
                value = (prefix[j, c] - prefix[j, a] - penalty[j]) - margin * (prefix_abs[j, c] + penalty[j])
                if j == 0 or value > best or np.isnan(value):
                    best = value
                if np.isnan(best):
                    break
            if lightest[c] - lightest[a] - margin * lightest[c] > budget_bytes:
                best = np.inf
            bounds[a, c] = best
    return bounds


def partition_bounds(stage_bounds: list[np.ndarray]) -> tuple[float, float]:
    """(min over partitions of max_j LB_j, min over partitions of Σ_j LB_j), for P = len(stage_bounds) contiguous
    non-empty stages of all layers, stage j's LB from `stage_bounds[j]` ([a, c] as `stage_time_lower_bounds`)."""
    worst, total = partition_tables(stage_bounds)[:2]
    return float(worst[-1, -1]), float(total[-1, -1])


def partition_tables(stage_bounds: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """[i, layer] tables of the same two minima over the partitions of part of the layers (0 for no stage, inf where
    no partition exists): `before_max`, `before_sum` over layers [0, layer) into stages 0 … i − 1, and `after_max`,
    `after_sum` over layers [layer, L) into stages i … P − 1 (each stage's LB from its own table)."""
    pp, layers = len(stage_bounds), stage_bounds[0].shape[0] - 1
    valid = np.triu(np.ones((layers + 1, layers + 1), bool), k=1)
    bounds = [np.where(valid, table, np.inf) for table in stage_bounds]
    before_max, before_sum = np.full((pp + 1, layers + 1), np.inf), np.full((pp + 1, layers + 1), np.inf)
    after_max, after_sum = np.full((pp + 1, layers + 1), np.inf), np.full((pp + 1, layers + 1), np.inf)
    before_max[0, 0] = before_sum[0, 0] = after_max[pp, layers] = after_sum[pp, layers] = 0.0
    for i in range(pp):  # stage i ends at c, after stages 0 … i − 1 ending at a
        before_max[i + 1] = np.maximum(before_max[i][:, None], bounds[i]).min(axis=0)
        before_sum[i + 1] = (before_sum[i][:, None] + bounds[i]).min(axis=0)
    for i in range(pp - 1, -1, -1):  # stage i starts at a, before stages i + 1 … P − 1 starting at c
        after_max[i] = np.maximum(bounds[i], after_max[i + 1][None, :]).min(axis=1)
        after_sum[i] = (bounds[i] + after_sum[i + 1][None, :]).min(axis=1)
    return before_max, before_sum, after_max, after_sum


def stage_bound_tables(costs: StageCosts, allowed: np.ndarray, budget_bytes: float) -> list[np.ndarray]:
    """[stage index] → LB_j(a, c) tables (`stage_time_lower_bounds`) of the setting of `costs`, stage j with its own
    in-flight micro-batches (rounded down, see `_rounded_down`), among the strategies `allowed` per layer, plus the
    least time its stage boundaries add (gbmw.search.bounds.stage_boundary_floor)."""
    tables = costs.tables
    no_sync = np.where(allowed, tables.time_no_grad_sync_s, np.inf)
    states = least_state_bytes(costs)
    forward = tables.forward_memory_bytes
    # one λ grid for every stage: the trade rates of the lightest and the heaviest stash span the others'
    lows, highs = zip(*(trade_rates(no_sync, states + k * forward) for k in {1.0, float(max(costs.in_flight))}))
    lambdas = lambda_grid(min(lows), max(highs))
    by_in_flight: dict[float, np.ndarray] = {}
    for stage_index in range(costs.pp):
        in_flight = _rounded_down(costs.in_flight[stage_index])
        if in_flight not in by_in_flight:
            by_in_flight[in_flight] = stage_time_lower_bounds(no_sync, states + in_flight * forward, budget_bytes,
                                                              lambdas)
    receive_floor, send_floor = boundary_floors_s(costs, allowed)
    return [with_boundary_floors(by_in_flight[_rounded_down(k)], j, costs.pp, receive_floor, send_floor)
            for j, k in enumerate(costs.in_flight)]


def shared_stage_bound_tables(cache: dict, costs: StageCosts, allowed: np.ndarray, budget_bytes: float
                              ) -> list[np.ndarray]:
    """`stage_bound_tables`, kept in `cache` by all they depend on: the strategy tables and the mask (by identity;
    the entry holds them, so no other object takes their ids while it lives), the budget, P and the stages'
    in-flight micro-batches — the micro-batch count m enters only through those, so the settings of a sweep with
    m ≥ P share one."""
    key = (id(costs.tables), id(allowed), budget_bytes, costs.pp, tuple(costs.in_flight))
    if key not in cache:
        cache[key] = (costs.tables, allowed, stage_bound_tables(costs, allowed, budget_bytes))
    return cache[key][2]


def memory_aware_throughput_bound(costs: StageCosts, allowed: np.ndarray, budget_bytes: float,
                                  stage_bounds: list[np.ndarray] | None = None) -> float:
    """B / T_lower for the setting of `costs` among the strategies `allowed` per layer (see the module); 0 when no
    partition can fit. `stage_bounds`: its `stage_bound_tables`, where known."""
    tables, pp, count = costs.tables, costs.pp, costs.num_micro_batches
    if costs.virtual_stages != 1:  # interleaved stages hold several chunks each: not this model
        return np.inf
    if stage_bounds is None:
        stage_bounds = stage_bound_tables(costs, allowed, budget_bytes)
    slowest, stages = partition_bounds(stage_bounds)
    if not np.isfinite(slowest):  # no partition fits (checked before (m − 1) · inf, NaN for m = 1)
        return 0.0
    sync = np.where(allowed, tables.time_s - tables.time_no_grad_sync_s, np.inf).min(axis=0)
    lower = max((count - 1) * slowest + stages + max(sync.sum() / pp, sync.max()),
                stage_average_lower_s(costs, allowed, budget_bytes))
    if not np.isfinite(lower):
        return 0.0
    return tables.micro_batch * count / lower * (1 + BOUND_SLACK) if lower > 0 else np.inf


def stage_average_lower_s(costs: StageCosts, allowed: np.ndarray, budget_bytes: float) -> float:
    """A second lower bound of Eq. (9) that trades each layer's compute, synchronisation and optimizer step against
    its memory jointly (the bound above takes the synchronisation's least apart from the memory the choice needs: a
    data-parallel layer's short compute beside a tensor-parallel layer's short all-reduce). Each maximum of Eq. (9)
    is at least the stages' average,

        T ≥ Σ_j [w · N_j + (S_j + U_j) / P],   w = 1 + (m − 1) / P,

    with S_j and U_j the sums over its layers of the synchronisation extra and the optimizer step (a tied weight
    counted once: `least_optimizer_parameters`), so each stage's term is bounded under its memory like LB_j
    (`stage_time_lower_bounds` on the per-layer cost w · c_no_sync + (c_sync + c_step) / P, its boundary floors
    counted w times) and the partition DP takes the least sum. For P = 1 it is Eq. (9) itself: m · N + S + U.

    Computed for P = 1 and for GPipe (0 otherwise: valid, only looser). Its tables depend on m, so a 1F1B sweep
    cannot share them across micro-batch counts as it shares LB_j's; with them, GPT-3 65B's sweep on 64 H100s
    searched the same 7 settings in 1.49 s instead of 1.28 s (`search_speed.py --sections 2`, 2026-12-07), and the
    paper grid was no faster. GPipe's (m in-flight) tables are per m anyway: its grid's base searches 22.7 → 6.7 s."""
    tables, pp, count = costs.tables, costs.pp, costs.num_micro_batches
    if pp > 1 and costs.schedule != "gpipe":
        return 0.0
    weight = 1 + (count - 1) / pp
    per_layer = np.where(allowed, weight * tables.time_no_grad_sync_s + (
        tables.time_s - tables.time_no_grad_sync_s
        + least_optimizer_parameters(costs) * tables.optimizer_step_s_per_parameter) / pp, np.inf)
    states, forward = least_state_bytes(costs), tables.forward_memory_bytes
    receive_floor, send_floor = boundary_floors_s(costs, allowed)
    by_in_flight: dict[float, np.ndarray] = {}
    tables_by_stage = []
    for stage_index, in_flight in enumerate(costs.in_flight):
        k = _rounded_down(in_flight)
        if k not in by_in_flight:
            memory = states + k * forward
            by_in_flight[k] = stage_time_lower_bounds(per_layer, memory, budget_bytes,
                                                      lambda_grid(*trade_rates(per_layer, memory)))
        tables_by_stage.append(with_boundary_floors(by_in_flight[k], stage_index, pp, weight * receive_floor,
                                                    weight * send_floor))
    return float(partition_tables(tables_by_stage)[1][-1, -1])


def fill_s(micro_batches: float, slowest_s: np.ndarray) -> np.ndarray:
    """(m − 1) · the slowest stage's N, inf where no stage can fit (`slowest_s` inf), also for m = 1 (0 · inf)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(slowest_s), np.inf, (micro_batches - 1) * slowest_s)


def _rounded_down(in_flight: float) -> float:
    """`in_flight` itself up to 4, else the power of two at or below it (a lower k keeps LB valid: see module)."""
    if in_flight <= 4:
        return float(in_flight)
    return float(2 ** int(np.floor(np.log2(in_flight))))
