"""DeepSpeed adapter: golden configs, plan → config → plan round trips, DeepSpeed's own validation,
drop-in merge into a user's config, and one clear error per bad input.

Regenerate the golden files after an intended change with
    GBMW_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_deepspeed_adapter.py
and review the diff under tests/golden/deepspeed/.
"""

from __future__ import annotations

import copy
import os
import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from golden import check_golden

import gbmw
from gbmw.adapters import deepspeed as ds
from gbmw.errors import GbmwError, PlanError
from gbmw.handwritten.uniform_config import UniformConfig
from gbmw.plan import Plan, plan_from_strategy_names
from gbmw.search.planner import Planner

GOLDEN = Path(__file__).parent / "golden" / "deepspeed"


@lru_cache(maxsize=None)
def job(name: str):
    return gbmw.load_job(name)


@lru_cache(maxsize=None)
def planned(name: str, target: str, batch: int) -> Plan:
    return Planner(job(name), target=target, batch=batch).run()


GPT = "gpt3-15b_a100-80g-x32"
BERT = "bert-huge-32_rtx-titan-x8"

# (golden file, job, how the plan is made, target)
GOLDEN_CASES = [
    ("gpt3-15b_tp8-pp2-zero1-ckpt_megatron-deepspeed", GPT, "tp=8,pp=2,zero=1,ckpt=full,micro=1", "megatron-deepspeed"),
    ("gpt3-15b_dp32-zero3-ckpt_deepspeed", GPT, "tp=1,pp=1,zero=3,ckpt=full,micro=1", "deepspeed"),
    ("bert-huge-32_rtx-titan-x8_planner-batch64_deepspeed", BERT, "planner:64", "deepspeed"),
]


def make_plan(job_name: str, how: str, target: str) -> Plan:
    if how.startswith("planner:"):
        return planned(job_name, target, int(how.split(":")[1]))
    return gbmw.uniform_plan(job(job_name), how)


def golden_config(case) -> tuple[dict, Plan]:
    _, job_name, how, target = case
    plan = make_plan(job_name, how, target)
    return ds.plan_to_ds_config(plan, job(job_name), target), plan


# ---------------------------------------------------------------------------------- golden files


@pytest.mark.parametrize("case", GOLDEN_CASES, ids=[case[0] for case in GOLDEN_CASES])
def test_emitted_config_matches_golden_file(case):
    config, _ = golden_config(case)
    text = ds.dumps_config(config)
    check_golden(GOLDEN / f"{case[0]}.json", text)


def test_batch_identity_uses_the_data_parallel_size():
    config, plan = golden_config(GOLDEN_CASES[0])  # 32 devices, tp=8, pp=2: DP = 2
    assert (plan.micro_batch, plan.num_micro_batches, plan.global_batch) == (2, 512, 1024)
    assert config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * 2 == 1024
    assert config["train_micro_batch_size_per_gpu"] == 1
    assert config["pipeline"] == {"activation_checkpoint_interval": 1}


def test_the_adapter_imports_deepspeed_only_to_validate():
    code = "import sys, gbmw.adapters.deepspeed\nprint('torch' in sys.modules, 'deepspeed' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["False", "False"], result.stderr


def test_emitted_configs_are_plain_json_holding_only_owned_keys():
    for case in GOLDEN_CASES:
        config, _ = golden_config(case)
        assert json.loads(json.dumps(config)) == config
        leaves = [path for path in ds._paths(config) if not isinstance(ds._get(config, path), dict)]
        assert set(leaves) <= set(ds.OWNED_KEYS), set(leaves) - set(ds.OWNED_KEYS)
        merged, _ = ds.merge_into_user_config({}, config)
        assert merged == config


@pytest.mark.parametrize("zero,axis", [(0, "dp"), (1, "z1dp"), (2, "z2dp"), (3, "sdp")])
def test_zero_stage_follows_the_data_parallel_axis(zero, axis):
    plan = gbmw.uniform_plan(job(GPT), f"zero={zero},micro=1")
    assert plan.strategies[1].dims == ((axis, 32),)
    section = ds.plan_to_ds_config(plan, job(GPT))["zero_optimization"]
    assert section["stage"] == zero
    assert ("stage3_max_live_parameters" in section) == (zero == 3)
    assert ("overlap_comm" in section) == (zero > 0)


def test_precision_sections():
    bf16 = gbmw.uniform_plan(job(GPT), "zero=1,micro=1")
    config = ds.plan_to_ds_config(bf16, job(GPT))
    assert (config["bf16"], config["fp16"]) == ({"enabled": True}, {"enabled": False})
    for precision, expected in (("fp16", ({"enabled": False}, {"enabled": True})),
                                ("fp32", ({"enabled": False}, {"enabled": False}))):
        other = job(GPT).model_copy(update={"precision": precision})
        config = ds.plan_to_ds_config(gbmw.uniform_plan(other, "zero=1,micro=1"), other)
        assert (config["bf16"], config["fp16"]) == expected


def test_no_activation_checkpointing_section_without_ckpt():
    config = ds.plan_to_ds_config(gbmw.uniform_plan(job(GPT), "pp=2,zero=1,micro=1"), job(GPT))
    assert "activation_checkpointing" not in config
    assert config["pipeline"] == {"activation_checkpoint_interval": 0}


# ---------------------------------------------------------------------------------- round trips

ROUND_TRIPS = [
    (GPT, "tp=8,pp=2,zero=1,ckpt=full,micro=1", "megatron-deepspeed"),
    (GPT, "tp=4,pp=1,zero=3,ckpt=none,micro=2", "megatron-deepspeed"),
    (GPT, "tp=2,pp=4,zero=0,ckpt=full,micro=4", "megatron-deepspeed"),
    (GPT, "tp=1,pp=1,zero=2,ckpt=full,micro=1", "deepspeed"),
    (GPT, "tp=1,pp=1,zero=0,ckpt=none,micro=2", "deepspeed"),
    (GPT, "tp=1,pp=2,zero=1,ckpt=none,micro=1", "deepspeed"),
    (BERT, "tp=1,pp=1,zero=3,ckpt=full,micro=8,batch=64", "deepspeed"),
    (BERT, "tp=1,pp=8,zero=0,ckpt=none,micro=1,batch=64", "megatron-deepspeed"),
]


@pytest.mark.parametrize("job_name,uniform,target", ROUND_TRIPS, ids=[f"{c[1]}-{c[2]}" for c in ROUND_TRIPS])
def test_plan_to_config_to_plan_round_trip(job_name, uniform, target):
    plan = gbmw.uniform_plan(job(job_name), uniform)
    tp, pp, dp = ds.plan_layout(plan, job(job_name).model)
    config = ds.plan_to_ds_config(plan, job(job_name), target)
    fields = ds.ds_config_to_plan_fields(config, plan.num_devices, tp, pp)
    axes = [axis for axis, _ in plan.strategies[1].dims if axis != "tp"]
    assert fields == {
        "global_batch": plan.global_batch,
        "micro_batch": plan.micro_batch,
        "num_micro_batches": plan.num_micro_batches,
        "data_parallel_axis": axes[0] if axes else None,
        "zero_stage": {"dp": 0, "z1dp": 1, "z2dp": 2, "sdp": 3}[axes[0]] if axes else 0,
        "ckpt": plan.strategies[1].ckpt,
        "precision": plan.precision,
    }
    # ...and back to the same Plan through the uniform-config path.
    again = UniformConfig(tp=tp, pp=pp, zero=fields["zero_stage"], ckpt="full" if fields["ckpt"] else "none",
                          micro=fields["micro_batch"] // dp, batch=fields["global_batch"]).to_plan(job(job_name))
    assert again == plan


def test_round_trip_of_the_planner_plan():
    plan = planned(BERT, "deepspeed", 64)
    tp, pp, _ = ds.plan_layout(plan, job(BERT).model)
    fields = ds.ds_config_to_plan_fields(ds.plan_to_ds_config(plan, job(BERT)), plan.num_devices, tp, pp)
    assert (fields["global_batch"], fields["micro_batch"], fields["num_micro_batches"]) == (
        plan.global_batch, plan.micro_batch, plan.num_micro_batches)
    assert fields["ckpt"] == any(s.ckpt for s in plan.strategies)
    assert fields["precision"] == plan.precision == "fp32"


# ---------------------------------------------------------------------------------- pipeline partition


def bert_plan(partition: list[int], target: str = "deepspeed") -> Plan:
    model = job(BERT).model
    group = 8 // len(partition)
    names = [f"dp{group}" if group > 1 else "single"] * model.num_layers
    return plan_from_strategy_names(model, 8, names, partition, global_batch=64, num_micro_batches=8, target=target)


def test_pipeline_partition_methods():
    model = job(BERT).model
    uniform = ds.deepspeed_partition_uniform(model.num_layers, 4)
    assert uniform == [9, 9, 8, 8]  # DeepSpeed puts the remainder on the first stages
    assert ds.pipeline_partition_method(bert_plan(uniform), model) == "uniform"
    by_parameters = ds.deepspeed_partitions(model, 4)["parameters"]
    assert by_parameters != uniform
    assert ds.pipeline_partition_method(bert_plan(by_parameters), model) == "parameters"
    gpt = gbmw.uniform_plan(job(GPT), "tp=8,pp=2,zero=1,micro=1")
    assert ds.pipeline_partition_method(gpt, job(GPT).model, "megatron-deepspeed") == "type:transformer"
    with pytest.raises(PlanError, match=r"partition \[10, 8, 8, 8\] is what no deepspeed .*uniform: \[9, 9, 8, 8\]"):
        ds.pipeline_partition_method(bert_plan([10, 8, 8, 8]), model)


@pytest.mark.parametrize("job_name, batch, pp", [("gpt3-15b_a100-80g-x32", None, 4), (BERT, 64, 1)])
def test_planner_plans_only_deepspeeds_partitions(job_name, batch, pp):
    """The deepspeed target searches DeepSpeed's own partition methods only, so its plan names one of them."""
    job_spec = gbmw.load_job(job_name)
    plan = Planner(job_spec, target="deepspeed", batch=batch).run()
    assert plan.pp == pp  # a job whose best plan is a pipeline: the check below is not about pp = 1 alone
    method = ds.pipeline_partition_method(plan, job_spec.model)
    assert ds.deepspeed_partitions(job_spec.model, plan.pp)[method] == list(plan.partition)


# ---------------------------------------------------------------------------------- drop-in merge

USER_CONFIG = {
    "train_batch_size": 256,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100}},
    "gradient_clipping": 1.0,
    "steps_per_print": 50,
    "wall_clock_breakdown": False,
    "my_team_tag": {"run": "exp-7"},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "allgather_bucket_size": 200000000,
        "prefetch_bucket_size": 1000,
        "sub_group_size": 1000000000,
    },
    "bfloat16": {"enabled": False, "immediate_grad_update": True},
    "activation_checkpointing": {"partition_activations": True, "profile": True},
}


def test_merge_keeps_every_unowned_key_and_reports_changes():
    user = copy.deepcopy(USER_CONFIG)
    generated, _ = golden_config(GOLDEN_CASES[0])  # ZeRO-1, bf16, ckpt, pp=2
    merged, changes = ds.merge_into_user_config(user, generated)
    assert user == USER_CONFIG  # never mutated
    unowned = ("optimizer", "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "my_team_tag")
    for key in unowned:
        assert merged[key] == USER_CONFIG[key]
    zero = merged["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert (zero["allgather_bucket_size"], zero["sub_group_size"]) == (200000000, 1000000000)
    assert zero["stage"] == 1 and zero["overlap_comm"] is True
    assert merged["activation_checkpointing"]["profile"] is True
    assert merged["activation_checkpointing"]["partition_activations"] is False
    assert "bf16" not in merged and merged["bfloat16"] == {"enabled": True, "immediate_grad_update": True}
    for line in ("train_micro_batch_size_per_gpu: 4 -> 1", "train_batch_size: 256 -> 1024",
                 'gradient_accumulation_steps: "auto" -> 512', "zero_optimization.stage: 3 -> 1",
                 "activation_checkpointing.partition_activations: true -> false", "pipeline: added",
                 "bfloat16.enabled: false -> true",
                 "zero_optimization.overlap_comm: added (true)"):
        assert line in changes, (line, changes)
    assert any(line.startswith("note: zero_optimization.offload_optimizer kept") for line in changes)
    merged["optimizer"]["params"]["lr"] = 1.0  # the result shares nothing with the input
    assert user["optimizer"]["params"]["lr"] == 3e-4


def test_merge_adds_and_removes_owned_sections():
    generated, _ = golden_config(GOLDEN_CASES[1])  # ZeRO-3 with ckpt, pp=1
    merged, changes = ds.merge_into_user_config({"optimizer": {"type": "Adam"}}, generated)
    assert "activation_checkpointing: added" in changes and "zero_optimization: added" in changes
    assert merged == {"optimizer": {"type": "Adam"}, **generated}
    alias, _ = ds.merge_into_user_config(USER_CONFIG, generated)
    # The user's number under DeepSpeed's other spelling is the user's bucket size: kept, and not set again
    assert alias["zero_optimization"]["prefetch_bucket_size"] == 1000
    assert "stage3_prefetch_bucket_size" not in alias["zero_optimization"]
    auto_alias = copy.deepcopy(USER_CONFIG)
    auto_alias["zero_optimization"]["prefetch_bucket_size"] = "auto"
    alias, _ = ds.merge_into_user_config(auto_alias, generated)
    assert "prefetch_bucket_size" not in alias["zero_optimization"]  # "auto": gbmw's value, one spelling
    assert alias["zero_optimization"]["stage3_prefetch_bucket_size"] == generated["zero_optimization"][
        "stage3_prefetch_bucket_size"]
    no_ckpt = ds.plan_to_ds_config(gbmw.uniform_plan(job(GPT), "zero=2,micro=1"), job(GPT))
    merged, changes = ds.merge_into_user_config(USER_CONFIG, no_ckpt)
    assert "activation_checkpointing" not in merged
    assert "activation_checkpointing: removed (the plan recomputes no layer)" in changes
    same, changes = ds.merge_into_user_config(no_ckpt, no_ckpt)
    assert same == no_ckpt and changes == []


def test_merge_keeps_the_users_bucket_size_and_fills_auto_ones():
    generated, _ = golden_config(GOLDEN_CASES[0])  # ZeRO-1
    user = {"zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8}}
    merged, changes = ds.merge_into_user_config(user, generated)
    assert merged["zero_optimization"]["reduce_bucket_size"] == 5e8
    assert not any(line.startswith("zero_optimization.reduce_bucket_size") for line in changes)
    assert "note: zero_optimization.reduce_bucket_size kept from your config; the estimate counts gbmw's " \
        f"{job(GPT).model.hidden_size ** 2}" in changes
    merged, changes = ds.merge_into_user_config({"zero_optimization": {"reduce_bucket_size": "auto"}}, generated)
    hidden = job(GPT).model.hidden_size
    assert merged["zero_optimization"]["reduce_bucket_size"] == hidden * hidden  # HF's "auto" rule
    assert f'zero_optimization.reduce_bucket_size: "auto" -> {hidden * hidden}' in changes


def test_merge_makes_grad_accum_dtype_one_deepspeed_starts_with():
    """Megatron-DeepSpeed's universal-checkpointing configs accumulate bf16 gradients in fp32, which DeepSpeed does
    only with ZeRO ≥ 1: under a ZeRO-0 plan the accumulation follows the model's dtype."""
    user = {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 1}}
    zero0 = ds.plan_to_ds_config(gbmw.uniform_plan(job(GPT), "tp=8,pp=2,zero=0,micro=1"), job(GPT),
                                 "megatron-deepspeed")
    merged, changes = ds.merge_into_user_config(user, zero0)
    assert merged["data_types"] == {"grad_accum_dtype": "bf16"}
    assert any(line.startswith('data_types.grad_accum_dtype: "fp32" -> "bf16" (the plan uses ZeRO-0') for line in changes)
    zero1, _ = golden_config(GOLDEN_CASES[0])
    merged, changes = ds.merge_into_user_config(user, zero1)
    assert merged["data_types"] == {"grad_accum_dtype": "fp32"}  # ZeRO-1 keeps it
    assert not any("grad_accum_dtype" in line for line in changes)


def test_write_ds_config_never_overwrites(tmp_path):
    config, _ = golden_config(GOLDEN_CASES[1])
    path = ds.write_ds_config(tmp_path / "ds_config.json", config)
    assert ds.load_user_config(path) == config
    with pytest.raises(GbmwError, match="exists; gbmw does not overwrite"):
        ds.write_ds_config(path, {})


# ---------------------------------------------------------------------------------- bad inputs


def test_invalid_json_is_one_error_with_line_and_column(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text('{"train_batch_size": 8,\n "zero_optimization": {"stage": 1}\n')
    with pytest.raises(GbmwError, match=r"ds_config.json: not valid JSON at line 3, column 1"):
        ds.load_user_config(path)
    with pytest.raises(GbmwError, match="no such DeepSpeed config file"):
        ds.load_user_config(tmp_path / "missing.json")
    path.write_text("[1, 2]")
    with pytest.raises(GbmwError, match=r"a DeepSpeed config is a JSON object .* holds a list"):
        ds.load_user_config(path)
    path.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    with pytest.raises(GbmwError, match="'train_batch_size' appears twice"):
        ds.load_user_config(path)


def test_inconsistent_user_batch_names_the_three_numbers():
    config = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 16}
    problems = ds.batch_consistency_problems(config, world_size=32, mp_size=8)
    assert problems == [
        "train_batch_size(512) != train_micro_batch_size_per_gpu(4) * gradient_accumulation_steps(16) * "
        "data-parallel size(4) = 256, where data-parallel size = world_size(32) / mp_size(8)"
    ]
    with pytest.raises(GbmwError, match=r"inconsistent batch sizes: train_batch_size\(512\) != "):
        ds.check_batch_consistency(config, 32, 8)
    assert ds.batch_consistency_problems(config, world_size=32, mp_size=4) == []
    assert ds.batch_consistency_problems({**config, "train_batch_size": "auto"}, 32, 8) == []
    with pytest.raises(GbmwError, match="train_micro_batch_size_per_gpu: value 0"):
        ds.check_batch_consistency({"train_micro_batch_size_per_gpu": 0}, 8)


def test_mixed_plan_is_refused_with_check_expressibles_reasons():
    model = job(BERT).model
    names = ["tp2-dp4"] * 12 + ["sdp8"] * (model.num_layers - 12)
    plan = plan_from_strategy_names(model, 8, names, [model.num_layers], global_batch=64, num_micro_batches=8)
    for target in ("deepspeed", "megatron-deepspeed"):
        with pytest.raises(PlanError) as error:
            ds.plan_to_ds_config(plan, job(BERT), target)
        message = str(error.value)
        assert message.startswith(f"{target} cannot run this plan: layers 0-11 use tp2-dp4 and 12-33 use sdp8")
        assert "one parallel layout for every layer" in message
    with pytest.raises(PlanError, match="plain DeepSpeed has none"):
        ds.plan_to_ds_config(gbmw.uniform_plan(job(GPT), "tp=8,micro=1"), job(GPT), "deepspeed")
    with pytest.raises(PlanError, match="refuses ZeRO-2 and ZeRO-3"):
        ds.plan_to_ds_config(gbmw.uniform_plan(job(GPT), "pp=2,zero=3,micro=1"), job(GPT))
    with pytest.raises(PlanError, match="is for model 'gpt3-15b'"):
        ds.plan_to_ds_config(gbmw.uniform_plan(job(GPT), "zero=1,micro=1"), job(BERT))


# ---------------------------------------------------------------------------------- DeepSpeed itself


@pytest.fixture(scope="module")
def deepspeed_config_class():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig


@pytest.mark.torch
@pytest.mark.parametrize("case", GOLDEN_CASES, ids=[case[0] for case in GOLDEN_CASES])
def test_deepspeed_accepts_every_emitted_config(deepspeed_config_class, case):
    config, plan = golden_config(case)
    tp, pp, dp = ds.plan_layout(plan, job(case[1]).model)
    parsed = ds.validate_with_deepspeed(config, plan.num_devices, tp, pp)
    assert parsed.world_size == dp
    assert parsed.train_batch_size == plan.global_batch
    assert parsed.gradient_accumulation_steps == plan.num_micro_batches
    assert parsed.train_micro_batch_size_per_gpu * dp == plan.micro_batch
    assert parsed.zero_optimization_stage == config["zero_optimization"]["stage"]
    assert parsed.bfloat16_config.enabled == (plan.precision == "bf16")


@pytest.mark.torch
@pytest.mark.parametrize("job_name,uniform,target", ROUND_TRIPS, ids=[f"{c[1]}-{c[2]}" for c in ROUND_TRIPS])
def test_deepspeed_accepts_round_trip_configs_merged_into_a_user_config(deepspeed_config_class, job_name, uniform,
                                                                         target):
    plan = gbmw.uniform_plan(job(job_name), uniform)
    tp, pp, dp = ds.plan_layout(plan, job(job_name).model)
    merged, _ = ds.merge_into_user_config(USER_CONFIG, ds.plan_to_ds_config(plan, job(job_name), target))
    assert ds.validate_with_deepspeed(merged, plan.num_devices, tp, pp).world_size == dp


@pytest.mark.torch
def test_deepspeed_validation_is_real(deepspeed_config_class):
    import deepspeed.comm as ds_comm

    config, plan = golden_config(GOLDEN_CASES[0])  # valid for 32 devices as tp=8 x pp=2 (DP 2)
    get_rank = ds_comm.get_rank
    with pytest.raises(GbmwError, match=r"train_batch_size: .* 1000 != 1 \* 512 \* 2"):
        ds.validate_with_deepspeed({**config, "train_batch_size": 1000}, 32, 8, 2)
    with pytest.raises(GbmwError, match=r"1024 != 1 \* 512 \* 16"):  # same config, wrong DP: refused
        ds.validate_with_deepspeed(config, 32, 1, 2)
    bad_zero = {**config, "zero_optimization": {**config["zero_optimization"], "stage3_bogus": 1}}
    with pytest.raises(GbmwError, match=r"zero_optimization.stage3_bogus: Extra inputs are not permitted"):
        ds.validate_with_deepspeed(bad_zero, 32, 8, 2)
    assert ds_comm.get_rank is get_rank  # the stand-in is gone ...
    with pytest.raises(AssertionError, match=r"1024 != 1 \* 512 \* 1"):  # ... and DeepSpeed falls back to 1 again
        deepspeed_config_class(copy.deepcopy(config))


@pytest.mark.torch
def test_partition_functions_match_deepspeeds(deepspeed_config_class):
    from deepspeed.runtime import utils as ds_utils

    def counts(bounds):
        return [int(b - a) for a, b in zip(bounds, bounds[1:])]

    bert, gpt = job(BERT).model, job(GPT).model
    weight_sets = [
        [layer.parameter_count for layer in bert.layers],
        [layer.parameter_count for layer in gpt.layers],
        [0 if layer.kind in ("embedding", "head") else 1 for layer in gpt.layers],
        [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5],
        [1, 1],
    ]
    for weights in weight_sets:
        for parts in (1, 2, 3, 4, 8, 16):
            assert ds.deepspeed_partition_balanced(weights, parts) == counts(
                ds_utils.partition_balanced(weights, parts)), (weights, parts)
            assert ds.deepspeed_partition_uniform(len(weights), parts) == counts(
                ds_utils.partition_uniform(len(weights), parts))


@pytest.mark.torch
def test_config_files_with_comments_load_as_deepspeed_reads_them(deepspeed_config_class, tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text('{\n  // DeepSpeed reads configs with hjson\n  "train_micro_batch_size_per_gpu": 2,\n}\n')
    assert ds.load_user_config(path) == {"train_micro_batch_size_per_gpu": 2}


@pytest.mark.torch
def test_deepspeeds_accelerator_line_does_not_precede_gbmws_one_line():
    """issue 31: DeepSpeed's "Setting accelerator to CPU" log line came before tune's error. gbmw's command line
    drops it (and only it) from DeepSpeed's logger. Catches: the line back on a CPU machine, checked in a fresh
    interpreter as a command would run."""
    code = ("from gbmw.cli.main import _quiet_framework_noise\n_quiet_framework_noise()\n"
            "from deepspeed.accelerator import get_accelerator\nget_accelerator()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Setting accelerator" not in done.stdout + done.stderr


# ----------------------------------------------------------------------------------------------
# DeepSpeed's refusals named by key; the engine check's stand-in world (no torch needed)
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("message, config, key", [
    # DeepSpeed quotes the key it means; 'gradient_clipping' is quoted too, later: the first quoted one wins
    ("'max_grad_norm' is not supported as an optimizer parameter, please switch to using the deepspeed parameter "
     "'gradient_clipping'", {"optimizer": {"params": {"max_grad_norm": 1.0}}, "gradient_clipping": 1.0},
     "optimizer.params.max_grad_norm"),
    # a removed section named in quotes, although `block` (one of its keys) is a word of the message too
    ("DeepSpeed Sparse Attention has been removed; the 'sparse_attention' configuration block is no longer supported",
     {"sparse_attention": {"mode": "fixed", "block": 16}}, "sparse_attention"),
    # a DeepSpeed key the config leaves at its default
    ('You are using ZeRO-Offload with a client provided optimizer. ... set <"zero_force_ds_cpu_optimizer": false>',
     {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}, "zero_force_ds_cpu_optimizer"),
    # a text value: the optimizer's type
    ("OnebitAdam is not a supported DeepSpeed Optimizer", {"optimizer": {"type": "OnebitAdam"}}, "optimizer.type"),
])
def test_deepspeed_refusals_name_the_key(message, config, key):
    from gbmw.adapters.deepspeed.validation import _describe_deepspeed_error

    known = {"zero_force_ds_cpu_optimizer", "gradient_clipping", "optimizer"}
    assert _describe_deepspeed_error(ValueError(message), config, known) == f"{key}: {message}"


def test_the_engine_checks_stand_in_world_restates_only_what_one_process_cannot_hold():
    from gbmw.adapters.deepspeed.engine_check import stand_in_config

    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
              "sequence_parallel_size": 2, "tensor_parallel": {"autotp_size": 2}, "gradient_clipping": "auto",
              "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.1}},
              "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
    started, notes = stand_in_config(config)
    assert started["train_batch_size"] == 8 and started["sequence_parallel_size"] == 1
    assert started["tensor_parallel"]["autotp_size"] == 1
    assert started["optimizer"]["params"] == {"lr": 5e-5, "weight_decay": 0.1} and started["gradient_clipping"] == 1.0
    assert started["zero_optimization"] == config["zero_optimization"]  # the rest as written
    assert config["train_batch_size"] == 64  # the caller's config is not changed
    assert len(notes) == 4
