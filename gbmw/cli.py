"""The `gbmw` command.

    gbmw space --devices 8 [--no-prune] [--json]
    gbmw estimate JOB (--plan plan.yaml | --uniform tp=8,pp=2,zero=1,ckpt=full,micro=1) [--memory 16GiB] [--json]

JOB is a job YAML or the name of a bundled job recipe (recipes/jobs/). Bad input ends with one
line naming the file, field and value (exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from gbmw.errors import GbmwError


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except GbmwError as error:
        print(f"gbmw: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gbmw: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gbmw",
        description="Galvatron-BMW automatic hybrid parallelism for Transformer training.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    space = commands.add_parser("space", help="list the per-layer strategy candidates for N devices")
    space.add_argument("--devices", type=int, required=True, help="number of devices (a power of two)")
    space.add_argument("--no-prune", action="store_true", help="keep DP+SDP trees (Takeaway #3 off)")
    space.add_argument("--json", action="store_true", help="print JSON")
    space.set_defaults(run=_run_space)

    estimate = commands.add_parser("estimate", help="cost a plan or a uniform 3D configuration for a job")
    estimate.add_argument("job", help="job YAML or bundled job recipe name")
    source = estimate.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan", help="plan YAML (from gbmw plan, or written by hand)")
    source.add_argument(
        "--uniform",
        metavar="SPEC",
        help="a hand-tuned uniform config, e.g. tp=8,pp=2,zero=1,ckpt=full,micro=1[,batch=512]",
    )
    estimate.add_argument("--memory", help="per-device memory budget, e.g. 16GiB (default: the job's)")
    estimate.add_argument("--json", action="store_true", help="print JSON")
    estimate.set_defaults(run=_run_estimate)
    return parser


def _run_space(args: argparse.Namespace) -> int:
    from gbmw.report import print_space
    from gbmw.space import space_by_pipeline_degree

    if args.devices < 1:
        raise GbmwError(f"--devices {args.devices}: must be a positive power of two (1, 2, 4, 8, …)")
    space = space_by_pipeline_degree(args.devices, prune_dp_with_sdp=not args.no_prune)
    total = sum(len(strategies) for strategies in space.values())
    if args.json:
        print(json.dumps({
            "devices": args.devices,
            "prune_dp_with_sdp": not args.no_prune,
            "total": total,
            "by_pp": {str(pp): [s.name for s in strategies] for pp, strategies in space.items()},
        }, indent=2))
    else:
        print_space(args.devices, space, pruned=not args.no_prune)
    return 0


def _run_estimate(args: argparse.Namespace) -> int:
    from gbmw.baselines import UniformConfig
    from gbmw.cost import estimate_plan
    from gbmw.plan import Plan
    from gbmw.report import estimate_to_json, print_estimate
    from gbmw.spec import load_job

    job = load_job(args.job, memory_budget=args.memory)
    if args.plan:
        plan = Plan.load(args.plan)
        if job.global_batch is not None and plan.global_batch != job.global_batch:
            print(
                f"note: the plan's global batch ({plan.global_batch}) differs from the job's ({job.global_batch}); "
                "costing the plan's",
                file=sys.stderr,
            )
    else:
        plan = UniformConfig.parse(args.uniform).to_plan(job)
    estimate = estimate_plan(job, plan)
    if args.json:
        print(json.dumps(estimate_to_json(job, plan, estimate), indent=2))
    else:
        print_estimate(job, plan, estimate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
