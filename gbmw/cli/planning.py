"""The planning commands of `gbmw`: space, estimate, plan, compare (gbmw.cli.main composes the command line)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gbmw.cli.argument_types import integer, memory_size, memory_sizes, new_path, power_of_two
from gbmw.errors import GbmwError, PlanError
from gbmw.specs.files import shown
from gbmw.specs.schema import MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_SEQUENCE


def add_planning_commands(commands) -> None:
    """`space`, `estimate`, `plan` and `compare` on the command line's subparsers."""
    space = commands.add_parser("space", help="list the per-layer strategy candidates for N devices")
    space.add_argument("--devices", type=integer(1, 4096), required=True, help="number of devices (a power of two)")
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
    estimate.add_argument("--memory", type=memory_size, help="per-device memory budget, e.g. 16GiB (default: the job's)")
    add_model_settings(estimate)
    estimate.add_argument("--json", action="store_true", help="print JSON")
    estimate.set_defaults(run=_run_estimate)

    plan = commands.add_parser("plan", help="search the fastest plan that fits")
    plan.add_argument("job", help="job YAML or bundled job recipe name")
    _search_options(plan, memory_size)
    plan.add_argument("--variant", default="gbmw",
                      help="search variant: gbmw (default: BMW with ZeRO-1/2 too), gbmw+ulysses (and Ulysses sequence "
                           "parallelism, for long sequences; slower), gbmw+cp (and ring context parallelism, the "
                           "same way), bmw, base, 1f1b+bi-obj, galvatron, dp+pp, dp+tp, "
                           "or a baseline (ddp, megatron-tp, gpipe, fsdp, deepspeed-3d)")
    plan.add_argument("--target", default="runtime",
                      help="what will run it: runtime (default), deepspeed, megatron-deepspeed, megatron-core")
    plan.add_argument("--max-pp", type=power_of_two(MAX_DEVICES), help="largest pipeline degree to try")
    plan.add_argument("--granularity", type=memory_size, help="memory grid of the DP, e.g. 1MiB (default: the budget in 4096 cells)")
    mode = plan.add_mutually_exclusive_group()
    mode.add_argument("--exact", action="store_true",
                      help="the default: the estimator's optimum over every partition and per-layer strategy (equal to "
                           "a brute force over whole plans); the flag is kept for scripts")
    mode.add_argument("--approximate", action="store_true",
                      help="the paper's search alone (its partitions, stage DPs on a memory grid): a quarter to a half of "
                           "the time on the bundled jobs, but the plan may be slower than the optimum, and it may say "
                           "nothing fits where a plan does")
    plan.add_argument("-o", "--output", type=new_path, help="write the plan to this new YAML file")
    plan.add_argument("--figure", type=new_path, help="draw stage memory/time bars and the strategy of every layer to this PNG")
    plan.add_argument("--json", action="store_true", help="print the plan with its estimate as JSON")
    plan.set_defaults(run=_run_plan)

    compare = commands.add_parser("compare", help="the paper's comparison: baselines and variants side by side")
    compare.add_argument("job", help="job YAML or bundled job recipe name")
    _search_options(compare, memory_sizes)
    compare.add_argument("--handtuned", help="a published configuration (recipes/handtuned/NAME.yaml or a path): "
                                             "cost it beside gbmw's best plan for every target")
    compare.add_argument("--json", action="store_true", help="print JSON")
    compare.set_defaults(run=_run_compare)


def add_model_settings(parser: argparse.ArgumentParser) -> None:
    """`--seq-length` and `--flash-attention`: how the job trains its model, where the model file does not say (an
    HF config.json) or says otherwise."""
    parser.add_argument("--seq-length", type=integer(1, MAX_SEQUENCE),
                        help="tokens per training sample (default: the job's `seq_length`, else the model file's; an "
                             "HF config.json's max_position_embeddings, with a note)")
    parser.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=None,
                        help="attention is fused (FlashAttention: no score matrix stored) or not (default: the job's "
                             "`flash_attention`, else the model file's; standard for an HF config.json, with a note)")


def load_job_of(args: argparse.Namespace, memory_budget: str | None = None):
    """The job of a planning command with its --seq-length / --flash-attention, its notes printed on stderr."""
    from gbmw.specs.jobs import load_job

    job = load_job(args.job, memory_budget=memory_budget, seq_length=args.seq_length,
                   flash_attention=args.flash_attention)
    print_notes(job.notes)
    return job


def print_notes(notes) -> None:
    """Each note on its own line on stderr (stdout may be JSON)."""
    for note in notes:
        print(f"note: {note}", file=sys.stderr)


def _search_options(parser: argparse.ArgumentParser, memory_type) -> None:
    add_model_settings(parser)
    parser.add_argument("--memory", type=memory_type, help="per-device memory budget, e.g. 16GiB (compare: a comma list)")
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--batch", type=integer(1, MAX_GLOBAL_BATCH), help="fixed global batch (default: the job's, else a sweep)")
    batch.add_argument("--sweep", action="store_true", help="sweep the global batch up to the job's max_global_batch")


def _progress(label: str):
    """A progress callback drawing a bar on stderr when it is a terminal (nothing otherwise)."""
    if not sys.stderr.isatty():
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("settings"),
                        TimeElapsedColumn(), TextColumn("{task.fields[best]}"), console=Console(stderr=True),
                        transient=True)
    task = progress.add_task(label, total=None, best="")

    def update(done: int, total: int, best_samples_per_s: float | None = None) -> None:
        """Settings done of all; the fastest plan found so far, where the caller knows one."""
        best = f"best so far {best_samples_per_s:.4g} samples/s" if best_samples_per_s else ""
        progress.update(task, completed=done, total=total, best=best)

    return progress, update


def _run_space(args: argparse.Namespace) -> int:
    from gbmw.cli.report import print_space
    from gbmw.space.strategy import space_by_pipeline_degree

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
    from gbmw.cli.report import estimate_to_json, print_estimate
    from gbmw.cost.estimate import estimate_plan
    from gbmw.handwritten.uniform_config import UniformConfig
    from gbmw.plan import Plan
    from gbmw.space.targets import get_target

    job = load_job_of(args, args.memory)
    if args.plan:
        plan = Plan.load(args.plan)
        if plan.model != job.model.name:  # as `train` refuses it: a plan is made for one model
            raise PlanError(f"{args.plan}: field `model`: value {shown(plan.model)} — the job trains "
                            f"{job.model.name}; plan it with `gbmw plan {args.job} -o plan.yaml`, or cost a layout "
                            "for this model with --uniform")
        plan.check_against(job.model, job.cluster.num_devices, **job.launch_settings())
        get_target(plan.target).check(plan, job.model)  # a hand-edited `target` must be able to run the plan
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


def _run_plan(args: argparse.Namespace) -> int:
    from gbmw.cli.report import plan_to_json, print_plan
    from gbmw.search.planner import Planner
    from gbmw.space.runtime_support import runtime_warning
    from gbmw.specs.schema import parse_bytes

    if args.output and args.figure and Path(args.output).resolve() == Path(args.figure).resolve():
        raise GbmwError(f"-o {args.output} and --figure {args.figure} name the same file; give the figure another "
                        "name (e.g. plan.png)")
    job = load_job_of(args, args.memory)
    granularity = parse_bytes(args.granularity, "--granularity") if args.granularity else None
    progress, update = _progress("searching")
    planner = Planner(job, variant=args.variant, batch=args.batch, sweep=args.sweep, granularity_bytes=granularity,
                      exact=not args.approximate, max_pp=args.max_pp, target=args.target, progress=update)
    warning = runtime_warning(job, planner.spec.target)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    if progress is not None:
        with progress:
            plan = planner.run()
    else:
        plan = planner.run()
    if args.output:
        plan.save(args.output)
    if args.figure:
        from gbmw.cli.report import draw_plan

        draw_plan(job, plan, args.figure)
    if args.json:
        print(json.dumps(plan_to_json(job, plan), indent=2))
    else:
        print_plan(job, plan)
        for path, what in ((args.output, "plan"), (args.figure, "figure")):
            if path:
                print(f"wrote {what} {path}")
    return 0


def _run_compare(args: argparse.Namespace) -> int:
    from gbmw.cli.compare import compare_jobs
    from gbmw.cli.report import comparison_to_json, print_comparison
    from gbmw.specs.jobs import load_job

    if args.handtuned:
        from gbmw.cli.compare import compare_handtuned
        from gbmw.cli.report import handtuned_rows, print_handtuned
        from gbmw.handwritten.handtuned_config import load_handtuned

        if args.sweep or (args.memory and "," in args.memory):
            raise GbmwError("--handtuned compares at one budget and the configuration's batch; drop --sweep and "
                            "give one --memory")
        job = load_job_of(args, args.memory)
        if args.batch is not None:
            job = job.model_copy(update={"global_batch": args.batch})
        comparison = compare_handtuned(job, load_handtuned(args.handtuned))
        if args.json:
            print(json.dumps(handtuned_rows(comparison), indent=2))
        else:
            print_handtuned(comparison)
        return 0
    budgets = [item.strip() for item in args.memory.split(",")] if args.memory else [None]
    progress, update = _progress("comparing")
    jobs = [load_job_of(args, budget) if index == 0 else load_job(args.job, budget, args.seq_length,
                                                                     args.flash_attention)
            for index, budget in enumerate(budgets)]
    if progress is not None:
        with progress:
            rows = compare_jobs(jobs, args.batch, args.sweep, update)
    else:
        rows = compare_jobs(jobs, args.batch, args.sweep, None)
    if args.json:
        print(json.dumps(comparison_to_json(rows), indent=2))
    else:
        print_comparison(rows, jobs[0])
    return 0
