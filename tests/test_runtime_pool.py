"""The group pool on real processes (gloo on CPU): every group of a mixed plan exists and reduces correctly."""

import pytest
from dist_fixture import run_distributed

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.dist


def _reduce_over_every_group(rank, world_size, names, partition):
    """Every group this rank belongs to: (its ranks, the sum of the ranks' numbers all-reduced over the group), and
    what arrived from the previous pipeline stage."""
    import torch.distributed as dist

    from gbmw.adapters.runtime.groups import GroupPool
    from gbmw.plan import plan_from_strategy_names
    from gbmw.specs.jobs import load_job

    job = load_job("bert-huge-32_rtx-titan-x8")
    model = job.model.model_copy(update={"layers": job.model.layers[:len(names)]})
    plan = plan_from_strategy_names(model, world_size, names, partition, 8, 2)
    pool = GroupPool(plan)
    first, end = plan.stage_bounds[pool.layout.stage_of(rank)]
    reduced = []
    for strategy in dict.fromkeys(plan.strategies[first:end]):  # the same order on every rank
        for ranks, group in ((pool.layout.tensor_group(rank, strategy), pool.tensor_group(strategy)),
                             (pool.layout.data_group(rank, strategy), pool.data_group(strategy))):
            value = torch.tensor([float(rank)])
            if group is not None:
                dist.all_reduce(value, group=group)
            reduced.append((list(ranks), value.item()))
    following = pool.layout.next_stage_rank(rank)
    if following is not None:
        dist.send(torch.tensor([float(rank)]), following)
    previous, received = pool.layout.previous_stage_rank(rank), torch.zeros(1)
    if previous is not None:
        dist.recv(received, previous)
    return {"reduced": reduced, "stage_size": pool.layout.stage_size, "received": received.item()}


@pytest.mark.parametrize("names, partition", [
    (["tp2-dp2", "dp4", "sdp4+ckpt", "dp2-tp2"], [4]),
    (["tp2", "dp2", "sdp2", "tp2+ckpt"], [2, 2]),
])
def test_group_pool_on_four_processes(names, partition):
    for rank, result in enumerate(run_distributed(4, _reduce_over_every_group, names, partition)):
        stage_first = rank // result["stage_size"] * result["stage_size"]
        for ranks, value in result["reduced"]:
            assert rank in ranks and value == sum(ranks), (rank, ranks, value)
            assert all(stage_first <= member < stage_first + result["stage_size"] for member in ranks)
        if rank >= result["stage_size"]:  # every stage after the first receives from the same local rank before it
            assert result["received"] == rank - result["stage_size"]


def _wrong_world(rank, world_size):
    from gbmw.adapters.runtime.groups import GroupPool
    from gbmw.errors import PlanError
    from gbmw.plan import plan_from_strategy_names
    from gbmw.specs.jobs import load_job

    job = load_job("bert-huge-32_rtx-titan-x8")
    model = job.model.model_copy(update={"layers": job.model.layers[:2]})
    plan = plan_from_strategy_names(model, 4, ["dp4", "dp4"], [2], 8, 2)
    with pytest.raises(PlanError, match="the plan is for 4 devices but 2 processes were launched"):
        GroupPool(plan)


def test_group_pool_refuses_another_world_size():
    run_distributed(2, _wrong_world)
