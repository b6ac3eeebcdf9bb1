"""Megatron adapter: golden argument lists, plan → args → plan round trips, megatron-core's own
validation of the configs, refusals with the target's reasons (gbmw.space.targets), the micro-batch arithmetic.

Regenerate the golden files after an intended change with
    GBMW_UPDATE_GOLDEN=1 python -m pytest tests/test_megatron_adapter.py
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from golden import check_golden

import gbmw
from gbmw.adapters.megatron import (TARGETS, launch_line, megatron_args_to_plan, megatron_blocks_per_stage, plan_target,
                                    plan_to_megatron_args, plan_to_megatron_core_configs)
from gbmw.errors import GbmwError, PlanError
from gbmw.plan import Plan, plan_from_strategy_names
from gbmw.space.stock_partitions import megatron_partition
from gbmw.space.strategy import Strategy
from gbmw.space.targets import get_target

GOLDEN_DIR = Path(__file__).parent / "golden" / "megatron"
UNEVEN_39B = "uneven:tp8-z1dp2:24,26:1536:768"
"""gpt3-39b on 32 A100s as Planner(job with a 40GiB budget, target="megatron-core") plans it:
tp8-z1dp2 everywhere, 23 blocks (+ embedding) on stage 0 and 25 (+ head) on stage 1."""

# name: (job, plan (a --uniform config, or uneven:STRATEGY:PARTITION:GLOBAL:MICRO_BATCHES), target)
CASES = {
    "gpt3-15b_megatron-core_tp8-pp2-zero1-ckpt": ("gpt3-15b_a100-80g-x32", "tp=8,pp=2,zero=1,ckpt=full,micro=1",
                                                  "megatron-core"),
    "gpt3-39b_megatron-deepspeed_tp8-pp2-zero1-ckpt": ("gpt3-39b_a100-80g-x32", "tp=8,pp=2,zero=1,ckpt=full,micro=1",
                                                       "megatron-deepspeed"),
    "gpt3-65b_megatron-lm_tp4-pp4-ckpt-micro2": ("gpt3-65b_a100-80g-x32", "tp=4,pp=4,zero=0,ckpt=full,micro=2",
                                                 "megatron-lm"),
    "gpt3-15b_megatron-deepspeed_tp2-zero3": ("gpt3-15b_a100-80g-x32", "tp=2,pp=1,zero=3,ckpt=none,micro=4",
                                              "megatron-deepspeed"),
    "gpt3-39b_megatron-core_uneven-first-last": ("gpt3-39b_a100-80g-x32", UNEVEN_39B, "megatron-core"),
    "gpt3-39b_megatron-core_tp8-pp2-zero1-sp-selective": ("gpt3-39b_a100-80g-x32",
                                                          "tp=8,pp=2,zero=1,ckpt=selective,sp=on,micro=1,target=megatron-core",
                                                          "megatron-core"),
    "gpt3-15b_megatron-deepspeed_tp4-pp2-zero1-sp-selective": ("gpt3-15b_a100-80g-x32",
                                                               "tp=4,pp=2,zero=1,ckpt=selective,sp=on,micro=1,target=megatron-deepspeed",
                                                               "megatron-deepspeed"),
}
EXTRA_ROUND_TRIPS = {
    "llama-7b_megatron-core_tp4-pp4": ("llama-7b_a100-80g-x32", "tp=4,pp=4,zero=1,ckpt=full,micro=1", "megatron-core"),
    "llama-7b_megatron-deepspeed_tp2-pp2": ("llama-7b_a100-80g-x32", "tp=2,pp=2,zero=1,ckpt=none,micro=2",
                                            "megatron-deepspeed"),
    "gpt3-15b_megatron-core_uneven-pp4": ("gpt3-15b_a100-80g-x32", "uneven:tp4-dp2+ckpt:11,13,13,13:1024:512",
                                          "megatron-core"),
    "llama-7b_single-node_dp8": ("llama-7b_a100-80g-x8", "tp=1,pp=1,zero=0,ckpt=none,micro=1", "megatron-core"),
    "llama-7b_megatron-core_tp4-pp2-sp-full": ("llama-7b_a100-80g-x32", "tp=4,pp=2,zero=1,ckpt=full,sp=on,micro=1,target=megatron-core",
                                               "megatron-core"),
    "deepseek-v2-lite_megatron-core_tp2-ep4-sp": ("deepseek-v2-lite_h100-80g-x64",
                                                  "tp=2,pp=1,zero=1,ep=4,sp=on,micro=1,target=megatron-core", "megatron-core"),
    "gpt3-15b_megatron-deepspeed_tp8-sp": ("gpt3-15b_a100-80g-x32", "tp=8,pp=1,zero=1,ckpt=none,sp=on,micro=1,target=megatron-deepspeed",
                                           "megatron-deepspeed"),
}
ALL_CASES = {**CASES, **EXTRA_ROUND_TRIPS}

_jobs: dict[str, gbmw.JobSpec] = {}


def job_named(name: str) -> gbmw.JobSpec:
    if name not in _jobs:
        _jobs[name] = gbmw.load_job(name)
    return _jobs[name]


def make_plan(job: gbmw.JobSpec, description: str) -> Plan:
    """A uniform plan from a --uniform config, or an uneven first/last plan by hand."""
    if not description.startswith("uneven:"):
        return gbmw.uniform_plan(job, description)
    _, name, partition, global_batch, micro_batches = description.split(":")
    block = Strategy.parse(name)
    names = [block.name if layer.kind == "decoder" else block.with_ckpt(False).name for layer in job.model.layers]
    return plan_from_strategy_names(job.model, job.cluster.num_devices, names,
                                    [int(count) for count in partition.split(",")], int(global_batch),
                                    int(micro_batches), cluster=job.cluster.name, target="megatron-core")


def case(name: str) -> tuple[gbmw.JobSpec, Plan, str]:
    job_name, description, target = ALL_CASES[name]
    job = job_named(job_name)
    return job, make_plan(job, description), target


def comparable(plan: Plan, target: str) -> Plan:
    """The plan as the arguments describe it: no estimate, planned for the target (provenance is not compared)."""
    return dataclasses.replace(plan, estimate=None, target=plan_target(target))


def render(args: list[str]) -> list[str]:
    """One flag with its values per line."""
    lines: list[str] = []
    for token in args:
        if token.startswith("--") or not lines:
            lines.append(token)
        else:
            lines[-1] += " " + token
    return lines


def values(args: list[str]) -> dict[str, str | None]:
    result: dict[str, str | None] = {}
    for line in render(args):
        flag, _, value = line.partition(" ")
        result[flag] = value or None
    return result


# ------------------------------------------------------------------------------------------ golden


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_arguments(name):
    job, plan, target = case(name)
    job_name, description, _ = CASES[name]
    text = "\n".join([
        "# gbmw plan -> Megatron arguments (regenerate: GBMW_UPDATE_GOLDEN=1 pytest tests/test_megatron_adapter.py)",
        f"# job {job_name}, target {target}, plan {description}",
        f"# strategies {plan.strategies[1].name} (blocks), partition {list(plan.partition)}",
        *render(plan_to_megatron_args(plan, job, target)),
        "# launch",
        launch_line(plan, job, target=target),
    ]) + "\n"
    check_golden(GOLDEN_DIR / f"{name}.txt", text)


def test_uneven_golden_plan_has_first_and_last_flags():
    job, plan, target = case("gpt3-39b_megatron-core_uneven-first-last")
    given = values(plan_to_megatron_args(plan, job, target))
    assert plan.partition != tuple(megatron_partition(job.model, 2))
    assert (given["--decoder-first-pipeline-num-layers"], given["--decoder-last-pipeline-num-layers"]) == ("23", "25")
    assert given["--num-layers"] == "48"  # blocks only: the embedding and head are not counted


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_plan_args_plan_round_trip(name):
    job, plan, target = case(name)
    again = megatron_args_to_plan(plan_to_megatron_args(plan, job, target), job, target)
    assert again == comparable(plan, target)
    assert plan_to_megatron_args(again, job, target) == plan_to_megatron_args(plan, job, target)


def test_planner_megatron_core_plan_round_trips():
    """The planner's own megatron-core plan (uneven first/last stages on this budget)."""
    job = gbmw.load_job("gpt3-39b_a100-80g-x32", memory_budget="40GiB")
    plan = gbmw.Planner(job, target="megatron-core").run()
    args = plan_to_megatron_args(plan, job, "megatron-core")
    uneven = list(plan.partition) != megatron_partition(job.model, plan.pp)
    assert ("--decoder-first-pipeline-num-layers" in args) == uneven
    assert megatron_args_to_plan(args, job, "megatron-core") == comparable(plan, "megatron-core")


def test_interleaved_plan_emits_virtual_stages_and_round_trips():
    """v = 3 chunks of the 48 blocks on each of 2 stages' 24: chunks of 8 blocks."""
    job, plan, target = case("gpt3-15b_megatron-core_tp8-pp2-zero1-ckpt")
    interleaved = dataclasses.replace(plan, virtual_stages=3)
    args = plan_to_megatron_args(interleaved, job, target)
    assert args[args.index("--num-layers-per-virtual-pipeline-stage") + 1] == "8"
    assert megatron_args_to_plan(args, job, target) == comparable(interleaved, target)
    with pytest.raises(PlanError, match="megatron-deepspeed runs plain 1F1B, not interleaved"):
        plan_to_megatron_args(dataclasses.replace(interleaved, target="megatron-deepspeed"), job,
                              "megatron-deepspeed")
    with pytest.raises(PlanError, match=r"the stages hold \[24, 24\] Transformer blocks; interleaving builds 7 equal "
                                        r"chunks per stage: an even split with a multiple of 7 blocks per stage, or the "
                                        r"split counting the embedding and the loss as layers \(\[24, 24\]\) with "
                                        r"\(blocks \+ 2\) / pp a multiple of 7"):
        plan_to_megatron_args(dataclasses.replace(plan, virtual_stages=7), job, target)


def test_interleaved_plan_on_the_accounted_split():
    """megatron-core's --account-for-embedding/loss-in-pipeline-split: 48 blocks + the embedding + the loss = 50
    layers on 2 stages, 25 each, in v = 5 chunks of 5 (the first chunk holds the embedding and 4 blocks, the last
    the loss and 4) — blocks [24, 24] as the even split, but chunks of 5 the even split cannot make. On 4 stages:
    50 is not a multiple of 4, so no accounted split exists; 46 blocks on 4 stages would be [11, 12, 12, 11]."""
    job, plan, target = case("gpt3-15b_megatron-core_tp8-pp2-zero1-ckpt")
    interleaved = dataclasses.replace(plan, virtual_stages=5)
    args = plan_to_megatron_args(interleaved, job, target)
    assert "--account-for-embedding-in-pipeline-split" in args and "--account-for-loss-in-pipeline-split" in args
    assert args[args.index("--num-layers-per-virtual-pipeline-stage") + 1] == "5"
    assert "--decoder-first-pipeline-num-layers" not in args
    assert megatron_args_to_plan(args, job, target) == comparable(interleaved, target)
    # the even split's chunks need no accounting
    assert "--account-for-loss-in-pipeline-split" not in plan_to_megatron_args(
        dataclasses.replace(plan, virtual_stages=3), job, target)
    from gbmw.space.stock_partitions import accounted_blocks_per_stage, interleaved_split
    assert accounted_blocks_per_stage(94, 8) == [11, 12, 12, 12, 12, 12, 12, 11]  # Qwen3-235B-A22B, pp 8
    assert accounted_blocks_per_stage(48, 4) is None and accounted_blocks_per_stage(46, 4) == [11, 12, 12, 11]
    assert interleaved_split([11, 12, 12, 12, 12, 12, 12, 11], 4) == "accounted"  # 96 / 32 = 3 layers a chunk
    assert interleaved_split([11, 12, 12, 12, 12, 12, 12, 11], 3) == "accounted"  # chunks of 4
    assert interleaved_split([11, 12, 12, 12, 12, 12, 12, 11], 5) is None  # 12 layers a stage: no 5 equal chunks
    assert interleaved_split([11, 12, 12, 11], 2) == "accounted" and interleaved_split([12, 12, 12, 11], 2) is None
    assert interleaved_split([12] * 8, 3) == "even" and interleaved_split([12] * 8, 5) is None
    # one flag without the other, or with uneven first/last stages, is refused by name
    one = [token for token in args if token != "--account-for-loss-in-pipeline-split"]
    with pytest.raises(GbmwError, match="--account-for-embedding-in-pipeline-split without "
                                        "--account-for-loss-in-pipeline-split"):
        megatron_args_to_plan(one, job, target)
    with pytest.raises(GbmwError, match="the embedding counted as a pipeline layer"):
        megatron_args_to_plan(["--account-for-embedding-in-pipeline-split"] + plan_to_megatron_args(
            dataclasses.replace(plan, target="megatron-deepspeed"), job, "megatron-deepspeed"), job,
            "megatron-deepspeed")


def test_sequence_parallel_and_selective_flags_and_their_refusals():
    """+sp and +sel emit Megatron's flags on both Megatron targets; what a target cannot run is refused with why."""
    job, plan, target = case("gpt3-39b_megatron-core_tp8-pp2-zero1-sp-selective")
    given = values(plan_to_megatron_args(plan, job, target))
    assert "--sequence-parallel" in given and given["--recompute-granularity"] == "selective"
    assert "--recompute-method" not in given and "--use-distributed-optimizer" in given
    assert plan.strategies[0].name == "tp8-z1dp2+sp" and plan.strategies[1].name == "tp8-z1dp2+sp+sel"
    # gbmw's runtime runs +sel (its attention core recomputed), not +sp in the embedding and the head
    with pytest.raises(PlanError, match=r"runtime cannot run this plan: layer\(s\) \[0, 49\] use sequence "
                                        r"parallelism \(\+sp\) outside the Transformer blocks; runtime runs it in "
                                        r"Transformer blocks only"):
        get_target("runtime").check(plan, job.model)
    # Megatron-DeepSpeed recomputes the attention core only on its unfused path
    flash_job = job_named("gpt3-15b_a100-80g-x32")
    flash_job = flash_job.model_copy(update={"model": flash_job.model.model_copy(update={
        "architecture": flash_job.model.architecture.model_copy(update={"attention": "flash"})})})
    _, deepspeed_plan, _ = case("gpt3-15b_megatron-deepspeed_tp4-pp2-zero1-sp-selective")
    with pytest.raises(PlanError, match=r"selective recomputation \(\+sel\) with flash attention"):
        plan_to_megatron_args(deepspeed_plan, flash_job, "megatron-deepspeed")
    with pytest.raises(PlanError, match="sequence parallelism splits TP's replicated regions; it needs tp >= 2"):
        gbmw.uniform_plan(job, "tp=1,pp=2,zero=1,sp=on,micro=1,target=megatron-core")


def test_planner_chooses_interleaving_for_megatron_core_and_its_plan_round_trips():
    """On llama-7b over 8 A100s the megatron-core search interleaves (64 micro-batches on 4 stages: the bubble
    matters); the search's iteration time is estimate_plan's for that plan, and the arguments read back to it."""
    from gbmw.cost.estimate import estimate_plan

    job = job_named("llama-7b_a100-80g-x8")
    plan = gbmw.Planner(job, target="megatron-core").run()
    assert plan.virtual_stages > 1 and plan.pp > 1
    assert estimate_plan(job, plan).iteration_time_s == pytest.approx(plan.estimate.iteration_time_s, rel=1e-12)
    args = plan_to_megatron_args(plan, job, "megatron-core")
    assert args[args.index("--num-layers-per-virtual-pipeline-stage") + 1] == str(32 // (plan.pp * plan.virtual_stages))
    assert megatron_args_to_plan(args, job, "megatron-core") == comparable(plan, "megatron-core")
    runtime = gbmw.Planner(job, target="runtime").run()
    assert runtime.virtual_stages == 1


def test_deepspeed_axes_map_to_zero_stages():
    job = job_named("gpt3-15b_a100-80g-x32")
    for zero, axis in enumerate(("dp", "z1dp", "z2dp", "sdp")):
        plan = gbmw.uniform_plan(job, f"tp=4,pp=1,zero={zero},ckpt=none,micro=1")
        args = plan_to_megatron_args(plan, job, "megatron-deepspeed")
        assert values(args)["--zero-stage"] == str(zero)
        assert megatron_args_to_plan(args, job, "megatron-deepspeed").strategies[1].name == f"tp4-{axis}8"


# ------------------------------------------------------------------------------------------ batch arithmetic


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_global_batch_is_micro_batch_times_dp_times_micro_batches(name):
    job, plan, target = case(name)
    given = values(plan_to_megatron_args(plan, job, target))
    tp, pp = int(given["--tensor-model-parallel-size"]), int(given["--pipeline-model-parallel-size"])
    dp = job.cluster.num_devices // (tp * pp)
    micro = int(given["--micro-batch-size"])
    assert micro == plan.micro_batch // dp
    assert int(given["--global-batch-size"]) == micro * dp * plan.num_micro_batches == plan.global_batch


# ------------------------------------------------------------------------------------------ refusals


def mixed_plan(target: str) -> tuple[gbmw.JobSpec, Plan]:
    job = job_named("gpt3-15b_a100-80g-x32")
    names = ["tp2-dp8"] * 12 + ["sdp16"] * 38
    return job, plan_from_strategy_names(job.model, 32, names, [25, 25], 512, 32, cluster=job.cluster.name,
                                         target=plan_target(target))


@pytest.mark.parametrize("target", TARGETS)
def test_mixed_plan_refused_with_the_targets_reasons(target):
    job, plan = mixed_plan(target)
    with pytest.raises(PlanError) as expected:
        get_target(target).check(plan, job.model)
    assert "layers 0-11 use tp2-dp8 and 12-49 use sdp16" in str(expected.value)
    for emit in (plan_to_megatron_args, launch_line):
        with pytest.raises(PlanError) as refused:
            emit(plan, job, target=target)
        assert str(refused.value) == str(expected.value)


def test_megatron_core_refuses_zero3_and_megatron_deepspeed_uneven_stages():
    job, plan, _ = case("gpt3-15b_megatron-deepspeed_tp2-zero3")
    with pytest.raises(PlanError, match="megatron-core offers DP or its distributed optimizer"):
        plan_to_megatron_args(plan, job, "megatron-core")
    job, plan, _ = case("gpt3-39b_megatron-core_uneven-first-last")
    with pytest.raises(PlanError, match=r"partition \[24, 26\] is not Megatron's even split"):
        plan_to_megatron_args(plan, job, "megatron-deepspeed")


@pytest.mark.parametrize(
    "edit, message",
    [
        # context parallelism is read now, and refused where megatron-core cannot run it (GPT-3's unfused attention)
        (["--context-parallel-size", "2"], r"context parallelism runs through fused \(flash\) attention"),
        (["--recompute-granularity", "selective", "--recompute-method", "uniform"], "drop --recompute-method"),
        (["--num-layers", "40"], r"--num-layers 40 \(the model needs 48\)"),
        (["--global-batch-size", "1001"], r"--global-batch-size 1001 is not a multiple of --micro-batch-size 1 \* "
                                          r"data-parallel size 2 = 2"),
        (["--fp16"], "both --bf16 and --fp16"),
        (["--recompute-num-layers", "2"], "recomputes whole blocks one at a time"),
        (["--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "10",
          "--decoder-last-pipeline-num-layers", "11"], "27 blocks left for 2 middle stages of pp=4"),
        (["--tensor-model-parallel-size", "3"], r"devices\(32\) % \(tensor\(3\) \* pipeline\(2\) = 6\) != 0"),
    ],
)
def test_inverse_refuses_what_a_plan_cannot_say(edit, message):
    job, plan, target = case("gpt3-15b_megatron-core_tp8-pp2-zero1-ckpt")
    args = plan_to_megatron_args(plan, job, target) + edit  # argparse: the last value wins
    with pytest.raises(GbmwError, match=message):
        megatron_args_to_plan(args, job, target)


def test_inverse_refuses_megatron_deepspeed_without_deepspeed_and_wrong_precision():
    job, plan, target = case("gpt3-15b_megatron-deepspeed_tp2-zero3")
    args = plan_to_megatron_args(plan, job, target)
    with pytest.raises(GbmwError, match="without --deepspeed run no ZeRO"):
        megatron_args_to_plan([a for a in args if a != "--deepspeed"], job, target)
    with pytest.raises(GbmwError, match="train in fp32 but job gpt3-15b_a100-80g-x32 trains in bf16"):
        megatron_args_to_plan([a for a in args if a != "--bf16"], job, target)
    with pytest.raises(GbmwError, match="uneven pipeline stages"):
        megatron_args_to_plan(args + ["--decoder-first-pipeline-num-layers", "3"], job, target)


# ------------------------------------------------------------------------------------------ precision fp8

FP8_JOB = "model: gpt3-15b\ncluster: h100-80g-x64\nprecision: fp8\nglobal_batch: 512\n"


@pytest.fixture(scope="module")
def fp8_job(tmp_path_factory) -> gbmw.JobSpec:
    path = tmp_path_factory.mktemp("fp8") / "gpt3-15b-fp8_h100-80g-x64.yaml"
    path.write_text(FP8_JOB)
    return gbmw.load_job(path)


def test_fp8_plan_emits_transformer_engine_flags_and_round_trips(fp8_job):
    """fp8 is megatron-core's TE FP8 on bf16 parameters: --bf16 --fp8-format hybrid --fp8-recipe delayed (the flags
    and choices of TransformerConfig.fp8 / fp8_recipe, megatron/core/transformer/transformer_config.py)."""
    plan = gbmw.uniform_plan(fp8_job, "tp=4,pp=2,zero=1,sp=on,micro=1,target=megatron-core")
    args = plan_to_megatron_args(plan, fp8_job, "megatron-core")
    given = values(args)
    assert (given["--fp8-format"], given["--fp8-recipe"]) == ("hybrid", "delayed")
    assert "--bf16" in given and "--fp16" not in given
    assert megatron_args_to_plan(args, fp8_job, "megatron-core") == comparable(plan, "megatron-core")
    with pytest.raises(GbmwError, match="--fp8-format e4m3 --fp8-recipe delayed with bf16: gbmw costs FP8 as --bf16 "
                                        "--fp8-format hybrid --fp8-recipe delayed or tensorwise only"):
        megatron_args_to_plan(args + ["--fp8-format", "e4m3"], fp8_job, "megatron-core")
    with pytest.raises(GbmwError, match="train in bf16 but job gpt3-15b-fp8_h100-80g-x64 trains in fp8"):
        megatron_args_to_plan([a for a in args if a not in ("--fp8-format", "--fp8-recipe", "hybrid", "delayed")],
                              fp8_job, "megatron-core")


def test_fp8_refused_in_one_line_where_no_transformer_engine_runs(fp8_job):
    from gbmw.adapters.deepspeed import plan_to_ds_config

    plan = gbmw.uniform_plan(fp8_job, "tp=4,pp=2,zero=1,micro=1,target=megatron-core")
    line = ("precision fp8: --target {} plans fp32, fp16, bf16 ({} does not run Transformer Engine's FP8 linears); "
            "plan it for --target megatron-core, or set the job's precision to bf16")
    with pytest.raises(GbmwError) as error:
        plan_to_megatron_args(plan, fp8_job, "megatron-deepspeed")
    assert str(error.value) == line.format("megatron-deepspeed", "Megatron-DeepSpeed")
    with pytest.raises(GbmwError) as error:
        plan_to_ds_config(dataclasses.replace(plan, target="deepspeed"), fp8_job, "deepspeed")
    assert str(error.value) == line.format("deepspeed", "DeepSpeed (ZeRO + pipeline engine)")
    for target, plans in (("deepspeed", "fp32, fp16, bf16"), ("runtime", "fp32, tf32, fp16, bf16")):
        with pytest.raises(GbmwError, match=f"precision fp8: --target {target} plans {plans}"):
            gbmw.uniform_plan(fp8_job, f"tp=1,pp=2,zero=1,micro=1,target={target}")


@pytest.mark.torch
def test_fp8_megatron_core_config(fp8_job):
    pytest.importorskip("megatron.core")
    import torch

    plan = gbmw.uniform_plan(fp8_job, "tp=4,pp=2,zero=1,sp=on,micro=1,target=megatron-core")
    _, config = plan_to_megatron_core_configs(plan, fp8_job)
    assert (config.fp8, config.fp8_recipe, config.bf16, config.params_dtype) == ("hybrid", "delayed", True,
                                                                                 torch.bfloat16)


def test_blocks_per_stage_follows_megatron():
    assert megatron_blocks_per_stage(48, 1) == [48]
    assert megatron_blocks_per_stage(48, 4) == [12, 12, 12, 12]
    assert megatron_blocks_per_stage(48, 4, 10, 12) == [10, 13, 13, 12]
    assert megatron_blocks_per_stage(48, 4, first=9) == [9, 13, 13, 13]
    assert megatron_blocks_per_stage(48, 2, 23, 25) == [23, 25]
    with pytest.raises(GbmwError, match=r"23 \+ --decoder-last-pipeline-num-layers 24 = 47 != --num-layers 48"):
        megatron_blocks_per_stage(48, 2, 23, 24)


# ------------------------------------------------------------------------------------------ megatron-core configs

CORE_CASES = sorted(name for name, (_, _, target) in ALL_CASES.items() if plan_target(target) == "megatron-core")


@pytest.mark.torch
@pytest.mark.parametrize("name", CORE_CASES)
def test_megatron_core_configs_construct(name):
    pytest.importorskip("megatron.core")
    import torch

    job, plan, _ = case(name)
    parallel, config = plan_to_megatron_core_configs(plan, job)
    strategy = plan.strategies[1]
    latent = job.model.architecture.latent_attention
    assert type(parallel).__name__ == "ModelParallelConfig"
    assert type(config).__name__ == ("TransformerConfig" if latent is None else "MLATransformerConfig")
    if latent is not None:
        assert (config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim, config.qk_pos_emb_head_dim,
                config.v_head_dim, config.qk_layernorm) == (latent.q_lora_rank, latent.kv_lora_rank,
                                                            latent.qk_nope_head_dim, latent.qk_rope_head_dim,
                                                            latent.v_head_dim, True)
    for made in (parallel, config):
        assert (made.tensor_model_parallel_size, made.pipeline_model_parallel_size) == (strategy.tp, plan.pp)
        assert made.sequence_parallel is strategy.sp and made.use_cpu_initialization is True
        assert made.params_dtype == made.pipeline_dtype == torch.bfloat16 and made.bf16 and not made.fp16
    assert config.num_layers == sum(layer.kind == "decoder" for layer in job.model.layers)
    assert config.recompute_granularity == {"none": None}.get(strategy.recompute, strategy.recompute)
    assert config.recompute_num_layers == (1 if strategy.ckpt else None)
    given = values(plan_to_megatron_args(plan, job, "megatron-core"))
    first = given.get("--decoder-first-pipeline-num-layers")
    assert config.num_layers_in_first_pipeline_stage == (int(first) if first else None)


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore::UserWarning")  # megatron-core warns about missing TE/Apex and CUDA graphs
@pytest.mark.parametrize("num_blocks, pp, first, last",
                         [(48, 4, 10, 12), (48, 2, 23, 25), (80, 8, 3, None), (80, 8, None, 17), (48, 4, None, None)])
def test_blocks_per_stage_equals_megatron_core(num_blocks, pp, first, last):
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    config = TransformerConfig(num_layers=num_blocks, hidden_size=64, num_attention_heads=8,
                               pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32,
                               num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last)
    built = [get_num_layers_to_build(config, pp_rank=stage) for stage in range(pp)]
    assert megatron_blocks_per_stage(num_blocks, pp, first, last) == built


@pytest.mark.torch
def test_megatron_core_rejects_heads_not_divisible_by_tp():
    pytest.importorskip("megatron.core")
    job = job_named("gpt3-15b_a100-80g-x32")  # 40 heads
    plan = Plan(model=job.model.name, cluster=job.cluster.name, num_devices=32, precision="bf16", global_batch=1024,
                micro_batch=2, num_micro_batches=512, pp=1, partition=(50,),
                strategies=(Strategy.parse("tp16-dp2"),) * 50, target="megatron-core")
    with pytest.raises(GbmwError) as rejected:
        plan_to_megatron_core_configs(plan, job)
    message = str(rejected.value)
    assert message.startswith("megatron-core TransformerConfig rejects the plan: num_attention_heads (40) must be a "
                              "multiple of tensor_model_parallel_size (16).")
    assert message.endswith("[tensor_model_parallel_size=16, num_attention_heads=40]")
    assert "\n" not in message
    with pytest.raises(PlanError, match="40 attention heads, not divisible by tp=16"):
        plan_to_megatron_args(plan, job, "megatron-core")


# ------------------------------------------------------------------------------------------ launch


def test_launch_lines_split_back_into_the_arguments():
    job, plan, target = case("llama-7b_single-node_dp8")
    extra = ["--data-path", "my corpus/text_document", "--tokenizer-type", "HuggingFaceTokenizer"]
    line = launch_line(plan, job, target=target, extra_args=extra)
    assert line.startswith("torchrun --standalone --nproc_per_node 8 pretrain_gpt.py ")
    words = shlex.split(line)
    assert words[words.index("pretrain_gpt.py") + 1:] == plan_to_megatron_args(plan, job, target) + extra
    deepspeed = shlex.split(launch_line(plan, job, "train.py", target, launcher="deepspeed"))
    assert deepspeed[:5] == ["deepspeed", "--num_gpus", "8", "--no_local_rank", "train.py"]


def test_multi_node_launchers():
    job, plan, target = case("gpt3-39b_megatron-deepspeed_tp8-pp2-zero1-ckpt")
    words = shlex.split(launch_line(plan, job, target=target, hostfile="/job/hosts"))
    assert words[:8] == ["deepspeed", "--hostfile", "/job/hosts", "--num_nodes", "4", "--num_gpus", "8",
                         "pretrain_gpt.py"]
    line = launch_line(plan, job, target="megatron-core")
    assert line.startswith("CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 4 --nproc_per_node 8 "
                           '--rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" pretrain_gpt.py ')
    with pytest.raises(GbmwError, match="launcher 'mpirun' is unknown"):
        launch_line(plan, job, launcher="mpirun")


def test_adapter_imports_no_torch():
    code = "import sys, gbmw.adapters.megatron\nprint('torch' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------------- mixture of experts


@pytest.mark.parametrize("target, config", [
    ("megatron-core", "tp=2,pp=4,zero=1,ep=4,sp=on,micro=1"),
    ("megatron-core", "tp=1,pp=4,zero=1,ep=8,micro=1"),
    ("megatron-deepspeed", "tp=1,pp=4,zero=1,ep=8,micro=1"),
    ("megatron-deepspeed", "tp=2,pp=1,zero=2,ep=2,sp=on,ckpt=full,micro=1"),
])
def test_moe_arguments_carry_the_experts_and_round_trip(target, config):
    job = gbmw.load_job("mixtral-8x7b_h100-80g-x64")
    plan = gbmw.uniform_plan(job, f"{config},target={target}")
    args = plan_to_megatron_args(plan, job, target)
    ep = max(strategy.ep for strategy in plan.strategies)
    expected = (["--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "14336",
                 "--expert-model-parallel-size", str(ep)] if target == "megatron-core" else
                ["--num-experts", "8", "--topk", "2", "--expert-interval", "1", "--moe-expert-parallel-size", str(ep)])
    assert all(" ".join(expected[i:i + 2]) in " ".join(args) for i in range(0, len(expected), 2)), args
    assert megatron_args_to_plan(args, job, target).strategies == plan.strategies


def test_moe_layouts_megatron_cannot_express_are_refused_by_name():
    job = gbmw.load_job("mixtral-8x7b_h100-80g-x64")
    arch = job.model.architecture
    shared = arch.model_copy(update={"moe": arch.moe.model_copy(update={"shared_experts": 1})})
    from gbmw.specs.models import build_model

    shared_job = job.model_copy(update={"model": build_model(shared, job.precision)})
    plan = gbmw.uniform_plan(shared_job, "tp=1,pp=4,zero=1,ep=8,micro=1,target=megatron-deepspeed")
    with pytest.raises(GbmwError, match="cannot express shared experts — use --target megatron-core"):
        plan_to_megatron_args(plan, shared_job, "megatron-deepspeed")
    assert "--moe-shared-expert-intermediate-size" in plan_to_megatron_args(
        gbmw.uniform_plan(shared_job, "tp=1,pp=4,zero=1,ep=8,micro=1,target=megatron-core"), shared_job,
        "megatron-core")
    with pytest.raises(PlanError, match="expert parallelism with TP but no sequence parallelism"):
        gbmw.uniform_plan(job, "tp=2,pp=4,zero=1,ep=4,micro=1,target=megatron-core")


# ------------------------------------------------------------------------------------ multi-head latent attention


def test_latent_attention_flags_are_read_back_and_refused_where_they_cannot_run(tmp_path):
    job, plan, target = case("deepseek-v2-lite_megatron-core_tp2-ep4-sp")
    args = plan_to_megatron_args(plan, job, target)
    given = values(args)
    assert {"--multi-latent-attention", "--qk-layernorm"} <= set(given) and "--group-query-attention" not in given
    assert [given[flag] for flag in ("--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim")] == [
        "512", "128", "64", "128"]
    assert "--q-lora-rank" not in given and "--kv-channels" not in given  # V2-Lite has no query latent
    with pytest.raises(GbmwError, match=r"--kv-lora-rank 256 \(the model needs 512\)"):
        megatron_args_to_plan(" ".join(args).replace("--kv-lora-rank 512", "--kv-lora-rank 256").split(), job, target)
    with pytest.raises(GbmwError, match=r"--multi-latent-attention False \(the model needs True\)"):
        megatron_args_to_plan([arg for arg in args if arg != "--multi-latent-attention"], job, target)
    llama, llama_plan, _ = case("llama-7b_megatron-core_tp4-pp4")
    with pytest.raises(GbmwError, match=r"--multi-latent-attention True \(the model needs False\)"):
        megatron_args_to_plan(plan_to_megatron_args(llama_plan, llama, target) + ["--multi-latent-attention"], llama,
                              target)
    deepspeed_plan = gbmw.uniform_plan(job, "tp=1,pp=1,zero=1,micro=1,target=megatron-deepspeed")
    with pytest.raises(GbmwError) as refused:
        plan_to_megatron_args(deepspeed_plan, job, "megatron-deepspeed")
    assert str(refused.value) == (
        "model deepseek-v2-lite: megatron-deepspeed's arguments cannot express multi-head latent attention "
        "(latent_attention; Megatron-DeepSpeed has no MLA, megatron-core's --multi-latent-attention runs it) — plan it "
        "for --target deepspeed or runtime, or write a model recipe YAML for the nearest layout")

    (tmp_path / "job.yaml").write_text(f"model: {Path(__file__).parent / 'hf_configs' / 'DeepSeek-V3.json'}\n"
                                       "cluster: h100-80g-x64\nprecision: bf16\nglobal_batch: 1024\nseq_length: 4096\n"
                                       "flash_attention: true\n")
    v3 = gbmw.load_job(tmp_path / "job.yaml")
    v3_plan = gbmw.uniform_plan(v3, "tp=4,pp=1,zero=1,ep=16,sp=on,micro=1,target=megatron-core")
    v3_args = values(plan_to_megatron_args(v3_plan, v3, "megatron-core"))
    assert (v3_args["--q-lora-rank"], v3_args["--moe-router-score-function"]) == ("1536", "sigmoid")
    assert "--moe-router-enable-expert-bias" in v3_args
    assert v3_args["--moe-layer-freq"] == "[" + ",".join(["0"] * 3 + ["1"] * 58) + "]"


@pytest.mark.torch
@pytest.mark.parametrize("virtual_stages, accounted", [(3, False), (5, True)])
def test_megatron_core_builds_the_interleaved_chunks(virtual_stages, accounted):
    """megatron-core's own get_num_layers_to_build, chunk by chunk, builds the plan's blocks per stage: v = 3 chunks of
    8 of the even split, and v = 5 chunks of the split counting the embedding and the loss as layers (5 layers a
    chunk; the first and last chunks 4 blocks)."""
    pytest.importorskip("megatron.core")
    job, plan, _ = case("gpt3-15b_megatron-core_tp8-pp2-zero1-ckpt")
    parallel, config = plan_to_megatron_core_configs(dataclasses.replace(plan, virtual_stages=virtual_stages), job)
    assert parallel.virtual_pipeline_model_parallel_size == virtual_stages
    assert config.account_for_embedding_in_pipeline_split is accounted
    assert config.account_for_loss_in_pipeline_split is accounted
