"""`gbmw tune`: a drop-in ds_config and launch line for an existing job; the user's file is never touched."""

import json
import subprocess
import sys

import pytest

from gbmw.cli import main

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
    result = subprocess.run([sys.executable, "-m", "gbmw.cli", *args], capture_output=True, text=True, timeout=180)
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
