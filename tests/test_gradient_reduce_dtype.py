"""Gradients reduced in bf16 (megatron-core's `--grad-reduce-in-bf16`, NeMo's `optim.grad_sync_dtype: bf16`):
Megatron keeps 2-byte gradients instead of fp32 main gradients — the model states and the data-parallel gradient
traffic by exact arithmetic — and the field's one-line refusals and Megatron round trip (the YAML:
tests/test_plan_launch_settings.py)."""

from __future__ import annotations

import dataclasses

import pytest

import gbmw
from gbmw.adapters.megatron import megatron_args_to_plan, plan_to_megatron_args
from gbmw.cost.estimate import estimate_plan
from gbmw.cost.model_states import StateBytes, state_bytes
from gbmw.errors import GbmwError, PlanError, SpecError

BF16_JOB = ("model: gpt3-15b\ncluster: h100-80g-x64\nprecision: {precision}\ngradient_reduce_dtype: bf16\n"
            "global_batch: 512\n")


def _job(tmp_path, precision="bf16", name="gpt3-15b-bf16grads_h100-80g-x64"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(BF16_JOB.format(precision=precision))
    return gbmw.load_job(path)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_megatron_keeps_two_byte_gradients_and_nothing_else_changes(precision):
    fp32 = state_bytes("megatron", precision, "adam")
    assert fp32 == StateBytes(2, 4, 12)  # bf16 weights, fp32 main gradients, fp32 master weights and moments
    assert state_bytes("megatron", precision, "adam", "bf16") == StateBytes(2, 2, 12)


def test_a_plan_holds_two_bytes_less_per_parameter_and_reduces_half_the_bytes(tmp_path):
    job = _job(tmp_path)
    bf16 = gbmw.uniform_plan(job, "tp=4,pp=2,zero=1,sp=on,micro=1,target=megatron-core")
    assert bf16.gradient_reduce_dtype == "bf16"
    fp32_job = job.model_copy(update={"gradient_reduce_dtype": "fp32"})
    fp32 = dataclasses.replace(bf16, gradient_reduce_dtype="fp32", estimate=None)
    with_bf16, with_fp32 = estimate_plan(job, bf16), estimate_plan(fp32_job, fp32)
    for stage, (first, count) in enumerate(fp32.stage_bounds):
        # TP-local parameters of the stage: under ZeRO-1 the gradients stay whole, so exactly 2 bytes each are saved
        layers = job.model.layers[first:first + count]
        parameters = sum(layer.parameter_count - layer.tp_split_parameter_count * (1 - 1 / 4) for layer in layers)
        saved = with_fp32.stage_model_state_bytes[stage] - with_bf16.stage_model_state_bytes[stage]
        assert saved == pytest.approx(2 * parameters, rel=1e-9)  # catches any other byte count (fp32's 4, ZeRO-2's /d)
    assert with_bf16.iteration_time_s < with_fp32.iteration_time_s  # half the reduce-scatter bytes


def test_job_and_plan_refuse_bf16_gradients_of_a_model_that_is_not_bf16(tmp_path):
    with pytest.raises(SpecError, match=r"gradient_reduce_dtype bf16 reduces the gradients of a bf16 model \(precision "
                                        r"bf16 or fp8\), but the precision is fp32; set precision: bf16 or drop "
                                        r"gradient_reduce_dtype$"):
        _job(tmp_path, "fp32")
    plan = gbmw.uniform_plan(_job(tmp_path), "tp=4,pp=2,zero=1,sp=on,micro=1,target=megatron-core")
    with pytest.raises(PlanError, match="^invalid plan: gradient_reduce_dtype bf16 reduces the gradients of a bf16"):
        dataclasses.replace(plan, precision="fp16")
    with pytest.raises(PlanError, match="^invalid plan: gradient_reduce_dtype 'fp16' is not one of"):
        dataclasses.replace(plan, gradient_reduce_dtype="fp16")


@pytest.mark.parametrize("target", ["runtime", "deepspeed", "megatron-deepspeed"])
def test_targets_that_keep_fp32_gradients_refuse_in_one_line(tmp_path, target):
    job = _job(tmp_path)
    with pytest.raises(GbmwError, match=f"^gradient_reduce_dtype bf16: --target {target} reduces gradients in fp32; "
                                        "plan it for --target megatron-core, or drop the job's gradient_reduce_dtype$"):
        gbmw.Planner(job, target=target, explain_failure=False).run()


def test_megatron_emits_grad_reduce_in_bf16_and_reads_it_back(tmp_path):
    job = _job(tmp_path)
    plan = gbmw.uniform_plan(job, "tp=4,pp=2,zero=1,sp=on,micro=1,target=megatron-core")
    args = plan_to_megatron_args(plan, job, "megatron-core")
    assert args.count("--grad-reduce-in-bf16") == 1
    assert megatron_args_to_plan(args, job, "megatron-core") == dataclasses.replace(plan, estimate=None)
    without = [arg for arg in args if arg != "--grad-reduce-in-bf16"]
    with pytest.raises(GbmwError, match="^Megatron arguments reduce gradients in fp32 \\(--grad-reduce-in-bf16 not "
                                        "given\\) but job gpt3-15b-bf16grads_h100-80g-x64 has gradient_reduce_dtype bf16$"):
        megatron_args_to_plan(without, job, "megatron-core")
