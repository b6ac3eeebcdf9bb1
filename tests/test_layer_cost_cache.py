"""gbmw.search.layer_cost_cache: searches of one job share its layer-cost tables, and nothing else does."""

import numpy as np
import pytest
from conftest import make_cluster

import gbmw.search.layer_cost_cache as cache
from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.stage_cost import strategy_tables
from gbmw.search.planner import Planner
from gbmw.space.spaces import search_space
from gbmw.specs.jobs import load_job

pytestmark = pytest.mark.unit

TABLES = ("time_s", "time_no_grad_sync_s", "forward_memory_bytes", "backward_memory_bytes", "model_state_bytes",
          "optimizer_parameters", "layout", "transition_fraction")


def _tables(job, cached: bool, micro_batch: int = 8):
    settings = CostSettings(job.cluster, job.precision)
    strategies = search_space("gbmw").strategies(job.cluster, 1)
    comm = CommModel(job.cluster)
    if cached:
        return cache.cached_strategy_tables(cache.cost_key(job.model, settings), job.model, strategies, micro_batch,
                                            settings, comm)
    return strategy_tables(job.model, strategies, micro_batch, settings, comm)


def test_cached_tables_are_the_fresh_ones():
    job = load_job("bert-huge-32_rtx-titan-x8")
    first, again, fresh = _tables(job, True), _tables(job, True), _tables(job, False)
    for name in TABLES:
        assert np.array_equal(getattr(first, name), getattr(fresh, name)), name
        assert np.array_equal(getattr(again, name), getattr(fresh, name)), name


def test_another_model_or_cluster_never_meets_an_entry():
    job = load_job("bert-huge-32_rtx-titan-x8")
    _tables(job, True)
    deeper = job.model.model_copy(update={"layers": job.model.layers + job.model.layers[-1:]})
    settings = CostSettings(job.cluster, job.precision)
    assert cache.cost_key(deeper, settings) != cache.cost_key(job.model, settings)
    slower = make_cluster(nodes=1, devices_per_node=8, intra_gb_per_s=1.0)
    assert cache.cost_key(job.model, CostSettings(slower, job.precision)) != cache.cost_key(job.model, settings)
    assert cache.cost_key(job.model, CostSettings(job.cluster, "fp16")) != cache.cost_key(job.model, settings)


def test_the_cache_stays_bounded(monkeypatch):
    monkeypatch.setattr(cache, "MAX_ENTRIES", 5)
    monkeypatch.setattr(cache, "_entries", type(cache._entries)())
    _tables(load_job("bert-huge-32_rtx-titan-x8"), True)
    assert len(cache._entries) == 5


def test_a_search_under_another_budget_gives_the_plan_a_fresh_process_would():
    """The cache changes no plan: the same search before and after other searches filled it."""
    cache._entries.clear()
    job = load_job("bert-huge-32_rtx-titan-x8", memory_budget="12GiB")
    alone = Planner(job, batch=64, max_pp=2, explain_failure=False).run()
    Planner(load_job("bert-huge-32_rtx-titan-x8", memory_budget="8GiB"), batch=64, max_pp=2,
            explain_failure=False).run()
    again = Planner(job, batch=64, max_pp=2, explain_failure=False).run()
    assert again.estimate.samples_per_s == alone.estimate.samples_per_s
    assert again.strategies == alone.strategies and again.partition == alone.partition
