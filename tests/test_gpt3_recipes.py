"""The checked-in GPT-3 Megatron-DeepSpeed recipes are exactly what gbmw generates today."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "recipes" / "gpt3" / "regenerate.py"


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
