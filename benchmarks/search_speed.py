"""How fast gbmw's search is, and how it compares with hetu-galvatron's on the same inputs.

    .venv/bin/python benchmarks/search_speed.py            # our numbers (a few minutes)
    .venv/bin/python benchmarks/search_speed.py --hetu     # + side by side with hetu-galvatron 2.4.0
                                                           #   (benchmarks/setup_hetu_venv.sh installs it)

Prints, each measured in this run on one pinned core:
1. the complete search (all batch sizes, PP degrees, micro-batch counts, bi-objective partitions) for
   the paper's models on 8–64 devices: seconds, settings searched, the plan's samples/s;
2. the target: GPT-3 65B on 64 devices in at most 1.5 s (issue 29) with the default (exact) search, and the same with
   `--approximate` (run in a child process stopped after --exact-limit-s: its time, or that it did not finish);
3. the approximate mode's default memory grid against 1 MiB cells on the bundled jobs (same samples/s?);
4. the paper's 8-device comparison grid (8 models × 4 budgets × every variant and baseline), default (exact) search,
   in at most 45 s (issue 29);
5. with --hetu: both searches for one batch size on the LLaMA-7B jobs, their time ratio, and both plans
   costed by gbmw's estimator;
6. `--exact` on the jobs where it was slowest (issue 13), each in a child process stopped after --exact-limit-s:
   seconds and samples/s; with --base CHECKOUT (e.g. `git worktree add /tmp/base main`) the same run on that
   checkout's gbmw beside it, so a speed-up is measured in one run and the plans' samples/s compared;
7. what `--approximate` gives up: the paper's 8-device grid searched in both modes, cell by cell in one run —
   seconds in all, and how many cells the exact default finds a faster plan for, and by how much;
8. a mixture of experts (issue 26): Mixtral-8x7B on 64 devices, the complete search (batch sweep) in both modes,
   beside its dense twin — the same model with one dense MLP as wide as a token's experts (top-k × expert width),
   so the same active parameters and FLOPs per token — and the ratio (target ≤ 3×: expert parallelism multiplies
   the strategies of the MoE blocks).
9. long sequences (issue 27): Llama-3.1-8B on 64 H100s at 131072 tokens per sample beside the same job at 4096,
   for the runtime target with the default variant and with `gbmw+ulysses`, and for the megatron-core target (which
   offers context parallelism): seconds, the plan, and the ratio 128k / 4k (target ≤ 2×).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from gbmw.cli.compare import ROWS  # noqa: E402
from gbmw.search.planner import NothingFitsError, Planner  # noqa: E402
from gbmw.specs.jobs import load_job  # noqa: E402

console = Console(highlight=False, width=140)

COMPLETE_SEARCH_JOBS = [
    ("bert-huge-32_rtx-titan-x8", "16GiB"),
    ("t5-512-4-32_rtx-titan-x8", "8GiB"),
    ("swin-huge-32_rtx-titan-x8", "8GiB"),
    ("bert-huge-48_a100-2x8", "16GiB"),
    ("t5-512-4-48_a100-2x8", "8GiB"),
    ("gpt3-15b_a100-80g-x32", None),
    ("gpt3-39b_a100-80g-x32", None),
    ("gpt3-65b_a100-80g-x32", None),
    ("bert-xhuge_a100-40g-x64", "16GiB"),
    ("vit-xhuge_a100-40g-x64", "16GiB"),
    ("gpt3-65b_h100-80g-x64", None),
]
TARGET_JOB = "gpt3-65b_h100-80g-x64"
SLOW_EXACT_JOBS = [  # (job, budget or None: the job's, sweep the batch)
    ("gpt3-15b_a100-80g-x32", None, False),
    ("gpt3-15b_a100-80g-x32", None, True),
    ("bert-xhuge_a100-40g-x64", None, False),
    ("bert-xhuge_a100-40g-x64", "16GiB", True),
    ("t5-512-4-48_a100-2x8", "8GiB", True),
    ("gpt3-65b_h100-80g-x64", None, True),
]
PAPER_GRID_MODELS = ["bert-huge-32", "bert-huge-48", "vit-huge-32", "vit-huge-48",
                     "t5-large-32", "t5-large-48", "swin-huge-32", "swin-huge-48"]
PAPER_BUDGETS = ["8GiB", "12GiB", "16GiB", "20GiB"]


def timed_plan(job, **options):
    planner = Planner(job, explain_failure=False, **options)
    started = time.perf_counter()
    try:
        plan = planner.run()
    except NothingFitsError:
        plan = None
    return plan, time.perf_counter() - started, planner


def warm_up() -> float:
    """Load (or compile) the numba kernels once, so later timings are of the search alone."""
    started = time.perf_counter()
    timed_plan(load_job("bert-huge-32_rtx-titan-x8"), batch=16)
    timed_plan(load_job("bert-huge-32_rtx-titan-x8"), batch=16, exact=True, max_pp=1)
    return time.perf_counter() - started


def complete_searches() -> dict[str, float]:
    table = Table(title="1. Complete search (batch sweep, every PP degree and micro-batch count, bi-objective)")
    for column in ("job", "budget", "devices", "settings searched", "search s", "samples/s", "batch", "pp"):
        table.add_column(column, justify="left" if column in ("job", "budget") else "right")
    seconds = {}
    for name, budget in COMPLETE_SEARCH_JOBS:
        job = load_job(name, memory_budget=budget)
        plan, elapsed, planner = timed_plan(job, sweep=True)
        seconds[name] = elapsed
        table.add_row(
            name, f"{job.memory_budget_bytes / 2**30:.0f} GiB", str(job.cluster.num_devices),
            f"{planner.stats.settings_searched}/{planner.stats.settings_total}", f"{elapsed:.2f}",
            "OOM" if plan is None else f"{plan.estimate.samples_per_s:.2f}",
            "" if plan is None else str(plan.global_batch), "" if plan is None else str(plan.pp),
        )
    console.print(table)
    return seconds


def _approximate_child(name: str, queue) -> None:
    plan, elapsed, _ = timed_plan(load_job(name), sweep=True, exact=False)
    queue.put((elapsed, None if plan is None else plan.estimate.samples_per_s))


def approximate_search(name: str, limit_s: float) -> tuple[float | None, float | None]:
    """(seconds, samples/s) of the complete approximate search of `name`, or (None, None) if it ran past `limit_s`."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_approximate_child, args=(name, queue))
    child.start()
    child.join(limit_s)
    if child.is_alive():
        child.terminate()
        child.join()
        return None, None
    return queue.get() if not queue.empty() else (None, None)


_EXACT_CHILD = """
import json, os, sys, time
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}) if hasattr(os, "sched_setaffinity") else None
from gbmw.search.planner import NothingFitsError, Planner
from gbmw.specs.jobs import load_job
name, budget, sweep = sys.argv[1], sys.argv[2] or None, sys.argv[3] == "1"
Planner(load_job("bert-huge-32_rtx-titan-x8"), batch=16, exact=True, max_pp=1, explain_failure=False).run()  # numba
planner = Planner(load_job(name, memory_budget=budget), exact=True, explain_failure=False, **({"sweep": True} if sweep else {}))
wall, cpu = time.perf_counter(), time.process_time()
try:
    speed = planner.run().estimate.samples_per_s
except NothingFitsError:
    speed = 0.0
print(json.dumps([time.perf_counter() - wall, time.process_time() - cpu, speed]))
"""


def exact_in_checkout(checkout: str, name: str, budget: str | None, sweep: bool, limit_s: float):
    """(wall s, CPU s, samples/s) of `--exact` on `name` with the gbmw of `checkout`, or None past `limit_s`."""
    import json
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
    try:
        done = subprocess.run([sys.executable, "-c", _EXACT_CHILD, name, budget or "", "1" if sweep else "0"],
                              env=env, capture_output=True, text=True, timeout=limit_s, cwd=os.path.abspath(checkout))
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        raise RuntimeError(f"{name} in {checkout}: {done.stderr.strip().splitlines()[-1:]}")
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))


def slow_exact_jobs(limit_s: float, base: str | None) -> None:
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    title = "6. --exact on the slowest jobs (complete exact search, one child process each)"
    table = Table(title=title + (f"; base: {base}" if base else ""))
    columns = ["job", "budget", "batch", "s", "CPU s", "samples/s"]
    if base:
        columns += ["base s", "base CPU s", "base samples/s", "same samples/s"]
    for column in columns:
        table.add_column(column, justify="left" if column == "job" else "right")

    def cells(result):
        return ["> limit", "", ""] if result is None else [f"{result[0]:.2f}", f"{result[1]:.2f}", f"{result[2]:.4f}"]

    for name, budget, sweep in SLOW_EXACT_JOBS:
        ours = exact_in_checkout(here, name, budget, sweep, limit_s)
        row = [name, budget or "job's", "sweep" if sweep else "job's", *cells(ours)]
        if base:
            theirs = exact_in_checkout(base, name, budget, sweep, limit_s)
            same = "" if ours is None or theirs is None else "yes" if ours[2] == theirs[2] else "NO"
            row += [*cells(theirs), same]
        table.add_row(*row)
        console.print(f"   {' | '.join(row)}")
    console.print(table)


def grid_against_1mib() -> None:
    table = Table(title="3. --approximate: default memory grid vs 1 MiB cells on every bundled job (its batch, or a sweep)")
    for column in ("job", "grid MiB", "samples/s (grid)", "samples/s (1 MiB)", "same plan speed", "s (grid)", "s (1 MiB)"):
        table.add_column(column, justify="left" if column == "job" else "right")
    from gbmw.specs.bundled import RECIPES_DIR

    jobs = [(path.stem, None) for path in sorted((RECIPES_DIR / "jobs").glob("*.yaml"))]
    same = 0
    for name, budget in jobs:
        job = load_job(name, memory_budget=budget)
        fast, fast_s, planner = timed_plan(job, exact=False)
        fine, fine_s, _ = timed_plan(job, exact=False, granularity_bytes=2**20)
        grid = fast.provenance["granularity_bytes"] if fast else 0
        a = fast.estimate.samples_per_s if fast else 0.0
        b = fine.estimate.samples_per_s if fine else 0.0
        equal = abs(a - b) <= 1e-9 * max(b, 1)
        same += equal
        table.add_row(name, f"{grid / 2**20:.0f}", f"{a:.3f}", f"{b:.3f}", "yes" if equal else
                      f"no ({(a / b - 1) * 100:+.2f}%)" if b else "no", f"{fast_s:.2f}", f"{fine_s:.2f}")
    console.print(table)
    console.print(f"   default grid equal to 1 MiB cells on {same} of {len(jobs)} bundled jobs")


def paper_grid() -> float:
    started = time.perf_counter()
    rows = [(variant, target) for kind, variant, target in ROWS if kind != "target"]
    count, by_variant = 0, dict.fromkeys((variant for variant, _ in rows), 0.0)
    for model in PAPER_GRID_MODELS:
        for budget in PAPER_BUDGETS:
            job = load_job(f"{model}_rtx-titan-x8", memory_budget=budget)
            for variant, target in rows:
                by_variant[variant] += timed_plan(job, variant=variant, target=target)[1]
                count += 1
    elapsed = time.perf_counter() - started
    verdict = "PASS" if elapsed <= 45 else "FAIL"
    console.print(f"4. paper's 8-device grid: {count} searches ({len(PAPER_GRID_MODELS)} models × "
                  f"{len(PAPER_BUDGETS)} budgets × {len(rows)} variants and baselines), exact, in {elapsed:.1f} s "
                  f"(target ≤ 45 s: {verdict})")
    console.print("   seconds per variant: " + ", ".join(f"{variant} {seconds:.1f}" for variant, seconds in
                                                          sorted(by_variant.items(), key=lambda item: -item[1])))
    return elapsed


HETU_JOBS = ("llama-7b_a100-80g-x8", "llama-7b_a100-2x8", "llama-7b_a100-80g-x32", "llama-7b_a100-40g-x64")


def side_by_side(venv_python: str, jobs=HETU_JOBS) -> None:
    sys.path.insert(0, os.path.dirname(__file__))
    import hetu_galvatron  # benchmarks/hetu_galvatron.py

    import gbmw

    table = Table(title="5. Same inputs, one batch size: hetu-galvatron 2.4.0 vs gbmw (plans costed by gbmw's estimator)")
    for column in ("job", "batch", "hetu search s", "hetu wall s", "gbmw s", "speed-up (search)", "hetu plan samples/s",
                   "gbmw plan samples/s", "gbmw plan ≥ hetu's"):
        table.add_column(column, justify="left" if column == "job" else "right")
    for name in jobs:
        job = load_job(name)
        batch = job.global_batch
        ours, ours_s, _ = timed_plan(job, batch=batch)
        result = hetu_galvatron.run_hetu_search(job, batch, venv_python, workdir=None, timeout_s=1800)
        ours_speed = ours.estimate.samples_per_s if ours else 0.0
        if not result.ok:
            table.add_row(name, str(batch), "failed", f"{result.wall_s:.1f}", f"{ours_s:.3f}", "", f"see {result.log_path}",
                          f"{ours_speed:.3f}", "")
            continue
        hetu_plan = hetu_galvatron.hetu_plan_to_gbmw(job, result.config)
        hetu_estimate = gbmw.estimate(job, hetu_plan)
        hetu_speed = hetu_estimate.samples_per_s if hetu_estimate.fits else 0.0
        search_s = result.search_s if result.search_s is not None else result.wall_s
        table.add_row(name, str(batch), f"{search_s:.1f}", f"{result.wall_s:.1f}", f"{ours_s:.3f}",
                      f"{search_s / ours_s:.0f}×", f"{hetu_estimate.samples_per_s:.3f}" + ("" if hetu_estimate.fits else " (OOM)"),
                      f"{ours_speed:.3f}", "yes" if ours_speed >= hetu_speed - 1e-9 else "no")
        console.print(f"   {name}: hetu {search_s:.1f} s search ({result.wall_s:.1f} s wall), gbmw {ours_s:.3f} s")
    console.print(table)


def paper_grid_both_modes() -> None:
    """Section 7: every cell of section 4's grid with the default search and with `exact=True`, side by side."""
    rows = [(variant, target) for kind, variant, target in ROWS if kind != "target"]
    seconds, faster = {False: 0.0, True: 0.0}, []
    cells = default_faster = 0
    for model in PAPER_GRID_MODELS:
        for budget in PAPER_BUDGETS:
            job = load_job(f"{model}_rtx-titan-x8", memory_budget=budget)
            for variant, target in rows:
                speed = {}
                for exact in (False, True):
                    plan, took_s, _ = timed_plan(job, variant=variant, target=target, exact=exact)
                    seconds[exact] += took_s
                    speed[exact] = plan.estimate.samples_per_s if plan else 0.0
                cells += 1
                if speed[True] > speed[False] * (1 + 1e-9):
                    ratio = speed[True] / speed[False] if speed[False] else float("inf")
                    faster.append((ratio, f"{model} {budget} {variant}"))
                default_faster += speed[False] > speed[True] * (1 + 1e-9)  # a bug in --exact if ever
    worst = max(faster, default=(1.0, "none"))
    console.print(f"7. the paper's 8-device grid in both modes: {cells} cells, --approximate {seconds[False]:.1f} s, "
                  f"exact (the default) {seconds[True]:.1f} s; exact finds a faster plan in {len(faster)} cells (at most "
                  f"{worst[0]:.3f}×: {worst[1]}); --approximate finds a faster one in {default_faster}")


MOE_JOBS = ("mixtral-8x7b_h100-80g-x64",)


def dense_twin(job):
    """`job` with every MoE block's experts replaced by one dense MLP of top-k × the expert width (+ the shared
    experts'): the same active parameters and FLOPs per token, no experts."""
    from gbmw.specs.models import build_model

    arch = job.model.architecture
    width = arch.moe.top_k * arch.moe.expert_ffn_hidden_size + arch.moe.shared_experts * arch.moe.shared_ffn_hidden_size
    twin = arch.model_copy(update={"moe": None, "ffn_hidden_size": width, "name": arch.name + "-dense-twin"})
    return job.model_copy(update={"model": build_model(twin, job.precision), "name": job.name + " (dense twin)"})


def mixture_of_experts_against_dense() -> None:
    table = Table(title="8. Mixture of experts against its dense twin (complete search, batch sweep)")
    for column in ("job", "parameters (active)", "mode", "search s", "samples/s", "plan", "ratio MoE / dense"):
        table.add_column(column, justify="left" if column in ("job", "mode", "plan") else "right")
    for name in MOE_JOBS:
        moe_job = load_job(name)
        for exact in (False, True):
            seconds = {}
            for job in (moe_job, dense_twin(moe_job)):
                plan, elapsed, _ = timed_plan(job, sweep=True, exact=exact)
                seconds[job.name] = elapsed
                model = job.model
                layout = "OOM" if plan is None else (
                    f"pp {plan.pp}, {', '.join(dict.fromkeys(s.name for s in plan.strategies[1:-1]))[:40]}")
                table.add_row(job.name, f"{model.parameter_count / 1e9:.1f}B ({model.active_parameter_count / 1e9:.1f}B)",
                              "exact (default)" if exact else "--approximate", f"{elapsed:.2f}",
                              "OOM" if plan is None else f"{plan.estimate.samples_per_s:.2f}", layout,
                              "" if job is moe_job else f"{seconds[moe_job.name] / elapsed:.2f}×")
    console.print(table)


LONG_SEQUENCE_JOB = "llama3.1-8b-128k_h100-80g-x64"
SHORT_SEQUENCE_TOKENS = 4096


def long_sequence_against_short() -> None:
    """Section 9: the same job's search at 128k and at 4k tokens, each target and variant side by side."""
    table = Table(title=f"9. {LONG_SEQUENCE_JOB}: search at its 131072 tokens against {SHORT_SEQUENCE_TOKENS} (fixed batch)")
    for column in ("target", "variant", "tokens", "search s", "samples/s", "plan", "ratio long / short"):
        table.add_column(column, justify="left" if column in ("target", "variant", "plan") else "right")
    for target, variant in (("runtime", "gbmw"), ("runtime", "gbmw+ulysses"), ("megatron-core", "gbmw")):
        seconds = {}
        for tokens in (None, SHORT_SEQUENCE_TOKENS):
            job = load_job(LONG_SEQUENCE_JOB, seq_length=tokens)
            plan, elapsed, _ = timed_plan(job, target=target, variant=variant)
            seconds[job.model.sequence_length] = elapsed
            layout = "OOM" if plan is None else (
                f"pp {plan.pp}, {', '.join(dict.fromkeys(s.name for s in plan.strategies[1:-1]))[:40]}")
            table.add_row(target, variant, str(job.model.sequence_length), f"{elapsed:.2f}",
                          "OOM" if plan is None else f"{plan.estimate.samples_per_s:.3f}", layout,
                          "" if tokens is None else f"{seconds[max(seconds)] / elapsed:.2f}×")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hetu", action="store_true", help="also run hetu-galvatron side by side")
    parser.add_argument("--hetu-python", default=os.path.join(os.path.dirname(__file__), "..", ".venv-hetu", "bin",
                                                              "python"))
    parser.add_argument("--sections", default="1,2,3,4,6",
                        help="which sections to run (5 needs --hetu; 7, 8 and 9, a few minutes, only when named)")
    parser.add_argument("--exact-limit-s", type=float, default=300.0,
                        help="stop the approximate search of section 2 and each exact one of section 6 after this many "
                             "seconds (default 300)")
    parser.add_argument("--hetu-jobs", default=",".join(HETU_JOBS), help="jobs for section 5")
    parser.add_argument("--base", help="section 6: also run each job with the gbmw of this checkout (before/after)")
    args = parser.parse_args()
    sections = set(args.sections.split(",")) | ({"5"} if args.hetu else set())

    console.print(f"numba kernels loaded or compiled in {warm_up():.1f} s (not counted below); "
                  f"pinned to CPU {sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'}")
    if sections & {"1", "2"}:
        seconds = complete_searches()
        target = seconds[TARGET_JOB]
        console.print(f"2. complete search for GPT-3 65B on 64 devices (exact, the default): {target:.2f} s "
                      f"(target ≤ 1.5 s: {'PASS' if target <= 1.5 else 'FAIL'})")
        approximate_s, approximate_speed = approximate_search(TARGET_JOB, args.exact_limit_s)
        if approximate_s is None:
            console.print(f"   the same with --approximate: did not finish in {args.exact_limit_s:.0f} s")
        else:
            console.print(f"   the same with --approximate: {approximate_s:.2f} s, {approximate_speed:.2f} samples/s")
    if "3" in sections:
        grid_against_1mib()
    if "4" in sections:
        paper_grid()
    if "5" in sections:
        side_by_side(os.path.abspath(args.hetu_python), args.hetu_jobs.split(","))
    if "6" in sections:
        slow_exact_jobs(args.exact_limit_s, args.base)
    if "7" in sections:
        paper_grid_both_modes()
    if "8" in sections:
        mixture_of_experts_against_dense()
    if "9" in sections:
        long_sequence_against_short()


if __name__ == "__main__":
    main()
