"""The per-layer cost tables of one strategy, kept across the searches of one process.

A search builds `layer_costs` (gbmw.cost.layer_cost: c, O_f, O_b, O_ms of Eqs. (2)–(4) for every layer) for every
strategy of every pipeline degree and micro-batch size, those of one list and size at once (gbmw.cost.layer_cost_batch).
They depend on the model, the strategy, the micro-batch size and the cost settings (cluster, precision, optimizer,
framework, FP8 recipe) only — not on the memory budget, the batch, the variant or the target's partition rules — so
searches of the same job under other budgets, variants or targets (`gbmw compare`, the paper's grid in
benchmarks/search_speed.py, the smallest-budget bisection of a "nothing fits") reuse them. Entries are keyed by a digest of the model's and the cluster's full
contents, so an edited model or cluster never meets a stale entry; the oldest are dropped past `MAX_ENTRIES`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings, LayerCosts
from gbmw.cost.layer_cost_batch import layer_costs_of_strategies
from gbmw.cost.stage_cost import StrategyTables, strategy_tables
from gbmw.space.strategy import Strategy
from gbmw.specs.model_spec import ModelSpec

MAX_ENTRIES = 16384
"""Strategy × micro-batch entries kept (each a few arrays over the layers: a few MiB in all for a paper-grid model,
some hundreds for a 100-layer model with every entry full)."""

_entries: OrderedDict[tuple, LayerCosts] = OrderedDict()


def cost_key(model: ModelSpec, settings: CostSettings) -> tuple:
    """What a layer-cost table depends on besides the strategy and the micro-batch size."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(model.model_dump_json().encode())
    digest.update(settings.cluster.model_dump_json().encode())
    return (digest.hexdigest(), settings.precision, settings.optimizer, settings.framework, settings.fp8_recipe,
            settings.gradient_reduce_dtype, settings.adam_moments_dtype, settings.tp_comm_overlap)


def cached_strategy_tables(key: tuple, model: ModelSpec, strategies: list[Strategy], micro_batch: int,
                           settings: CostSettings, comm: CommModel) -> StrategyTables:
    """gbmw.cost.stage_cost.strategy_tables, with each strategy's `layer_costs` taken from the cache, the missing
    ones computed together (gbmw.cost.layer_cost_batch) and added to it (`key`: `cost_key(model, settings)`, computed
    once per search)."""
    found: dict[Strategy, LayerCosts] = {}
    for strategy in strategies:
        entry = _entries.get((key, strategy, micro_batch))
        if entry is not None:
            found[strategy] = entry
    missing = [strategy for strategy in dict.fromkeys(strategies) if strategy not in found]
    found.update(zip(missing, layer_costs_of_strategies(model, missing, micro_batch, settings, comm)))
    for strategy in dict.fromkeys(strategies):
        entry = (key, strategy, micro_batch)
        if entry in _entries:
            _entries.move_to_end(entry)
        else:
            _entries[entry] = found[strategy]
            if len(_entries) > MAX_ENTRIES:
                _entries.popitem(last=False)
    return strategy_tables(model, strategies, micro_batch, settings, comm, [found[s] for s in strategies])
