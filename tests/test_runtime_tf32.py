"""gbmw's runtime under precision tf32: torch's TF32 switch on during a tf32 plan's steps and only then (put back
after), and on CPU processes — where matmuls have no TF32 — the same training as the single-process fp32 reference."""

import contextlib

import pytest

torch = pytest.importorskip("torch")

from dist_fixture import run_distributed  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("before", [False, True])
def test_the_switch_follows_the_plan_and_is_put_back(before):
    from gbmw.adapters.runtime.matmul_precision import matmul_precision

    torch.backends.cuda.matmul.allow_tf32 = before
    try:
        with matmul_precision("tf32"):
            assert torch.backends.cuda.matmul.allow_tf32 is True
        assert torch.backends.cuda.matmul.allow_tf32 is before
        with matmul_precision("fp32"):
            assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cuda.matmul.allow_tf32 is before
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


class _SwitchProbe:
    """An engine observer that records torch's TF32 switch as each micro-batch's forward runs."""

    def __init__(self):
        self.seen: list[bool] = []

    def forward_context(self, index):
        self.seen.append(torch.backends.cuda.matmul.allow_tf32)
        return contextlib.nullcontext()

    def backward_finished(self, index):
        pass

    def step_finished(self):
        pass


def _tf32_training(rank, world_size):
    from dataclasses import replace

    from runtime_reference import ADAM_EPS, LEARNING_RATE, architecture, make_plan

    from gbmw.adapters.runtime.engine import AdamSettings, HybridEngine
    from gbmw.adapters.runtime.groups import GroupPool
    from gbmw.adapters.runtime.model import synthetic_batch

    arch = architecture("gpt-tiny")
    plan = replace(make_plan("gpt-tiny", world_size, ["tp2", "tp2+ckpt", "sdp2", "tp2", "z1dp2", "tp2"], [6], 8, 2),
                   precision="tf32")
    engine = HybridEngine(plan, arch, GroupPool(plan), "cpu", adam=AdamSettings(LEARNING_RATE, eps=ADAM_EPS))
    engine.observer = probe = _SwitchProbe()
    losses = [engine.train_step(synthetic_batch(arch, 8, engine.step, 0)) for _ in range(3)]
    return {"losses": losses, "switch_in_steps": probe.seen, "switch_after": torch.backends.cuda.matmul.allow_tf32}


@pytest.mark.dist
def test_a_tf32_plan_trains_as_the_fp32_reference_on_cpu():
    from runtime_reference import reference_training

    expected, _ = reference_training("gpt-tiny", 8, 3)
    for result in run_distributed(2, _tf32_training, timeout_s=180):
        # fp32 arithmetic on both sides (a CPU has no TF32): the equivalence tests' loss tolerance, 5e-6, which a lost
        # micro-batch, a wrong gradient scale or 16-bit storage would exceed by orders of magnitude
        assert result["losses"] == pytest.approx(expected, rel=0.0, abs=5e-6)
        assert result["switch_in_steps"] and all(result["switch_in_steps"])
        assert result["switch_after"] is False
