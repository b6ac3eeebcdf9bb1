"""What the CLI prints for every bundled job, for golden files: a change that is meant to leave plans and
estimates alone (a restructuring) must leave these bytes alone.

    python tests/bundled_outputs.py --write   # record tests/golden/bundled/<job>.json
    python tests/bundled_outputs.py           # compare, printing every job that differs (exit 1 if any)
    python tests/bundled_outputs.py --quick   # the same without the --approximate plans

Each job's record holds, as the CLI prints them with `--json`: `gbmw plan JOB` for every target (the exact search,
the default), `gbmw plan JOB --approximate` (for APPROXIMATE_JOBS), `gbmw compare JOB`, and `gbmw compare JOB --handtuned NAME` for each published configuration
that applies to the job's model. Wall-clock fields (`search_s`) are removed; a command that fails is
recorded by its exit status and its one-line error.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

from gbmw.cli.main import main as gbmw_main

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "bundled"
TARGETS = ("runtime", "deepspeed", "megatron-deepspeed", "megatron-core")


def bundled_jobs() -> list[str]:
    return sorted(path.stem for path in (ROOT / "recipes" / "jobs").glob("*.yaml"))


def handtuned_for(job: str) -> list[str]:
    """The published configurations whose `applies_to` model is the job's (a job is named MODEL_CLUSTER)."""
    import yaml

    model = job.split("_")[0]
    names = []
    for path in sorted((ROOT / "recipes" / "handtuned").glob("*.yaml")):
        if yaml.safe_load(path.read_text()).get("applies_to") == model:
            names.append(path.stem)
    return names


def _without_wall_clock(value):
    if isinstance(value, dict):
        return {key: _without_wall_clock(item) for key, item in value.items() if key != "search_s"}
    if isinstance(value, list):
        return [_without_wall_clock(item) for item in value]
    return value


def run_cli(*argv: str) -> dict:
    """`gbmw ARGV` in this process: {"status", "json"} on success, {"status", "error"} otherwise."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = gbmw_main(list(argv))
    if status != 0:
        return {"status": status, "error": err.getvalue().strip()}
    return {"status": status, "json": _without_wall_clock(json.loads(out.getvalue()))}


APPROXIMATE_JOBS = {"bert-huge-32_rtx-titan-x8", "bert-huge-48_rtx-titan-x8", "gpt-tiny_cpu-x4", "gpt3-39b_a100-80g-x32",
              "gpt3-65b_a100-80g-x32", "gpt3-65b_h100-80g-x64", "llama-7b_a100-2x8", "llama-7b_a100-40g-x64",
              "llama-7b_a100-80g-x8", "t5-large-32_rtx-titan-x8", "t5-large-48_rtx-titan-x8", "vit-huge-32_rtx-titan-x8",
              "vit-xhuge_a100-40g-x64"}
"""Jobs whose `--approximate` plan is recorded beside the default (exact) ones."""


def job_outputs(job: str, approximate: bool = True, compare: bool = True) -> dict:
    """Every recorded output of `job`; `compare=False` leaves out `gbmw compare` and the hand-tuned compares."""
    record = {f"plan --target {target}": run_cli("plan", job, "--target", target, "--json") for target in TARGETS}
    if approximate and job in APPROXIMATE_JOBS:
        record["plan --approximate"] = run_cli("plan", job, "--approximate", "--json")
    if not compare:
        return record
    record["compare"] = run_cli("compare", job, "--json")
    for name in handtuned_for(job):
        record[f"compare --handtuned {name}"] = run_cli("compare", job, "--handtuned", name, "--json")
    return record


def differences(old, new, path: str = "") -> list[str]:
    """`path: old -> new` for every leaf where two records differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [line for key in sorted(set(old) | set(new), key=str)
                for line in differences(old.get(key), new.get(key), f"{path}/{key}")]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [line for index, (a, b) in enumerate(zip(old, new)) for line in differences(a, b, f"{path}[{index}]")]
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def dumps(record: dict) -> str:
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="record the golden files instead of comparing")
    parser.add_argument("--quick", action="store_true", help="compare everything but the --approximate plans")
    parser.add_argument("jobs", nargs="*", help="jobs to record or check (default: every bundled job)")
    args = parser.parse_args()
    differing = []
    for job in args.jobs or bundled_jobs():
        path = GOLDEN / f"{job}.json"
        text = dumps(job_outputs(job, approximate=args.write or not args.quick))
        if args.write:
            GOLDEN.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}", flush=True)
            continue
        expected = json.loads(path.read_text()) if path.exists() else {}
        if args.quick:
            expected.pop("plan --approximate", None)
        lines = differences(expected, json.loads(text))
        print(f"{'DIFFERS' if lines else 'same'}: {job}", *(f"  {line}" for line in lines[:20]), sep="\n", flush=True)
        differing += [job] if lines else []
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
