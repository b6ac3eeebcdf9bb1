"""Is gbmw's search exact? Both search modes against an independent brute force over whole plans (issue 13).

    .venv/bin/python benchmarks/search_vs_brute_force.py                 # 200 seeded cases (about 8 minutes, nearly all brute force)
    .venv/bin/python benchmarks/search_vs_brute_force.py --cases 1000    # more seeds
    .venv/bin/python benchmarks/search_vs_brute_force.py --seed 174      # one case, both plans in full
    .venv/bin/python benchmarks/search_vs_brute_force.py --uniform       # the stock targets and fixed baselines

Each case, from its seed (tests/whole_plan_oracle.py): a random tiny job — 2, 4 or 8 devices, 4–8 layers,
tied and untied embeddings, encoder–decoder side inputs, uneven layers, heads TP cannot always divide, MiB to GiB
budgets, a fixed batch or a batch sweep — under a per-layer variant (gbmw, the default, half the time; bmw;
1f1b+bi-obj; base, on GPipe), and a budget from tight to loose, about half of them a plan's exact peak or one byte under it. The
brute force enumerates every PP degree, micro-batch size and count, partition and per-layer strategy and prices
each plan with gbmw's own estimate; then the default `Planner()` (exact) and `Planner(exact=False)`
(`--approximate`) plan the same job.

Prints, for each mode: the cases that agree (same samples/s within a relative 1e-9, or nothing fits for both),
nothing-fits answers where a plan fits, slower plans (how many, the worst ratio), and anything the search must never
do (a plan faster than the brute force's, outside the space, or over the budget); then one line per disagreement
(seed, case, the brute force's plan, the planner's). Exits 1 if the exact mode disagrees on any case.

`--uniform` draws the cases in the uniform spaces instead (tests/uniform_plan_oracle.py): the stock targets
deepspeed, megatron-deepspeed and megatron-core, and the fixed baselines ddp, megatron-tp, fsdp, gpipe and
deepspeed-3d, each equally often, with batches up to 32 (fixed or swept); the brute force there enumerates every PP
degree, micro-batch size and count, layout (tree, +sp, recomputation), the space's partition rules and
megatron-core's interleaving, and prices each whole plan with estimate_plan.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import Counter

from rich.console import Console
from rich.progress import track

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from uniform_plan_oracle import check_uniform_planner, describe_uniform_plan, random_uniform_case  # noqa: E402
from whole_plan_oracle import (  # noqa: E402
    AGREE,
    FASTER,
    INVENTED,
    MISSED,
    OUTSIDE,
    OVER_BUDGET,
    SLOWER,
    check_planner,
    describe_plan,
    random_case,
)

MODES = {"exact": True, "approximate": False}
NEVER = (FASTER, OUTSIDE, OVER_BUDGET, INVENTED)
"""Answers no mode may give: the approximate mode may miss the optimum, but its plan fits and lies in the space."""


def diagnosis(seed: int, case, verdict) -> str:
    uniform = not callable(getattr(verdict.oracle, "plan", None))
    describe = describe_uniform_plan if uniform else describe_plan
    oracle = "nothing fits" if verdict.oracle is None else (
        f"{verdict.oracle.samples_per_s:.6g}/s peak {verdict.oracle.peak_bytes:.0f} B "
        f"{describe(verdict.oracle.plan if uniform else verdict.oracle.plan(case.job))}")
    if verdict.plan is None:
        planner = "nothing fits"
    else:
        estimate = verdict.plan.estimate
        planner = (f"{estimate.samples_per_s:.6g}/s peak {max(estimate.stage_peak_memory_bytes):.0f} B "
                   f"{describe(verdict.plan)}")
    ratio = f" (×{verdict.ratio:.4f})" if verdict.ratio is not None else ""
    return (f"  seed {seed}: {verdict.kind}{ratio} — {case.summary}\n"
            f"      brute force: {oracle}\n      planner:     {planner}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200, help="how many seeded cases (default 200)")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed … first-seed + cases − 1")
    parser.add_argument("--seed", type=int, help="run only this seed")
    parser.add_argument("--work-cap", type=int, default=20_000,
                        help="most stage estimates the brute force may take per job (default 20000)")
    parser.add_argument("--uniform", action="store_true",
                        help="the uniform spaces (stock targets, fixed baselines) instead of the per-layer variants")
    args = parser.parse_args()
    draw, check = (random_uniform_case, check_uniform_planner) if args.uniform else (random_case, check_planner)
    spaces = Counter()
    seeds = [args.seed] if args.seed is not None else list(range(args.first_seed, args.first_seed + args.cases))

    counts = {mode: Counter() for mode in MODES}
    worst = {mode: (1.0, None) for mode in MODES}
    lines = {mode: [] for mode in MODES}
    seconds = Counter()
    devices, plans = Counter(), 0
    progress = Console(stderr=True)  # the results stay alone on stdout
    for seed in track(seeds, description="cases (brute force, then both modes)", console=progress, transient=True):
        started = time.perf_counter()
        case = draw(random.Random(seed), work_cap=args.work_cap)
        spaces[getattr(case, "space", None) or case.variant] += 1
        seconds["brute force"] += time.perf_counter() - started
        devices[case.tiny.job.cluster.num_devices] += 1
        plans += case.oracle.best(case.budget_bytes) is not None
        for mode, exact in MODES.items():
            started = time.perf_counter()
            verdict = check(case, exact)
            seconds[mode] += time.perf_counter() - started
            counts[mode][verdict.kind] += 1
            if verdict.kind != AGREE:
                lines[mode].append(diagnosis(seed, case, verdict))
            if verdict.kind == SLOWER and verdict.ratio < worst[mode][0]:
                worst[mode] = (verdict.ratio, seed)

    total = len(seeds)
    print(f"{total} cases (seeds {seeds[0]}–{seeds[-1]}; {dict(sorted(spaces.items()))} by space; "
          f"{dict(sorted(devices.items()))} by device count; "
          f"a plan fits in "
          f"{plans}); brute force {seconds['brute force']:.1f} s, exact search {seconds['exact']:.1f} s, "
          f"approximate search {seconds['approximate']:.1f} s")
    for mode in MODES:
        count = counts[mode]
        ratio, seed = worst[mode]
        never = ", ".join(f"{kind}: {count[kind]}" for kind in NEVER if count[kind]) or "none"
        print(f"{mode} mode: agrees in {count[AGREE]} of {total}; nothing fits where a plan fits: {count[MISSED]}; "
              f"slower: {count[SLOWER]}" + (f" (worst ×{ratio:.4f}, seed {seed})" if count[SLOWER] else "")
              + f"; never allowed: {never}")
    for mode in MODES:
        if lines[mode]:
            print(f"\n{mode} mode disagreements:")
            print("\n".join(lines[mode]))
    failed = total - counts["exact"][AGREE] + sum(counts["approximate"][kind] for kind in NEVER)
    print(f"\n{'FAIL' if failed else 'PASS'}: exact mode agrees with brute force in {counts['exact'][AGREE]} of "
          f"{total}; "
          f"approximate mode broke its guarantee (fits, in the space, never faster) in "
          f"{sum(counts['approximate'][kind] for kind in NEVER)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
