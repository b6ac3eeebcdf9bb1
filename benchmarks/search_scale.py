"""How the default (exact) search grows with devices and layers (issue 29's scale target).

    .venv/bin/python benchmarks/search_scale.py                 # every case (10-30 minutes on one core)
    .venv/bin/python benchmarks/search_scale.py --devices 1024  # the target case alone
    .venv/bin/python benchmarks/search_scale.py --base /tmp/base   # each case beside another checkout's gbmw

GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, hidden 12288, 96 heads, 2048 tokens, the GPT-2 vocabulary) at
its published batch of 1536 sequences, bf16 Adam, on A100-80GB nodes of 8 (the bundled a100-80g-x32 cluster's
devices and links, with as many nodes as the case needs), searched by `Planner(job).run()` — what `gbmw plan` runs:
the runtime target, the default variant, exact. Each case runs in a child process pinned to one core, which reports
its search seconds and its peak resident memory (ru_maxrss: the whole process, Python, numpy and numba included).
Cases: 256 → 4096 devices at 96 layers, and 48 and 192 layers (the same widths) at 1024 devices. Target (issue 29):
175B on 1024 devices in at most 10 s and 2 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

DEVICE_COUNTS = (256, 512, 1024, 2048, 4096)
LAYER_COUNTS = (48, 192)
TARGET_DEVICES, TARGET_LAYERS, TARGET_S, TARGET_MIB = 1024, 96, 10.0, 2048
GLOBAL_BATCH = 1536
"""GPT-3's batch: 3.2M tokens of 2048 (Brown et al. 2020, Table 2.1)."""


def scaled_job(devices: int, layers: int):
    """GPT-3 175B (with `layers` Transformer blocks) on `devices` A100-80GB, from the bundled GPT-3 65B job."""
    from gbmw.specs.architectures import GPTArchitecture
    from gbmw.specs.jobs import load_job
    from gbmw.specs.models import build_model

    base = load_job("gpt3-65b_a100-80g-x32")
    architecture = GPTArchitecture(name=f"gpt3-175b-{layers}l", family="gpt", num_layers=layers, hidden_size=12288,
                                   num_heads=96, seq_length=2048, vocab_size=50257)
    intra, inter = base.cluster.links
    cluster = base.cluster.model_copy(update={
        "name": f"a100-80g-x{devices}", "nodes": devices // base.cluster.devices_per_node,
        "links": (intra, inter.model_copy(update={"devices": devices}))})
    return base.model_copy(update={"name": f"gpt3-175b-{layers}l_a100-80g-x{devices}", "cluster": cluster,
                                   "model": build_model(architecture, base.precision), "global_batch": GLOBAL_BATCH})


def run_one(devices: int, layers: int) -> dict:
    """Search one case in this process; its seconds, peak resident memory and plan."""
    import resource

    from gbmw.search.planner import NothingFitsError, Planner

    job = scaled_job(devices, layers)
    planner = Planner(job, explain_failure=False)
    started = time.perf_counter()
    try:
        plan = planner.run()
    except NothingFitsError:
        plan = None
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"devices": devices, "layers": layers, "seconds": seconds, "peak_mib": peak_mib,
            "settings": planner.stats.settings_total,
            "plan": None if plan is None else f"pp {plan.pp}, {plan.strategies[1].name}",
            "samples_per_s": None if plan is None else plan.estimate.samples_per_s}


def run_child(devices: int, layers: int, limit_s: float, checkout: str | None = None) -> dict | None:
    """`run_one` in a fresh process (its own peak memory), with the gbmw of `checkout` if given (first on its
    PYTHONPATH), stopped after `limit_s` (None then)."""
    command = [sys.executable, __file__, "--one", str(devices), str(layers)]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout)) if checkout else None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s, check=True, env=env)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="*", default=list(DEVICE_COUNTS),
                        help="device counts at 96 layers (multiples of 8)")
    parser.add_argument("--layers", type=int, nargs="*", default=list(LAYER_COUNTS),
                        help=f"other layer counts at {TARGET_DEVICES} devices")
    parser.add_argument("--limit-s", type=float, default=600.0, help="stop a case after this many seconds")
    parser.add_argument("--base", help="also run every case with the gbmw of this checkout (e.g. `git worktree add "
                                           "/tmp/base main`), case by case beside this one")
    parser.add_argument("--one", type=int, nargs=2, metavar=("DEVICES", "LAYERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(*args.one)))
        return 0
    console = Console(highlight=False, width=140)
    for checkout in (None, args.base) if args.base else (None,):
        run_child(8, 4, args.limit_s, checkout)  # numba's cache loaded or compiled once, not counted below
    cases = [(devices, TARGET_LAYERS) for devices in args.devices]
    cases += [(TARGET_DEVICES, layers) for layers in args.layers if args.devices == list(DEVICE_COUNTS)]
    table = Table(title=f"GPT-3 175B widths, batch {GLOBAL_BATCH}: the default (exact) search on one core")
    for column in ("devices", "layers", "gbmw", "settings", "search s", "peak MiB", "samples/s", "plan"):
        table.add_column(column, justify="left" if column in ("gbmw", "plan") else "right")
    results = {}
    for devices, layers in cases:
        for label, checkout in [("this checkout", None)] + ([(f"base {args.base}", args.base)] if args.base else []):
            result = run_child(devices, layers, args.limit_s, checkout)
            if checkout is None:
                results[devices, layers] = result
            if result is None:
                table.add_row(str(devices), str(layers), label, "", f"> {args.limit_s:.0f}", "", "", "stopped")
                continue
            table.add_row(str(devices), str(layers), label, str(result["settings"]), f"{result['seconds']:.2f}",
                          f"{result['peak_mib']:.0f}",
                          "OOM" if result["plan"] is None else f"{result['samples_per_s']:.2f}", result["plan"] or "")
    console.print(table)
    target = results.get((TARGET_DEVICES, TARGET_LAYERS))
    if target is not None:
        passed = target["seconds"] <= TARGET_S and target["peak_mib"] <= TARGET_MIB
        console.print(f"target: {TARGET_DEVICES} devices, {TARGET_LAYERS} layers in {target['seconds']:.2f} s "
                      f"(≤ {TARGET_S:.0f} s) and {target['peak_mib']:.0f} MiB (≤ {TARGET_MIB} MiB): "
                      f"{'PASS' if passed else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
