"""A stage's FSDP2 layers hold one reduce-scatter input at a time, as one FSDP2 root over the stage would
(gbmw.adapters.runtime.sharding.ReduceScatterInFlight), and training still equals single-process training."""

import pytest
from dist_fixture import run_distributed

pytestmark = [pytest.mark.torch, pytest.mark.dist]

STRATEGIES = ["sdp2", "sdp2", "z2dp2+ckpt", "sdp2", "z1dp2", "sdp2"]  # gpt-tiny: embedding, 4 blocks, head


class _CountingList(list):
    """The list FSDP2's layers append their reduce-scatter inputs to, recording the most held at once."""

    most_held = 0

    def append(self, item):
        super().append(item)
        self.most_held = max(self.most_held, len(self))


def _held_and_losses(rank, world_size):
    from runtime_reference import ADAM_EPS, LEARNING_RATE, architecture, make_plan

    from gbmw.adapters.runtime.engine import AdamSettings, HybridEngine
    from gbmw.adapters.runtime.groups import GroupPool
    from gbmw.adapters.runtime.model import synthetic_batch

    arch = architecture("gpt-tiny")
    plan = make_plan("gpt-tiny", world_size, STRATEGIES, [6], 8, 2)
    engine = HybridEngine(plan, arch, GroupPool(plan), "cpu", adam=AdamSettings(LEARNING_RATE, eps=ADAM_EPS))
    held = engine.reduce_scatter_in_flight.states = _CountingList()
    losses = [engine.train_step(synthetic_batch(arch, 8, step, 0)) for step in range(3)]
    return held.most_held, len(held), losses


def test_one_reduce_scatter_input_is_held_at_a_time():
    from runtime_reference import reference_training

    expected, _ = reference_training("gpt-tiny", 8, 3)
    for most_held, left, losses in run_distributed(2, _held_and_losses, timeout_s=180):
        # Five sharded layers reduce-scatter in each backward: per-layer FSDP2 roots held five buffers at its end
        # (and this list none: 0 here means the layers no longer share it); the end of a backward frees the last
        assert (most_held, left) == (1, 0)
        assert losses == pytest.approx(expected, rel=1e-5)  # fp32: rounding of summation order only
