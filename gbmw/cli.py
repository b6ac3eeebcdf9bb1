"""The `gbmw` command.

    gbmw space --devices 8 [--no-prune] [--json]
    gbmw estimate JOB (--plan plan.yaml | --uniform tp=8,pp=2,zero=1,ckpt=full,micro=1) [--memory 16GiB] [--json]
    gbmw plan JOB [--memory 16GiB] [--batch N | --sweep] [--target T] [--variant V] [-o plan.yaml] [--json]
                  [--figure plan.png]
    gbmw compare JOB [--memory 8GiB,16GiB] [--batch N | --sweep] [--handtuned NAME]
    gbmw tune --ds-config ds_config.json --model MODEL --cluster CLUSTER [--target T] [-o DIR]
    gbmw train JOB --plan plan.yaml [--steps N] [--save DIR] [--load DIR]   (under torchrun / deepspeed for N > 1)
    gbmw profile model MODEL -o model.yaml [--precision fp32] [--batches 2,8] [--min-seconds 20]
                  (under torchrun with 2 processes: TP split, TP/FSDP2/Slice-Gather/p2p calls measured too)
    torchrun --nproc_per_node N -m gbmw profile cluster -o cluster.yaml [--links intra_node=8,inter_node=32]
    torchrun --nproc_per_node N -m gbmw validate JOB --plans a.yaml b.yaml [--steps 8] [--min-seconds S]
                  [--one-at-a-time | --profile-alongside profile.yaml] [--json out.json]

JOB is a job YAML or the name of a bundled job recipe (recipes/jobs/). Bad input ends with one
line naming the file, field and value (exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
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
    parser.add_argument("--local_rank", "--local-rank", type=int, dest="local_rank", default=None,
                        help=argparse.SUPPRESS)  # the deepspeed launcher passes --local_rank=N before the command
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

    plan = commands.add_parser("plan", help="search the fastest plan that fits")
    plan.add_argument("job", help="job YAML or bundled job recipe name")
    _search_options(plan)
    plan.add_argument("--variant", default="gbmw",
                      help="search variant: gbmw (default: BMW with ZeRO-1/2 too), bmw, base, 1f1b+bi-obj, galvatron, "
                           "dp+pp, dp+tp, or a baseline (ddp, megatron-tp, gpipe, fsdp, deepspeed-3d)")
    plan.add_argument("--target", default="runtime",
                      help="what will run it: runtime (default), deepspeed, megatron-deepspeed, megatron-core")
    plan.add_argument("--max-pp", type=int, help="largest pipeline degree to try")
    plan.add_argument("--granularity", help="memory grid of the DP, e.g. 1MiB (default: the budget in 4096 cells)")
    plan.add_argument("--exact", action="store_true", help="exact Pareto-frontier DP instead of the grid (slower)")
    plan.add_argument("-o", "--output", help="write the plan to this new YAML file")
    plan.add_argument("--figure", help="draw stage memory/time bars and the strategy of every layer to this PNG")
    plan.add_argument("--json", action="store_true", help="print the plan with its estimate as JSON")
    plan.set_defaults(run=_run_plan)

    compare = commands.add_parser("compare", help="the paper's comparison: baselines and variants side by side")
    compare.add_argument("job", help="job YAML or bundled job recipe name")
    _search_options(compare)
    compare.add_argument("--handtuned", help="a published configuration (recipes/handtuned/NAME.yaml or a path): "
                                             "cost it beside gbmw's best plan for every target")
    compare.add_argument("--json", action="store_true", help="print JSON")
    compare.set_defaults(run=_run_compare)
    _tune_parser(commands)
    _train_parser(commands)
    _profile_parser(commands)
    validate = commands.add_parser("validate", help="run plans with the runtime and print predicted vs measured "
                                                    "iteration time and memory (under torchrun / deepspeed)")
    validate.add_argument("job", help="job YAML or bundled job recipe name (its model may be a profile)")
    validate.add_argument("--plans", nargs="+", required=True, help="plan YAMLs for the launched device count")
    validate.add_argument("--steps", type=int, default=8,
                          help="timed steps per plan, at least (the fastest quarter's mean is compared; default 8)")
    validate.add_argument("--min-seconds", type=float, default=0.0,
                          help="keep timing for at least this long, the plans' steps interleaved (default 0)")
    validate.add_argument("--one-at-a-time", action="store_true",
                          help="build and time one plan after another (plans that do not fit in memory together)")
    validate.add_argument("--profile-alongside", metavar="PROFILE_YAML",
                          help="also profile the job's model in the same rounds as the plans' steps, write it to "
                               "this new file and predict from it (judges the estimator on measurements of the "
                               "same seconds)")
    validate.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    validate.add_argument("--json", help="also write the results to this new JSON file")
    validate.set_defaults(run=_run_validate)
    return parser


def _run_validate(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from gbmw.adapters.profile.validate import print_validation, run_validate

    rank = int(os.environ.get("RANK", "0"))
    if args.json and os.path.exists(args.json):
        raise GbmwError(f"--json {args.json}: exists; gbmw never overwrites a file — choose a new name")
    results = run_validate(args.job, args.plans, args.steps, args.warmup,
                           say=lambda text: print(text, flush=True) if rank == 0 else None,
                           min_seconds=args.min_seconds, one_at_a_time=args.one_at_a_time,
                           profile_alongside=args.profile_alongside)
    if rank == 0:
        summary = print_validation(results)
        if args.json:
            from gbmw.files import write_new_file

            write_new_file(args.json, json.dumps({"plans": [asdict(result) for result in results],
                                                  "summary": summary}, indent=2))
    return 0


def _profile_parser(commands) -> None:
    profile = commands.add_parser("profile", help="measure layers (model) or links (cluster) on this machine")
    what = profile.add_subparsers(dest="what", required=True, metavar="WHAT")
    model = what.add_parser("model", help="per-layer time and stashed activations on this device → a model YAML")
    model.add_argument("model", help="model recipe name, model YAML or HF config.json (family gpt or bert)")
    model.add_argument("--precision", default="fp32", help="fp32 (default) or bf16")
    model.add_argument("--batches", default="2,8", help="the two batch sizes measured (default 2,8)")
    model.add_argument("--repeats", type=int, default=15,
                       help="whole-model passes of each kind, at least (the fastest quarter is kept; default 15)")
    model.add_argument("--min-seconds", type=float, default=None,
                       help="keep repeating the interleaved passes for at least this long (default 20: "
                            "spans the slow and fast phases of a shared machine)")
    model.add_argument("-o", "--output", required=True, help="the new model YAML to write")
    model.set_defaults(run=_run_profile_model)
    cluster = what.add_parser("cluster", help="collective bandwidth/latency and overlap slowdown among the launched "
                                              "processes → a cluster YAML (run under torchrun or deepspeed)")
    cluster.add_argument("-o", "--output", required=True, help="the new cluster YAML to write")
    cluster.add_argument("--name", help="the cluster's name (default: the output file's stem)")
    cluster.add_argument("--links", help="link levels innermost first as name=devices, e.g. intra_node=8,inter_node=32 "
                                         "(default: one level per machine, from LOCAL_WORLD_SIZE)")
    cluster.add_argument("--repeats", type=int, default=10, help="timed repetitions per message size (the fastest quarter's mean is kept)")
    cluster.set_defaults(run=_run_profile_cluster)


def _run_profile_cluster(args: argparse.Namespace) -> int:
    from gbmw.adapters.profile.cluster_profiler import profile_cluster
    from gbmw.adapters.profile.link_fit import parse_link_levels
    from gbmw.adapters.runtime.launch import finish_distributed, init_distributed

    levels = parse_link_levels(args.links) if args.links else None
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise GbmwError("profiling a cluster needs at least 2 processes; launch it with "
                        f"torchrun --standalone --nproc_per_node 2 -m gbmw profile cluster -o {args.output}")
    init_distributed()
    completed = False
    try:
        profile_cluster(args.output, name=args.name, link_levels=levels, repeats=args.repeats)
        completed = True
    finally:
        finish_distributed(completed)
    return 0


def _run_profile_model(args: argparse.Namespace) -> int:
    from gbmw.adapters.profile.model_profiler import run_profile_model

    try:
        small, large = (int(part) for part in args.batches.split(","))
    except ValueError:
        raise GbmwError(f"--batches {args.batches!r}: give two batch sizes, e.g. 2,8") from None
    if args.repeats < 1:
        raise GbmwError(f"--repeats {args.repeats}: must be at least 1")
    if args.min_seconds is not None and args.min_seconds < 0:
        raise GbmwError(f"--min-seconds {args.min_seconds}: must be 0 or more")
    extra = {} if args.min_seconds is None else {"min_seconds": args.min_seconds}
    run_profile_model(args.model, args.precision, args.output, (small, large), args.repeats,
                      say=lambda text: print(text, flush=True), **extra)
    return 0


def _train_parser(commands) -> None:
    train = commands.add_parser("train", help="run a plan with gbmw's hybrid runtime (one process, torchrun or deepspeed)")
    train.add_argument("job", help="job YAML or bundled job recipe name")
    train.add_argument("--plan", required=True, help="plan YAML (from gbmw plan -o, for this job's model)")
    train.add_argument("--steps", type=int, default=10, help="training steps to run (default 10)")
    train.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate (default 1e-4)")
    train.add_argument("--clip-grad", type=float, default=1.0,
                       help="clip the global gradient norm to this; 0 turns clipping off (default 1.0, as Megatron and "
                            "DeepSpeed)")
    train.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the synthetic data")
    train.add_argument("--save", help="write a plan-independent checkpoint to this new folder at the end")
    train.add_argument("--load", help="resume from a checkpoint folder (saved under any plan or device count)")
    train.add_argument("--timeout", type=float, default=300.0,
                       help="seconds a collective may wait for a peer before the job stops (default 300)")
    train.set_defaults(run=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from gbmw.adapters.runtime.train import TrainSettings, train

    if args.steps < 0:
        raise GbmwError(f"--steps {args.steps}: must be 0 or more")
    if args.clip_grad < 0:
        raise GbmwError(f"--clip-grad {args.clip_grad}: must be 0 (off) or positive")
    settings = TrainSettings(steps=args.steps, learning_rate=args.lr, max_grad_norm=args.clip_grad or None, seed=args.seed, save=args.save, load=args.load,
                             timeout_s=args.timeout, local_rank=args.local_rank)
    train(args.job, args.plan, settings)
    return 0


def _tune_parser(commands) -> None:
    tune = commands.add_parser("tune", help="drop-in: re-plan the parallel settings of an existing DeepSpeed job")
    tune.add_argument("--ds-config", required=True, help="the job's existing ds_config.json (read, never changed)")
    tune.add_argument("--model", required=True, help="model recipe name, model YAML, or HF config.json")
    tune.add_argument("--cluster", required=True, help="cluster recipe name or YAML")
    tune.add_argument("--target", default="deepspeed", help="deepspeed (default), megatron-deepspeed, megatron-core")
    tune.add_argument("--memory", help="per-device memory budget (default: the cluster's usable memory)")
    tune.add_argument("--current-tp", type=int, default=1, help="the job's current tensor-parallel size (default 1)")
    tune.add_argument("--current-pp", type=int, default=1, help="the job's current pipeline-parallel size (default 1)")
    tune.add_argument("--current-ckpt", choices=("full", "none"),
                      help="the job's current recomputation (Megatron's --recompute-granularity full; default: whether "
                           "the ds_config has an activation_checkpointing section)")
    tune.add_argument("--script", default="pretrain_gpt.py", help="training script for the launch line")
    tune.add_argument("-o", "--output", help="a new folder for ds_config.json, plan.yaml, megatron_args.txt, launch.sh")
    tune.set_defaults(run=_run_tune)


def _run_tune(args: argparse.Namespace) -> int:
    from gbmw.report import print_tune
    from gbmw.adapters.tune import tune

    result = tune(args.ds_config, args.model, args.cluster, args.target, args.output, args.memory,
                  args.current_tp, args.current_pp, args.current_ckpt, args.script)
    print_tune(result)
    return 0


def _search_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memory", help="per-device memory budget, e.g. 16GiB (compare: a comma list)")
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--batch", type=int, help="fixed global batch (default: the job's, else a sweep)")
    batch.add_argument("--sweep", action="store_true", help="sweep the global batch up to the job's max_global_batch")


def _progress(label: str):
    """A progress callback drawing a bar on stderr when it is a terminal (nothing otherwise)."""
    if not sys.stderr.isatty():
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("settings"),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = progress.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return progress, update


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
    from gbmw.estimate import estimate_plan
    from gbmw.plan import Plan
    from gbmw.report import estimate_to_json, print_estimate
    from gbmw.jobs import load_job

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


def _run_plan(args: argparse.Namespace) -> int:
    from gbmw.planner import Planner
    from gbmw.report import plan_to_json, print_plan
    from gbmw.jobs import load_job
    from gbmw.schema import parse_bytes

    job = load_job(args.job, memory_budget=args.memory)
    granularity = parse_bytes(args.granularity, "--granularity") if args.granularity else None
    if args.batch is not None and args.batch < 1:
        raise GbmwError(f"--batch {args.batch}: must be a positive number of samples")
    for path in (args.output, args.figure):
        if path and os.path.exists(path):
            raise GbmwError(f"{path} exists; gbmw does not overwrite files — choose a new name or remove it first")
    progress, update = _progress("searching")
    planner = Planner(job, variant=args.variant, batch=args.batch, sweep=args.sweep, granularity_bytes=granularity,
                      exact=args.exact, max_pp=args.max_pp, target=args.target, progress=update)
    if progress is not None:
        with progress:
            plan = planner.run()
    else:
        plan = planner.run()
    if args.output:
        plan.save(args.output)
    if args.figure:
        from gbmw.report import draw_plan

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
    from gbmw.compare import compare_job
    from gbmw.report import comparison_to_json, print_comparison

    if args.handtuned:
        from gbmw.baselines import load_handtuned
        from gbmw.compare import compare_handtuned
        from gbmw.report import handtuned_rows, print_handtuned
        from gbmw.jobs import load_job

        if args.sweep or (args.memory and "," in args.memory):
            raise GbmwError("--handtuned compares at one budget and the configuration's batch; drop --sweep and "
                            "give one --memory")
        job = load_job(args.job, memory_budget=args.memory)
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
    if progress is not None:
        with progress:
            rows = compare_job(args.job, budgets, args.batch, args.sweep, update)
    else:
        rows = compare_job(args.job, budgets, args.batch, args.sweep, None)
    if args.json:
        print(json.dumps(comparison_to_json(rows), indent=2))
    else:
        print_comparison(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
