"""`gbmw tune`: a drop-in ds_config and launch line for an existing job; the user's file is never touched."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gbmw.cli.main import main

USER_CONFIG = {
    "train_batch_size": 1536,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 192,
    "optimizer": {"type": "Adam", "params": {"lr": 1.2e-4, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2000}},
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "none"}},
    "my_team_key": {"anything": [1, 2, 3]},
}


def write_user_config(tmp_path, config=USER_CONFIG):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


@pytest.mark.torch
def test_tune_writes_a_drop_in_config_and_launch_line(tmp_path, capsys):
    user = write_user_config(tmp_path)
    before = user.read_bytes()
    out = tmp_path / "tuned"
    assert main(["tune", "--ds-config", str(user), "--model", "gpt3-39b", "--cluster", "a100-80g-x32",
                 "--target", "megatron-deepspeed", "--current-tp", "8", "--current-pp", "2", "--current-ckpt", "full",
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert user.read_bytes() == before  # the user's file is untouched
    assert sorted(p.name for p in out.iterdir()) == ["ds_config.json", "launch.sh", "megatron_args.txt", "plan.yaml"]
    tuned = json.loads((out / "ds_config.json").read_text())
    for key in ("optimizer", "scheduler", "gradient_clipping", "my_team_key"):
        assert tuned[key] == USER_CONFIG[key]
    assert tuned["zero_optimization"]["offload_optimizer"] == {"device": "none"}
    assert tuned["train_batch_size"] == 1536
    args = (out / "megatron_args.txt").read_text().split()
    tp = int(args[args.index("--tensor-model-parallel-size") + 1])
    pp = int(args[args.index("--pipeline-model-parallel-size") + 1])
    micro = int(args[args.index("--micro-batch-size") + 1])
    assert tuned["train_micro_batch_size_per_gpu"] == micro
    assert micro * tuned["gradient_accumulation_steps"] * (32 // (tp * pp)) == 1536
    assert f"--zero-stage {tuned['zero_optimization']['stage']}" in (out / "launch.sh").read_text()
    assert "estimated speed-up:" in printed and "current: tp=8,pp=2,zero=0,ckpt=full,micro=4" in printed


def run(*args):
    result = subprocess.run([sys.executable, "-m", "gbmw.cli.main", *args], capture_output=True, text=True, timeout=180)
    return result.returncode, result.stderr


@pytest.mark.parametrize(
    "config_text, extra, message",
    [
        ("{not json", [], "not valid JSON"),
        (json.dumps({**USER_CONFIG, "train_batch_size": 1000}), [], "inconsistent batch sizes: train_batch_size(1000)"),
        (json.dumps(USER_CONFIG), ["--target", "runtime"], "gbmw train JOB --plan plan.yaml"),
        (json.dumps(USER_CONFIG), ["--model", "no-such-model"], "model 'no-such-model': no such file"),
        (json.dumps({**USER_CONFIG, "zero_optimization": {"stage": 1, "offload_optimizer": "cpu"}}), [],
         "ds_config.json: DeepSpeed refuses the config: zero_optimization.offload_optimizer"),
        (json.dumps({"zero_optimization": {"stage": 2}}), [], "sets no batch (neither train_batch_size nor "
                                                              "train_micro_batch_size_per_gpu), so it does not say the "
                                                              "global batch; give it with --batch"),
    ],
)
def test_tune_bad_input_is_one_clear_error(tmp_path, config_text, extra, message):
    path = tmp_path / "ds_config.json"
    path.write_text(config_text)
    layout = ["--current-tp", "8", "--current-pp", "2"]  # the layout USER_CONFIG's batch arithmetic assumes
    model = [] if "--model" in extra else ["--model", "gpt3-15b"]
    args = ["tune", "--ds-config", str(path), *model, "--cluster", "a100-80g-x32", *layout, *extra]
    code, err = run(*args)
    assert code == 2 and "Traceback" not in err and message in err


def test_tune_refuses_a_non_empty_output_folder(tmp_path):
    user = write_user_config(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "ds_config.json").write_text("{}")
    code, err = run("tune", "--ds-config", str(user), "--model", "gpt3-15b", "--cluster", "a100-80g-x32",
                    "--current-tp", "8", "--current-pp", "2", "-o", str(out))
    assert code == 2 and "not empty" in err and (out / "ds_config.json").read_text() == "{}"


HF_CONFIGS = Path(__file__).parent / "hf_configs"

HF_TRAINER_CONFIG = {  # the shape of transformers' tests/deepspeed/ds_config_zero2.json
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 2e8,
                          "overlap_comm": True, "reduce_scatter": True, "reduce_bucket_size": "auto",
                          "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}


@pytest.mark.torch
def test_tune_resolves_hf_trainer_auto_values_from_the_plan(tmp_path, capsys):
    user = write_user_config(tmp_path, HF_TRAINER_CONFIG)
    out = tmp_path / "tuned"
    assert main(["tune", "--ds-config", str(user), "--model", str(HF_CONFIGS / "Llama-2-7b-hf.json"),
                 "--cluster", "a100-80g-x32", "--batch", "256", "--seq-length", "2048", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    tuned = json.loads((out / "ds_config.json").read_text())
    micro, accumulation = tuned["train_micro_batch_size_per_gpu"], tuned["gradient_accumulation_steps"]
    assert tuned["train_batch_size"] == 256 == micro * accumulation * 32  # tp = pp = 1 for the deepspeed target
    assert tuned["bf16"]["enabled"] is True and tuned["fp16"]["enabled"] is False
    assert tuned["zero_optimization"]["reduce_bucket_size"] == 4096 * 4096  # HF's hidden² rule
    for key in ("optimizer", "scheduler", "gradient_clipping"):  # HF fills these from TrainingArguments
        assert tuned[key] == HF_TRAINER_CONFIG[key]
    arguments = f"--per_device_train_batch_size {micro} --gradient_accumulation_steps {accumulation} --bf16"
    assert arguments in " ".join(captured.out.split())
    assert arguments in (out / "launch.sh").read_text()
    assert 'planned for bf16' in captured.err and "global batch 256" in captured.out
    # issue 30: HF Trainer cannot run DeepSpeed's pipeline engine — no pipeline, so the TrainingArguments give the
    # config's batch on all 32 devices; the launch line runs a stand-in for the user's script, not Megatron's
    from gbmw.plan import Plan
    assert Plan.load(out / "plan.yaml").pp == 1
    assert " train.py --deepspeed" in (out / "launch.sh").read_text() and "pretrain_gpt.py" not in captured.out
    assert "planned without a pipeline" in captured.err and "give your HF Trainer script with --script" in captured.err


def test_tune_hf_trainer_config_needs_the_batch(tmp_path):
    user = write_user_config(tmp_path, HF_TRAINER_CONFIG)
    code, err = run("tune", "--ds-config", str(user), "--model", "gpt3-15b", "--cluster", "a100-80g-x32")
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1
    assert 'key `train_batch_size`: value "auto" — HF Trainer fills it from TrainingArguments' in err
    assert "--batch" in err


@pytest.mark.torch
@pytest.mark.parametrize("target", ["megatron-deepspeed", "megatron-core"])
def test_tune_an_hf_config_for_megatron_targets(tmp_path, target):
    """The config's `_name_or_path` (meta-llama/Llama-2-7b-hf) names the model; it is not looked up as a recipe."""
    user = write_user_config(tmp_path, {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 1,
                                        "gradient_accumulation_steps": 16, "bf16": {"enabled": True}})
    out = tmp_path / "tuned"
    assert main(["tune", "--ds-config", str(user), "--model", str(HF_CONFIGS / "Llama-2-7b-hf.json"),
                 "--cluster", "a100-80g-x32", "--target", target, "--seq-length", "4096", "-o", str(out)]) == 0
    args = (out / "megatron_args.txt").read_text().split()
    assert args[args.index("--seq-length") + 1] == "4096" and args[args.index("--num-layers") + 1] == "32"


@pytest.mark.torch
def test_tune_replans_a_config_written_for_another_cluster_size(tmp_path, capsys):
    user = write_user_config(tmp_path)  # 1536 = 4 × 192 × DP 2: TP 8 × PP 2 on 32 devices
    assert main(["tune", "--ds-config", str(user), "--model", "gpt3-15b", "--cluster", "a100-80g-x8",
                 "--target", "megatron-deepspeed", "--current-tp", "8"]) == 0
    captured = capsys.readouterr()
    assert "global batch 1536" in captured.out
    assert ("add up for a data-parallel size of 2 (16 devices with TP 8 × PP 1), not on this cluster's 8: written "
            "for another cluster size; re-planned at its global batch 1536 on 8 devices") in captured.err


@pytest.mark.torch
def test_launch_script_runs_from_any_folder(tmp_path):
    user = write_user_config(tmp_path)
    out = tmp_path / "tuned"
    assert main(["tune", "--ds-config", str(user), "--model", "gpt3-15b", "--cluster", "a100-80g-x32",
                 "--target", "megatron-deepspeed", "--current-tp", "8", "--current-pp", "2", "-o", str(out)]) == 0
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "deepspeed").write_text('#!/usr/bin/env bash\nfor a in "$@"; do echo "$a"; done\n')
    (fake / "deepspeed").chmod(0o755)
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(out / "launch.sh")], cwd=elsewhere, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    words = result.stdout.split("\n")
    config = words[words.index("--deepspeed_config") + 1]
    assert config == str(out / "ds_config.json") and json.loads(Path(config).read_text())["train_batch_size"] == 1536


ULYSSES_CONFIG = {  # DeepSpeed's Ulysses (ALST) degree 2: data-parallel size 2 on 4 devices, so 1 × 4 × 2 = 8
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 1}, "sequence_parallel_size": 2,
}


@pytest.mark.torch
@pytest.mark.parametrize("target", ["megatron-deepspeed", "deepspeed"])
def test_tune_reads_the_configs_ulysses_degree_and_writes_the_plans(tmp_path, capsys, target):
    """The config's `sequence_parallel_size` is the current Ulysses degree: costed where the target runs Ulysses,
    named as the reason where it does not; the written config carries the plan's degree, so DeepSpeed's
    data-parallel size (devices / sequence_parallel_size) matches the batch keys."""
    from gbmw.plan import Plan

    user = write_user_config(tmp_path, ULYSSES_CONFIG)
    out = tmp_path / "tuned"
    assert main(["tune", "--ds-config", str(user), "--model", "llama-tiny", "--cluster", "cpu-x4", "--target", target,
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    if target == "megatron-deepspeed":
        assert "current: tp=1,pp=1,zero=1,ckpt=none,ulysses=2,micro=1,batch=8" in printed
    else:
        assert "current: cannot be costed" in printed and "Ulysses (ulysses): deepspeed does not run it" in printed
    plan = Plan.load(out / "plan.yaml")
    ulysses = plan.strategies[0].degree("ulysses")
    tuned = json.loads((out / "ds_config.json").read_text())
    assert tuned["sequence_parallel_size"] == ulysses
    if ulysses != 2:
        assert f"sequence_parallel_size: 2 -> {ulysses}" in printed
    data_parallel = 4 // (plan.strategies[0].tp * plan.pp * ulysses)
    assert tuned["train_micro_batch_size_per_gpu"] * tuned["gradient_accumulation_steps"] * data_parallel == 8


AUTOTP_CONFIG = {  # DeepSpeed AutoTP degree 2 (LLaMA-Factory's ds_z2_autotp): data-parallel size 2 on 4 devices
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 2}, "tensor_parallel": {"autotp_size": 2},
}


@pytest.mark.torch
@pytest.mark.parametrize("target", ["megatron-deepspeed", "deepspeed"])
def test_tune_reads_autotp_as_the_current_tp_and_writes_one(tmp_path, capsys, target):
    """issue 30 (found by the ds_config corpus): `tensor_parallel.autotp_size` was ignored — the current layout was
    read as TP 1, so the config's batch keys (DP = 4 / 2) looked wrong, and the written config kept AutoTP 2 under batch
    keys computed for the plan's DP, which DeepSpeed's engine refuses on the real cluster. It is now the current TP and
    the written config says 1 (neither target's plans split layers with AutoTP), so DP = devices / (TP × PP)."""
    from gbmw.plan import Plan

    user = write_user_config(tmp_path, AUTOTP_CONFIG)
    out = tmp_path / "tuned"
    assert main(["tune", "--ds-config", str(user), "--model", "llama-tiny", "--cluster", "cpu-x4", "--target", target,
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    if target == "megatron-deepspeed":
        assert "current: tp=2,pp=1,zero=2,ckpt=none,micro=1,batch=8" in printed, printed
    else:
        assert "current: cannot be costed" in printed, printed
    plan = Plan.load(out / "plan.yaml")
    tuned = json.loads((out / "ds_config.json").read_text())
    assert tuned["tensor_parallel"] == {"autotp_size": 1} and "tensor_parallel.autotp_size: 2 -> 1" in printed
    data_parallel = 4 // (plan.strategies[0].tp * plan.pp)
    assert tuned["train_micro_batch_size_per_gpu"] * tuned["gradient_accumulation_steps"] * data_parallel == 8


@pytest.mark.torch
def test_tune_costs_a_current_expert_parallel_layout(tmp_path, capsys):
    """`--current` takes --uniform's layout keys: an MoE job's TP 2 with sequence parallelism and EP 2 is costed as
    that layout (megatron-core needs +sp where EP meets TP)."""
    user = write_user_config(tmp_path, {key: value for key, value in ULYSSES_CONFIG.items()
                                        if key != "sequence_parallel_size"} | {"gradient_accumulation_steps": 2})
    assert main(["tune", "--ds-config", str(user), "--model", "llama-moe-tiny", "--cluster", "cpu-x4",
                 "--target", "megatron-core", "--current", "tp=2,sp=on,ep=2"]) == 0
    printed = capsys.readouterr().out
    assert "current: tp=2,pp=1,zero=1,ckpt=none,sp=on,ep=2,micro=1,batch=8,target=megatron-core" in printed
    assert "estimated speed-up:" in printed


@pytest.mark.parametrize("current, extra, message", [
    ("tp=2,micro=2", [], "--current 'tp=2,micro=2': key micro is not a layout key"),
    ("tp=2", ["--current-tp", "2"], "--current: give the current layout there or with --current-tp"),
    ("tp=2,cp=4", [], "--current 'tp=2,cp=4' with the ds_config's sequence_parallel_size 2: tp × pp × cp × ulysses = "
                      "16 must divide the cluster's 4 devices"),
    ("tp=8,ulysses=1", [], "--current 'tp=8,ulysses=1': tp × pp × cp × ulysses = 8 must divide the cluster's 4"),
])
def test_tune_current_layout_bad_input_is_one_line(tmp_path, current, extra, message):
    user = write_user_config(tmp_path, ULYSSES_CONFIG)
    code, err = run("tune", "--ds-config", str(user), "--model", "llama-moe-tiny", "--cluster", "cpu-x4",
                    "--current", current, *extra)
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1 and message in err, err


@pytest.mark.torch
def test_tune_a_config_without_batch_keys_at_the_given_batch(tmp_path, capsys):
    """issue 30: a ds_config that sets no batch key was refused, with --batch too. With --batch it is planned at
    that batch and the written config gets all three batch keys, consistent on the cluster."""
    user = write_user_config(tmp_path, {"zero_optimization": {"stage": 2}})
    out = tmp_path / "tuned"
    assert main(["tune", "--ds-config", str(user), "--model", "gpt-tiny", "--cluster", "cpu-x4", "--batch", "16",
                 "-o", str(out)]) == 0
    tuned = json.loads((out / "ds_config.json").read_text())
    assert tuned["train_batch_size"] == 16
    assert tuned["train_batch_size"] == tuned["train_micro_batch_size_per_gpu"] * tuned["gradient_accumulation_steps"] * (
        4 // _pipeline_degree(out))
    assert "sets no batch; planned at --batch 16" in capsys.readouterr().err


def _pipeline_degree(folder) -> int:
    from gbmw.plan import Plan
    return Plan.load(folder / "plan.yaml").pp


@pytest.mark.torch
def test_tune_a_config_without_gradient_accumulation_steps(tmp_path, capsys):
    """issue 30: DeepSpeed derives gradient_accumulation_steps; a config without it that adds up on another
    cluster size (here 1 GPU: 16 = 16 × 1) was refused with "16 * 0 * 4 = 0". It is re-planned at its global
    batch, as a config written for another cluster size is."""
    user = write_user_config(tmp_path, {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 16,
                                        "zero_optimization": {"stage": 1}})
    out = tmp_path / "tuned"
    assert main(["tune", "--ds-config", str(user), "--model", "gpt-tiny", "--cluster", "cpu-x4", "-o", str(out)]) == 0
    assert json.loads((out / "ds_config.json").read_text())["train_batch_size"] == 16
    assert "add up for a data-parallel size of 1" in " ".join(capsys.readouterr().err.split())


@pytest.mark.torch
@pytest.mark.parametrize("target", ["megatron-core", "megatron-deepspeed"])
def test_tune_for_megatron_carries_the_users_optimizer_and_schedule(tmp_path, capsys, target):
    """Issue 30: Megatron builds its own optimizer and schedule, so the user's are restated as flags — in
    megatron_args.txt and the launch line — and what no flag says is a note naming the key."""
    config = {**USER_CONFIG, "optimizer": {"type": "AdamW", "params": {"lr": 6e-5, "betas": [0.9, 0.98], "eps": 1e-6,
                                                                        "weight_decay": 0.05}},
              "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 6e-6, "warmup_max_lr": 6e-5,
                                                                "warmup_num_steps": 300, "total_num_steps": 50000}},
              "gradient_clipping": 0.8}
    user = write_user_config(tmp_path, config)
    out = tmp_path / "tuned"
    assert main(["tune", "--ds-config", str(user), "--model", "gpt3-15b", "--cluster", "a100-80g-x32",
                 "--target", target, "--current-tp", "8", "--current-pp", "2", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    args = (out / "megatron_args.txt").read_text().split()
    value = lambda flag: args[args.index(flag) + 1]  # noqa: E731
    assert (value("--optimizer"), value("--lr"), value("--adam-beta2"), value("--adam-eps"), value("--weight-decay"),
            value("--lr-decay-style"), value("--lr-warmup-iters"), value("--lr-decay-iters"), value("--min-lr"),
            value("--clip-grad")) == ("adam", "6e-05", "0.98", "1e-06", "0.05", "linear", "300", "50000", "6e-06", "0.8")
    launch = (out / "launch.sh").read_text()
    assert "--lr 6e-05 --lr-decay-style linear --lr-warmup-iters 300" in launch
    notes = " ".join(captured.err.split())
    assert "`scheduler.params.warmup_type` is not carried" in notes  # DeepSpeed's default log warm-up
    if target == "megatron-core":
        assert value("--lr-warmup-init") == "6e-06"
        assert "settings not restated as its arguments: `my_team_key`" in notes
    else:  # Megatron-DeepSpeed warms up from 0; DeepSpeed reads the rest of the config itself
        assert "--lr-warmup-init" not in args and "the warm-up starts at 6e-06" in notes
        assert "my_team_key" not in notes
