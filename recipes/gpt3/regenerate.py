"""Regenerate the GPT-3 15B / 39B / 65B recipes for Megatron-DeepSpeed on 4 × 8 A100-80GB.

    .venv/bin/python recipes/gpt3/regenerate.py [--check]

For each of recipes/jobs/gpt3-{15b,39b,65b}_a100-80g-x32.yaml it plans with --target megatron-deepspeed
at the job's global batch and writes recipes/gpt3/<model>/: plan.yaml, ds_config.json (base_ds_config.json —
an ordinary user's optimizer, scheduler and logging — with gbmw's parallel keys merged in), megatron_args.txt
and launch.sh. `--check` regenerates into memory and exits 1 if any checked-in file differs
(tests/test_gpt3_recipes.py runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = ("gpt3-15b", "gpt3-39b", "gpt3-65b")
TARGET = "megatron-deepspeed"


def render(model: str) -> dict[str, str]:
    from gbmw.adapters import deepspeed as ds
    from gbmw.adapters import megatron
    from gbmw.search.planner import Planner
    from gbmw.specs.jobs import load_job

    job = load_job(f"{model}_a100-80g-x32")
    plan = Planner(job, target=TARGET).run()
    plan = plan.__class__(**{**plan.__dict__, "provenance": {key: value for key, value in plan.provenance.items()
                                                              if key not in ("search_s",)}})
    base = json.loads((HERE / "base_ds_config.json").read_text())
    base["train_batch_size"] = plan.global_batch
    merged, _ = ds.merge_into_user_config(base, ds.plan_to_ds_config(plan, job, TARGET))
    tp, pp, _ = ds.plan_layout(plan, job.model)
    ds.validate_with_deepspeed(merged, job.cluster.num_devices, tp, pp)
    arguments = megatron.plan_to_megatron_args(plan, job, TARGET)
    return {
        "plan.yaml": plan.to_yaml(),
        "ds_config.json": ds.dumps_config(merged),
        "megatron_args.txt": "\n".join(arguments) + "\n",
        # ds_config.json is found next to the script wherever it is run from (your Megatron-DeepSpeed folder)
        "launch.sh": "#!/usr/bin/env bash\n# Add your data, tokenizer and vocabulary arguments at the end.\n"
                     'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
                     + megatron.launch_line(plan, job, "pretrain_gpt.py", TARGET,
                                            deepspeed_config="$HERE/ds_config.json") + "\n",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the checked-in files instead of writing")
    args = parser.parse_args()
    drifted = []
    for model in MODELS:
        folder = HERE / model
        for name, text in render(model).items():
            path = folder / name
            if args.check:
                if not path.exists() or path.read_text() != text:
                    drifted.append(str(path.relative_to(HERE.parent.parent)))
            else:
                folder.mkdir(exist_ok=True)
                temporary = path.with_suffix(path.suffix + ".tmp")
                temporary.write_text(text)
                temporary.replace(path)  # our own generated recipe: replaced atomically
                print(f"wrote {path.relative_to(HERE.parent.parent)}")
    if drifted:
        print("recipes drifted from what gbmw generates (run recipes/gpt3/regenerate.py): " + ", ".join(drifted))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
