"""The checked-in GPT-3 Megatron-DeepSpeed recipes are exactly what gbmw generates today, and each launch.sh runs as
written once its named variables are set: it stops with one line for each one missing, and its launch line passes
Megatron-DeepSpeed's own parse_args + validate_args with the ds_config's optimizer and schedule restated."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "recipes" / "gpt3" / "regenerate.py"
MODELS = ("gpt3-15b", "gpt3-39b", "gpt3-65b")
NAMED = ("MEGATRON_DEEPSPEED_DIR", "DATA_PATH", "VOCAB_FILE", "MERGE_FILE", "HOSTFILE", "CHECKPOINT_DIR")


def test_gpt3_recipes_do_not_drift():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpt3_recipes_are_complete():
    for model in ("gpt3-15b", "gpt3-39b", "gpt3-65b"):
        folder = SCRIPT.parent / model
        assert sorted(p.name for p in folder.iterdir()) == ["ds_config.json", "launch.sh", "megatron_args.txt",
                                                            "plan.yaml"]


def test_gpt3_recipes_agree_between_ds_config_and_megatron_arguments():
    import json

    for model in ("gpt3-15b", "gpt3-39b", "gpt3-65b"):
        folder = SCRIPT.parent / model
        config = json.loads((folder / "ds_config.json").read_text())
        args = (folder / "megatron_args.txt").read_text().split()
        value = lambda flag: int(args[args.index(flag) + 1])  # noqa: E731
        assert value("--zero-stage") == config.get("zero_optimization", {}).get("stage", 0)
        assert value("--global-batch-size") == config["train_batch_size"]
        assert value("--micro-batch-size") == config["train_micro_batch_size_per_gpu"]
        # Megatron-DeepSpeed's validate_args: data_parallel_size = world // (pp * tp * ds_sequence_parallel_size)
        ulysses = value("--ds-sequence-parallel-size") if "--ds-sequence-parallel-size" in args else 1
        data_parallel = 32 // (value("--tensor-model-parallel-size") * value("--pipeline-model-parallel-size")
                               * ulysses)
        assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"]
                                              * config["gradient_accumulation_steps"] * data_parallel)
        assert "optimizer" in config and "scheduler" in config  # the user's keys survive
        launch = (folder / "launch.sh").read_text()
        assert '--deepspeed_config "$HERE/ds_config.json"' in launch and "--num_nodes 4 --num_gpus 8" in launch
        assert 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"' in launch  # runs from any folder
        # megatron_args.txt's flags (the config found next to the script), then the run's own
        assert " ".join(args).replace("ds_config.json", '"$HERE/ds_config.json"') in launch
        # issue 30: Megatron-DeepSpeed's own optimizer and schedule win over the config's, so they are restated
        optimizer, schedule = config["optimizer"]["params"], config["scheduler"]["params"]
        number = lambda flag: float(args[args.index(flag) + 1])  # noqa: E731
        assert args[args.index("--optimizer") + 1] == "adam" and config["optimizer"]["type"] == "Adam"
        assert [number("--adam-beta1"), number("--adam-beta2")] == optimizer["betas"]
        assert (number("--adam-eps"), number("--weight-decay")) == (optimizer["eps"], optimizer["weight_decay"])
        assert (number("--lr"), number("--min-lr")) == (schedule["warmup_max_lr"], schedule["warmup_min_lr"])
        assert args[args.index("--lr-decay-style") + 1] == "linear" and config["scheduler"]["type"] == "WarmupDecayLR"
        assert (value("--lr-warmup-iters"), value("--lr-decay-iters")) == (schedule["warmup_num_steps"],
                                                                            schedule["total_num_steps"])
        assert schedule["warmup_type"] == "linear"  # Megatron warms up linearly
        assert number("--clip-grad") == config["gradient_clipping"] and value("--log-interval") == config["steps_per_print"]


def run_launch(model: str, folder: Path, unset: str | None = None) -> subprocess.CompletedProcess:
    """Run the recipe's launch.sh with its named variables set to example files in `folder` (`unset` left empty) and
    a stand-in `deepspeed` on PATH that prints each argument on its own line, after its environment file's lines."""
    for name in ("data.bin", "data.idx", "vocab.json", "merges.txt", "hostfile", "megatron/pretrain_gpt.py",
                 "bin/deepspeed"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).touch()
    (folder / "bin" / "deepspeed").write_text('#!/usr/bin/env bash\n[ -z "${DS_ENV_FILE:-}" ] || sed "s/^/env: /" '
                                              '"$DS_ENV_FILE"\nfor a in "$@"; do echo "$a"; done\n')
    (folder / "bin" / "deepspeed").chmod(0o755)
    values = {"MEGATRON_DEEPSPEED_DIR": folder / "megatron", "DATA_PATH": folder / "data", "VOCAB_FILE":
              folder / "vocab.json", "MERGE_FILE": folder / "merges.txt", "HOSTFILE": folder / "hostfile",
              "CHECKPOINT_DIR": folder / "checkpoints"}
    environment = {key: value for key, value in os.environ.items() if key not in NAMED and key != "DS_ENV_FILE"}
    environment.update({name: str(value) for name, value in values.items() if name != unset},
                       PATH=f"{folder / 'bin'}:{os.environ['PATH']}", HOME=str(folder))
    return subprocess.run(["bash", str(SCRIPT.parent / model / "launch.sh")], cwd=folder, env=environment,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("model", MODELS)
def test_launch_script_stops_with_one_line_for_each_missing_variable(tmp_path, model):
    for name in NAMED:
        result = run_launch(model, tmp_path, unset=name)
        assert result.returncode == 1 and result.stdout == "", name  # deepspeed never started
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"launch.sh: {name} ('')"), result.stderr


@pytest.mark.parametrize("model", MODELS)
def test_launch_script_runs_the_whole_job(tmp_path, model):
    result = run_launch(model, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    words = [line for line in lines if not line.startswith("env: ")]
    script = words.index(str(tmp_path / "megatron" / "pretrain_gpt.py"))
    assert words[:script] == ["--hostfile", str(tmp_path / "hostfile"), "--num_nodes", "4", "--num_gpus", "8"]
    arguments = words[script + 1:]
    value = lambda flag: arguments[arguments.index(flag) + 1]  # noqa: E731
    assert value("--data-path") == str(tmp_path / "data") and value("--vocab-file") == str(tmp_path / "vocab.json")
    assert value("--merge-file") == str(tmp_path / "merges.txt") and value("--tokenizer-type") == "GPT2BPETokenizer"
    assert value("--save") == value("--load") == str(tmp_path / "checkpoints")
    assert value("--train-iters") == "300000" and value("--save-interval") == "1000"
    assert value("--deepspeed_config") == str(SCRIPT.parent / model / "ds_config.json")
    if "--sequence-parallel" in arguments:  # on every node: DeepSpeed's launcher carries its env file's variables
        assert "env: CUDA_DEVICE_MAX_CONNECTIONS=1" in lines


def _megatron_deepspeed_checkout() -> Path:
    path = os.environ.get("MEGATRON_DEEPSPEED")
    if not path or not (Path(path) / "megatron" / "arguments.py").is_file():
        pytest.skip("MEGATRON_DEEPSPEED names no microsoft/Megatron-DeepSpeed checkout "
                    "(benchmarks/megatron_deepspeed_arguments.py says how to make one)")
    return Path(path)


@pytest.mark.torch
@pytest.mark.parametrize("model", MODELS)
def test_launch_line_passes_megatron_deepspeeds_own_parser(tmp_path, model):
    """The launch line launch.sh runs (variables set) through Megatron-DeepSpeed's parse_args + validate_args as rank
    0 of 32 sees it; the parsed run is complete (data, tokenizer, length, learning rate, checkpoints), and Megatron-
    DeepSpeed's own OptimizerParamScheduler for the parsed flags gives DeepSpeed's WarmupDecayLR rates for the
    ds_config, one step apart: Megatron's rate after k steps is DeepSpeed's after k + 1 (DeepSpeed's scheduler
    counts from 0)."""
    pytest.importorskip("deepspeed")
    checkout = _megatron_deepspeed_checkout()
    result = run_launch(model, tmp_path)
    lines = [line for line in result.stdout.splitlines() if not line.startswith("env: ")]
    environment = dict(line[len("env: "):].split("=", 1) for line in result.stdout.splitlines()
                       if line.startswith("env: "))
    argv = lines[lines.index(str(tmp_path / "megatron" / "pretrain_gpt.py")) + 1:]
    config = json.loads((SCRIPT.parent / model / "ds_config.json").read_text())
    job = {"checkout": str(checkout), "argv": argv, "world_size": 32, "environment": environment, "ds_config": config}
    checked = subprocess.run([sys.executable, str(Path(__file__).parent / "megatron_deepspeed_launch_check.py")],
                             input=json.dumps(job), capture_output=True, text=True, timeout=600)
    assert checked.returncode == 0, checked.stderr[-3000:]
    answer = json.loads(checked.stdout.strip().splitlines()[-1])
    assert "refused" not in answer, answer.get("refused")
    parsed, schedule = answer["parsed"], config["scheduler"]["params"]
    assert parsed["data_path"] == [str(tmp_path / "data")] and parsed["tokenizer_type"] == "GPT2BPETokenizer"
    assert parsed["vocab_file"] and parsed["merge_file"] and parsed["train_iters"] == 300000
    assert parsed["save"] == parsed["load"] == str(tmp_path / "checkpoints") and parsed["save_interval"] == 1000
    assert (parsed["lr"], parsed["min_lr"], parsed["lr_decay_style"]) == (schedule["warmup_max_lr"],
                                                                          schedule["warmup_min_lr"], "linear")
    assert (parsed["lr_warmup_iters"], parsed["lr_decay_iters"]) == (schedule["warmup_num_steps"],
                                                                     schedule["total_num_steps"])
    optimizer = config["optimizer"]["params"]
    assert [parsed["adam_beta1"], parsed["adam_beta2"]] == optimizer["betas"]
    assert (parsed["adam_eps"], parsed["weight_decay"]) == (optimizer["eps"], optimizer["weight_decay"])
    assert parsed["clip_grad"] == config["gradient_clipping"] and parsed["log_interval"] == config["steps_per_print"]
    assert parsed["deepspeed"] and parsed["deepspeed_config"] == str(SCRIPT.parent / model / "ds_config.json")
    assert parsed["global_batch_size"] == config["train_batch_size"] and parsed["bf16"]
    assert parsed["zero_stage"] == config["zero_optimization"]["stage"]
    assert answer["curves"]["megatron"] == pytest.approx(answer["curves"]["deepspeed"], rel=1e-12, abs=1e-15)
    assert max(answer["curves"]["megatron"]) == pytest.approx(schedule["warmup_max_lr"])  # not trivially flat
    if model == "gpt3-15b":  # a control: without the restated warm-up, the two schedules part
        start = argv.index("--lr-warmup-iters")
        job["argv"] = argv[:start] + argv[start + 2:]
        control = subprocess.run([sys.executable, str(Path(__file__).parent / "megatron_deepspeed_launch_check.py")],
                                 input=json.dumps(job), capture_output=True, text=True, timeout=600)
        curves = json.loads(control.stdout.strip().splitlines()[-1])["curves"]
        assert curves["megatron"] != pytest.approx(curves["deepspeed"], rel=1e-3)


@pytest.mark.torch
def test_each_recipe_ds_config_starts_deepspeed_with_megatrons_own_optimizer():
    """Megatron-DeepSpeed hands deepspeed.initialize its own optimizer and schedule beside the recipe's ds_config
    (which also has an `optimizer` section): DeepSpeed's engine starts on each recipe's config so — a pipeline engine
    where the recipe pipelines — and takes one step (one process; adapters/deepspeed/engine_check.py)."""
    pytest.importorskip("deepspeed")
    from gbmw.adapters.deepspeed.engine_check import EngineCase, start_engines

    cases = []
    for model in MODELS:
        folder = SCRIPT.parent / model
        arguments = (folder / "megatron_args.txt").read_text().split()
        pipeline = int(arguments[arguments.index("--pipeline-model-parallel-size") + 1]) > 1
        cases.append(EngineCase(model, json.loads((folder / "ds_config.json").read_text()), pipeline=pipeline,
                                client_optimizer=True))
    outcomes = start_engines(cases)
    assert [(outcome.name, outcome.refusal) for outcome in outcomes] == [(model, None) for model in MODELS], [
        outcome.traceback for outcome in outcomes]
