"""Plain DP all-reduces gradients in flat buckets of bounded size (gbmw.adapters.runtime.sharding), so the copy it
makes stays within the optimizer step's reserve; training still equals single-process training."""

import pytest
from dist_fixture import run_distributed

pytestmark = [pytest.mark.torch]


def test_buckets_are_consecutive_runs_within_the_cap():
    import torch

    from gbmw.adapters.runtime.sharding import _buckets

    sizes = [3, 4, 9, 12, 1, 1, 5]
    tensors = [torch.zeros(size) for size in sizes]
    runs = _buckets(tensors, 8)
    assert [[t.numel() for t in run] for run in runs] == [[3, 4], [9], [12], [1, 1, 5]]
    assert [t for run in runs for t in run] == tensors  # every gradient once, in order


def _losses_with_small_buckets(rank, world_size):
    from runtime_reference import ADAM_EPS, LEARNING_RATE, architecture, make_plan

    from gbmw.adapters.runtime import sharding
    from gbmw.adapters.runtime.engine import AdamSettings, HybridEngine
    from gbmw.adapters.runtime.groups import GroupPool
    from gbmw.adapters.runtime.model import synthetic_batch

    sharding.ALLREDUCE_BUCKET_ELEMENTS = 5000  # gpt-tiny's blocks hold ~50k parameters: many buckets, some alone
    arch = architecture("gpt-tiny")
    plan = make_plan("gpt-tiny", world_size, ["dp2", "dp2", "dp2+ckpt", "tp2", "dp2", "dp2"], [6], 8, 2)
    engine = HybridEngine(plan, arch, GroupPool(plan), "cpu", adam=AdamSettings(LEARNING_RATE, eps=ADAM_EPS))
    return [engine.train_step(synthetic_batch(arch, 8, step, 0)) for step in range(3)]


@pytest.mark.dist
def test_bucketed_all_reduce_trains_as_the_reference():
    from runtime_reference import reference_training

    expected, _ = reference_training("gpt-tiny", 8, 3)
    for losses in run_distributed(2, _losses_with_small_buckets, timeout_s=180):
        # fp32: only the summation order differs; a bucket left unreduced or reduced twice doubles or halves a
        # gradient, which Adam's first steps turn into loss changes far above this
        assert losses == pytest.approx(expected, rel=1e-5)
