"""Regenerate the GPT-3 15B / 39B / 65B recipes for Megatron-DeepSpeed on 4 × 8 A100-80GB.

    .venv/bin/python recipes/gpt3/regenerate.py [--check]

For each of recipes/jobs/gpt3-{15b,39b,65b}_a100-80g-x32.yaml it plans with --target megatron-deepspeed
at the job's global batch and writes recipes/gpt3/<model>/: plan.yaml, ds_config.json (base_ds_config.json —
an ordinary user's optimizer, scheduler and logging — with gbmw's parallel keys merged in), megatron_args.txt
(the plan's arguments, then the ds_config's optimizer, schedule, clipping and logging restated as Megatron flags:
Megatron-DeepSpeed gives DeepSpeed its own optimizer and schedule, which win over the config's) and launch.sh (the
whole run: the named variables at its top, checked, then data, tokenizer, length of training and checkpointing
flags after megatron_args.txt's). `--check` regenerates into memory and exits 1 if any checked-in file differs
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


VARIABLES = (  # (name, what to set it to, the test it must pass, what is wrong when it does not)
    ("MEGATRON_DEEPSPEED_DIR", "a checkout of https://github.com/microsoft/Megatron-DeepSpeed",
     '-f "$MEGATRON_DEEPSPEED_DIR/pretrain_gpt.py"', "has no pretrain_gpt.py"),
    ("DATA_PATH", "the prefix of tokenized data, a .bin/.idx pair (its tools/preprocess_data.py writes them)",
     '-f "$DATA_PATH.bin" && -f "$DATA_PATH.idx"', "is not the prefix of a .bin and an .idx file"),
    ("VOCAB_FILE", "the GPT-2 BPE vocabulary (gpt2-vocab.json)", '-f "$VOCAB_FILE"', "is not a file"),
    ("MERGE_FILE", "the GPT-2 BPE merges (gpt2-merges.txt)", '-f "$MERGE_FILE"', "is not a file"),
    ("HOSTFILE", "DeepSpeed's hostfile, one line per node: HOST slots=8", '-f "$HOSTFILE"', "is not a file"),
    ("CHECKPOINT_DIR", "the folder checkpoints are saved to and resumed from", '-n "$CHECKPOINT_DIR"', "is empty"),
)
DATA_ARGUMENTS = ("--data-path", "$DATA_PATH", "--split", "949,50,1", "--tokenizer-type", "GPT2BPETokenizer",
                  "--vocab-file", "$VOCAB_FILE", "--merge-file", "$MERGE_FILE")
RUN_ARGUMENTS = ("--train-iters", "$TRAIN_ITERS", "--save", "$CHECKPOINT_DIR", "--load", "$CHECKPOINT_DIR",
                 "--save-interval", "$SAVE_INTERVAL", "--eval-interval", "$EVAL_INTERVAL", "--eval-iters", "10")
"""What launch.sh adds after megatron_args.txt's flags: data, tokenizer, length of training, checkpoints, evaluation."""


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
    training = megatron.plan_training_arguments(merged, plan, job, TARGET, "base_ds_config.json")
    if training.notes:  # the recipe claims its flags say all the config says
        raise SystemExit("\n".join(training.notes))
    arguments = megatron.plan_to_megatron_args(plan, job, TARGET) + list(training.arguments)
    total_steps = merged["scheduler"]["params"]["total_num_steps"]
    launch = megatron.launch_line(plan, job, "$MEGATRON_DEEPSPEED_DIR/pretrain_gpt.py", TARGET, hostfile="$HOSTFILE",
                                  deepspeed_config="$HERE/ds_config.json",
                                  extra_args=[*training.arguments, *DATA_ARGUMENTS, *RUN_ARGUMENTS])
    return {
        "plan.yaml": plan.to_yaml(),
        "ds_config.json": ds.dumps_config(merged),
        "megatron_args.txt": "\n".join(arguments) + "\n",
        "launch.sh": _launch_script(model, job, launch, total_steps),
    }


def _launch_script(model: str, job, launch: str, total_steps: int) -> str:
    """launch.sh: the named variables (from the environment or edited here), one line and exit 1 for each one
    missing, then the launch line. ds_config.json is found next to the script wherever it is run from."""
    cluster = job.cluster
    lines = [
        "#!/usr/bin/env bash",
        f"# {model} on {cluster.nodes} nodes x {cluster.devices_per_node} {cluster.device.name} with Megatron-DeepSpeed,",
        "# as gbmw planned it (written by recipes/gpt3/regenerate.py). Set the variables below, here or in the",
        "# environment, to paths every node sees; then run this script on the first node.",
        "# Megatron-DeepSpeed gives DeepSpeed its own optimizer and learning-rate schedule, built from the flags:",
        "# --optimizer ... --min-lr restate ds_config.json's `optimizer` and `scheduler` (which DeepSpeed ignores then).",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        "",
    ]
    settings = [(name, "", what) for name, what, _, _ in VARIABLES] + [
        ("TRAIN_ITERS", total_steps, "iterations (of the global batch) to train: the schedule's total_num_steps"),
        ("SAVE_INTERVAL", 1000, "iterations between checkpoints"),
        ("EVAL_INTERVAL", 1000, "iterations between evaluations on the validation split")]
    assignments = [f'{name}="${{{name}:-{default}}}"' for name, default, _ in settings]
    width = max(map(len, assignments)) + 2
    lines += [assignment.ljust(width) + f"# {what}" for assignment, (_, _, what) in zip(assignments, settings)]
    lines.append("")
    for name, what, test, wrong in VARIABLES:
        lines.append(f'[[ {test} ]] || {{ echo "launch.sh: {name} (\'${name}\') {wrong}: set it to {what}" >&2; '
                     "exit 1; }")
    if launch.startswith("CUDA_DEVICE_MAX_CONNECTIONS=1 ") and cluster.nodes > 1:
        lines += ["",
                  "# Sequence parallelism needs CUDA_DEVICE_MAX_CONNECTIONS=1 in every rank (Megatron-DeepSpeed's",
                  "# validate_args). DeepSpeed's launcher carries to the other nodes only the variables of its env file",
                  "# (.deepspeed_env in ~ or here): DS_ENV_FILE names one with yours and this one.",
                  'DS_ENV_FILE="$(mktemp)"; export DS_ENV_FILE',
                  '{ cat ~/.deepspeed_env ./.deepspeed_env 2>/dev/null || true; echo; echo CUDA_DEVICE_MAX_CONNECTIONS=1; } '
                  '| grep "=" > "$DS_ENV_FILE"']
    return "\n".join(lines) + "\n\n" + launch + "\n"


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
