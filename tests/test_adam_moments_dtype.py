"""Adam's moments in bf16 (megatron-core's precision-aware optimizer: `--use-precision-aware-optimizer --exp-avg-dtype
bf16 --exp-avg-sq-dtype bf16`): Megatron keeps 8 bytes of optimizer state per parameter instead of 12 — the model
states by exact arithmetic — only under its distributed optimizer; and the field's one-line refusals and Megatron
round trip (the YAML: tests/test_plan_launch_settings.py)."""

from __future__ import annotations

import dataclasses

import pytest

import gbmw
from gbmw.adapters.megatron import megatron_args_to_plan, plan_to_megatron_args
from gbmw.cost.estimate import estimate_plan
from gbmw.cost.model_states import StateBytes, state_bytes
from gbmw.errors import GbmwError, PlanError, SpecError

MOMENTS_JOB = ("model: gpt3-15b\ncluster: h100-80g-x64\nprecision: {precision}\noptimizer: {optimizer}\n"
               "adam_moments_dtype: bf16\nglobal_batch: 512\n")
LAYOUT = "tp=4,pp=2,zero=1,sp=on,micro=1,target=megatron-core"


def _job(tmp_path, precision="bf16", optimizer="adam", name="gpt3-15b-bf16moments_h100-80g-x64"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(MOMENTS_JOB.format(precision=precision, optimizer=optimizer))
    return gbmw.load_job(path)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_megatron_keeps_two_byte_moments_and_nothing_else_changes(precision):
    assert state_bytes("megatron", precision, "adam") == StateBytes(2, 4, 12)  # fp32 main weights and two moments
    assert state_bytes("megatron", precision, "adam", adam_moments_dtype="bf16") == StateBytes(2, 4, 8)
    assert state_bytes("megatron", precision, "adam", "bf16", "bf16") == StateBytes(2, 2, 8)  # both fields at once
    assert state_bytes("megatron", precision, "sgd", adam_moments_dtype="bf16") == state_bytes("megatron", precision,
                                                                                               "sgd")


def test_a_plan_holds_four_bytes_less_per_parameter_over_the_optimizer_shards(tmp_path):
    job = _job(tmp_path)
    bf16 = gbmw.uniform_plan(job, LAYOUT)
    assert bf16.adam_moments_dtype == "bf16"
    fp32_job = job.model_copy(update={"adam_moments_dtype": "fp32"})
    fp32 = dataclasses.replace(bf16, adam_moments_dtype="fp32", estimate=None)
    with_bf16, with_fp32 = estimate_plan(job, bf16), estimate_plan(fp32_job, fp32)
    dp = 64 // (4 * 2)
    for stage, (first, count) in enumerate(fp32.stage_bounds):
        # TP-local parameters of the stage; ZeRO-1 shards the optimizer column over the data-parallel degree
        layers = job.model.layers[first:first + count]
        parameters = sum(layer.parameter_count - layer.tp_split_parameter_count * (1 - 1 / 4) for layer in layers)
        saved = with_fp32.stage_model_state_bytes[stage] - with_bf16.stage_model_state_bytes[stage]
        assert saved == pytest.approx(4 * parameters / dp, rel=1e-9)  # catches 2 bytes (one moment), no /dp, or more
    assert with_bf16.iteration_time_s < with_fp32.iteration_time_s  # the optimizer step moves fewer bytes


def test_job_and_plan_refuse_bf16_moments_without_adam_or_a_bf16_model(tmp_path):
    with pytest.raises(SpecError, match=r"adam_moments_dtype bf16 is megatron-core's precision-aware optimizer for a "
                                        r"bf16 model \(precision bf16 or fp8\), but the precision is fp32; set "
                                        r"precision: bf16 or drop adam_moments_dtype$"):
        _job(tmp_path, "fp32")
    with pytest.raises(SpecError, match=r"adam_moments_dtype bf16 keeps Adam's moments in bf16, but the optimizer is "
                                        r"sgd, which keeps none; set optimizer: adam or drop adam_moments_dtype$"):
        _job(tmp_path, optimizer="sgd")
    plan = gbmw.uniform_plan(_job(tmp_path), LAYOUT)
    with pytest.raises(PlanError, match="^invalid plan: adam_moments_dtype bf16 is megatron-core's precision-aware"):
        dataclasses.replace(plan, precision="fp16")
    with pytest.raises(PlanError, match="^invalid plan: adam_moments_dtype 'fp16' is not one of"):
        dataclasses.replace(plan, adam_moments_dtype="fp16")


@pytest.mark.parametrize("target", ["runtime", "deepspeed", "megatron-deepspeed"])
def test_targets_without_a_precision_aware_optimizer_refuse_in_one_line(tmp_path, target):
    with pytest.raises(GbmwError, match=f"^adam_moments_dtype bf16: --target {target} keeps Adam's moments in fp32; "
                                        "plan it for --target megatron-core, or drop the job's adam_moments_dtype$"):
        gbmw.Planner(_job(tmp_path), target=target, explain_failure=False).run()


def test_megatron_core_plans_it_under_the_distributed_optimizer_only(tmp_path):
    """Megatron refuses --use-precision-aware-optimizer without --use-distributed-optimizer: the search offers no
    layer plain data parallelism, and a hand-made plain-DP layout is refused in one line."""
    job = _job(tmp_path)
    plan = gbmw.Planner(job, target="megatron-core", explain_failure=False).run()
    assert plan.adam_moments_dtype == "bf16"
    assert all(strategy.degree("dp") == 1 for strategy in plan.strategies)
    plain = gbmw.uniform_plan(job.model_copy(update={"adam_moments_dtype": "fp32"}),
                              "tp=4,pp=2,zero=0,sp=on,micro=1,target=megatron-core")
    plain = dataclasses.replace(plain, adam_moments_dtype="bf16", estimate=None)
    with pytest.raises(PlanError, match=r"^megatron-core cannot run this plan: adam_moments_dtype bf16 needs "
                                        r"Megatron's distributed optimizer, but layers use plain data parallelism"):
        estimate_plan(job, plain)
    with pytest.raises(PlanError, match="^megatron-core cannot run this plan: adam_moments_dtype bf16 needs"):
        plan_to_megatron_args(plain, job, "megatron-core")


def test_megatron_emits_the_precision_aware_optimizer_and_reads_it_back(tmp_path):
    job = _job(tmp_path)
    plan = gbmw.uniform_plan(job, LAYOUT)
    args = plan_to_megatron_args(plan, job, "megatron-core")
    flags = ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    assert args[args.index(flags[0]):args.index(flags[0]) + 5] == flags
    assert args.count("--use-distributed-optimizer") == 1
    assert megatron_args_to_plan(args, job, "megatron-core") == dataclasses.replace(plan, estimate=None)
    without = [arg for arg in args if arg not in ("--use-precision-aware-optimizer", "--exp-avg-dtype",
                                                  "--exp-avg-sq-dtype", "bf16")]
    with pytest.raises(GbmwError, match="^Megatron arguments keep Adam's moments in fp32 but job "
                                        "gpt3-15b-bf16moments_h100-80g-x64 has adam_moments_dtype bf16$"):
        megatron_args_to_plan(without, job, "megatron-core")
    no_distributed = [arg for arg in args if arg != "--use-distributed-optimizer"]
    with pytest.raises(GbmwError, match="--use-precision-aware-optimizer without --use-distributed-optimizer"):
        megatron_args_to_plan(no_distributed, job, "megatron-core")
    mixed = args[:args.index("--exp-avg-sq-dtype") + 1] + ["fp32"] + args[args.index("--exp-avg-sq-dtype") + 2:]
    with pytest.raises(GbmwError, match="gbmw prices both moments in fp32 or both in bf16$"):
        megatron_args_to_plan(mixed, job, "megatron-core")
    for flag, value in (("--main-params-dtype", "fp16"), ("--main-grads-dtype", "bf16")):
        with pytest.raises(GbmwError, match=f"^Megatron arguments: {flag} {value}: gbmw prices the precision-aware"):
            megatron_args_to_plan(args + [flag, value], job, "megatron-core")
    kept = megatron_args_to_plan(args + ["--main-params-dtype", "fp32"], job, "megatron-core")
    assert kept.adam_moments_dtype == "bf16"
