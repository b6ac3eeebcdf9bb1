"""The least time a stage boundary adds to a stage's no-sync time: the floor gbmw.search.bounds.stage_knapsack_bound adds to each
stage's lower bound, so that the bound counts the pipeline's point-to-point traffic.

gbmw.cost.stage_cost.stage_estimate adds to the no-sync time N_j of stage j on layers [a, c) (one model chunk per
device), as the sending device,

    send(c, s_{c−1})   when j < P − 1: the output to stage j + 1 and its gradient back, in the layout of layer c − 1,
    send(a, s_a)       when j > 0: the input's gradient back to stage j − 1, in the layout of layer a

(`StageCosts.boundary_send_s`; gbmw.search.exact.whole_plan_search adds the same terms). Whatever strategies the plan picks, each
is at least its least value over the strategies allowed at that layer,

    send_floor[c] = min_{s allowed at c − 1} send(c, s),       receive_floor[a] = min_{s allowed at a} send(a, s),

so N_j ≥ Σ_{l∈[a,c)} c_no_sync(s_l, l) + [j < P − 1] · send_floor[c] + [j > 0] · receive_floor[a], and any lower bound
of the first sum (gbmw.search.bounds.stage_knapsack_bound's LB_j) stays a lower bound of N_j with these floors added.

**Rounding.** LB_j + floors is two more float additions than LB_j and stage_estimate adds the same terms in another
order: each side can move by an ulp of the result per addition, so 8 ulps of |LB_j| + floors are subtracted (LB_j
itself already carries its own error bound).
"""

from __future__ import annotations

import numpy as np

_EPSILON = float(np.finfo(np.float64).eps)


def boundary_floors_s(costs, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(receive_floor[a], send_floor[c]) for a, c in 0 … L (see the module; 0 where no stage boundary can be: the
    receive at L, the send at 0 and L), among the strategies `allowed` per layer."""
    tables, layers = costs.tables, allowed.shape[1]
    pairs = np.stack([tables.data_parallel, tables.tp, tables.boundary_shards], axis=1)
    unique_pairs, strategy_pair = np.unique(pairs, axis=0, return_inverse=True)
    strategy_pair = strategy_pair.reshape(-1)
    by_bytes: dict[float, np.ndarray] = {}
    # [pair, layer]: the send of each layer's input per (DP, TP, shards) triple, computed once per distinct message size
    per_pair = np.empty((unique_pairs.shape[0], layers))
    for layer in range(layers):
        message = float(costs.boundary_bytes[layer] + costs.side_bytes[layer])
        if message not in by_bytes:
            by_bytes[message] = np.atleast_1d(costs.boundary_send_s(layer, unique_pairs[:, 0], unique_pairs[:, 1],
                                                                    unique_pairs[:, 2]))
        per_pair[:, layer] = by_bytes[message]
    if not allowed.any(axis=0).all():
        raise ValueError("boundary_floors_s: a layer allows no strategy")
    per_strategy = per_pair[strategy_pair]
    # the least over the strategies allowed at the layer (receive) or at the layer before it (send): a minimum,
    # the same number whichever way it is taken
    receive, send = np.zeros(layers + 1), np.zeros(layers + 1)
    receive[:layers] = np.where(allowed, per_strategy, np.inf).min(axis=0)
    send[1:layers] = np.where(allowed[:, :-1], per_strategy[:, 1:], np.inf).min(axis=0)
    return receive, send


def with_boundary_floors(bounds: np.ndarray, stage_index: int, pp: int, receive_floor_s: np.ndarray,
                         send_floor_s: np.ndarray) -> np.ndarray:
    """Stage `stage_index`'s [a, c] table of lower bounds (as gbmw.search.bounds.stage_knapsack_bound) with the floors of its
    boundaries added (see the module); ±inf entries stay as they are."""
    floors = (receive_floor_s[:, None] * (stage_index > 0)
              + send_floor_s[None, :] * (stage_index < pp - 1))
    with np.errstate(invalid="ignore"):
        raised = bounds + floors
        raised = raised - 8 * _EPSILON * (np.abs(bounds) + floors)
    return np.where(np.isfinite(bounds), raised, bounds)
