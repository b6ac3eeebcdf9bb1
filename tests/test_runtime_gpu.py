"""The runtime on a CUDA device (NCCL): a one-device plan trains what the CPU reference trains. Skipped
without a GPU (CI has none); run where one is lent: `python -m pytest -m gpu tests/test_runtime_gpu.py`."""

import pytest

torch = pytest.importorskip("torch")

from runtime_reference import LEARNING_RATE, architecture, make_plan, reference_training  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _train_on_cuda(precision: str, steps: int):
    import torch.distributed as dist

    from gbmw.adapters.runtime.engine import AdamSettings, HybridEngine
    from gbmw.adapters.runtime.groups import GroupPool
    from gbmw.adapters.runtime.launch import init_distributed
    from gbmw.adapters.runtime.model import synthetic_batch

    context = init_distributed()
    assert context.backend == "nccl" and context.device.startswith("cuda")
    try:
        arch = architecture("gpt-tiny")
        plan = make_plan("gpt-tiny", 1, ["single", "single+ckpt", "single", "single+ckpt", "single", "single"], [6],
                         8, 2)
        if precision != "fp32":
            from dataclasses import replace

            plan = replace(plan, precision=precision)
        engine = HybridEngine(plan, arch, GroupPool(plan), context.device, adam=AdamSettings(LEARNING_RATE))
        losses = [engine.train_step(synthetic_batch(arch, 8, step, 0)) for step in range(steps)]
        weights = {f"{layer}.{key}": tensor for layer, tensors in engine.full_state().items()
                   for key, tensor in tensors.items() if "#" not in key}
        return losses, weights
    finally:
        dist.destroy_process_group()


def test_fp32_on_cuda_matches_cpu_reference():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    losses, weights = _train_on_cuda("fp32", 3)
    expected_losses, expected = reference_training("gpt-tiny", 8, 3)
    assert losses == pytest.approx(expected_losses, abs=1e-5)
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0.0, atol=1e-4, msg=lambda text: f"{name}: {text}")


def test_bf16_autocast_on_cuda_trains():
    losses, _ = _train_on_cuda("bf16", 3)
    expected_losses, _ = reference_training("gpt-tiny", 8, 3)
    assert losses == pytest.approx(expected_losses, abs=2e-2)  # bf16 matmuls: ~3 significant digits


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8,
                    reason="TF32 tensor cores: Ampere and later")
def test_tf32_on_cuda_trains_with_the_switch_put_back():
    torch.backends.cuda.matmul.allow_tf32 = False
    losses, _ = _train_on_cuda("tf32", 3)
    expected_losses, _ = reference_training("gpt-tiny", 8, 3)
    assert losses == pytest.approx(expected_losses, abs=1e-2)  # TF32 keeps 10 mantissa bits: finer than bf16's 7
    assert torch.backends.cuda.matmul.allow_tf32 is False


def test_validate_reports_the_device_peak_beside_the_estimate():
    import torch.distributed as dist

    from gbmw.adapters.profile.validate import PlanRun, measure_plans, predicted_terms
    from gbmw.adapters.runtime.launch import init_distributed
    from gbmw.specs.jobs import load_job

    context = init_distributed()
    try:
        job = load_job("gpt-tiny_cpu-x4")
        plan = make_plan("gpt-tiny", 1, ["single", "single+ckpt", "single", "single+ckpt", "single", "single"], [6],
                         8, 2)
        run = PlanRun(plan, job.model.architecture, context.device)
        measure_plans([run], steps=1, warmup=1, min_seconds=0.0)
        (peak,) = run.device_peak_per_stage
        assert peak > 0
        print("estimated peak", predicted_terms(job, plan)[3][0], "max_memory_allocated", peak)
    finally:
        dist.destroy_process_group()
