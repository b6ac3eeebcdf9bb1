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
