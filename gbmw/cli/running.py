"""The commands of `gbmw` that run something on torch — tune (checks the ds_config with DeepSpeed), train, profile,
validate — each importing its adapter only when it runs (gbmw.cli.main composes the command line)."""

from __future__ import annotations

import argparse
import json
import os

from gbmw.cli.argument_types import integer, memory_size, new_or_empty_folder, new_path, number
from gbmw.cli.planning import add_model_settings, print_notes
from gbmw.errors import GbmwError
from gbmw.specs.files import shown
from gbmw.specs.schema import MAX_DEVICES, MAX_GLOBAL_BATCH


def add_running_commands(commands) -> None:
    """`tune`, `train`, `profile` and `validate` on the command line's subparsers."""
    _tune_parser(commands)
    _train_parser(commands)
    _profile_parser(commands)
    validate = commands.add_parser("validate", help="run plans with the runtime and print predicted vs measured "
                                                    "iteration time and memory (under torchrun / deepspeed)")
    validate.add_argument("job", help="job YAML or bundled job recipe name (its model may be a profile)")
    validate.add_argument("--plans", nargs="+", required=True, help="plan YAMLs for the launched device count")
    validate.add_argument("--steps", type=integer(1, 100_000), default=8,
                          help="timed steps per plan, at least (the fastest quarter's mean is compared; default 8)")
    validate.add_argument("--min-seconds", type=number(0, 86_400), default=0.0,
                          help="keep timing for at least this long, the plans' steps interleaved (default 0)")
    validate.add_argument("--one-at-a-time", action="store_true",
                          help="build and time one plan after another (plans that do not fit in memory together)")
    validate.add_argument("--profile-alongside", metavar="PROFILE_YAML", type=new_path,
                          help="also profile the job's model in the same rounds as the plans' steps, write it to "
                               "this new file and predict from it (judges the estimator on measurements of the "
                               "same seconds)")
    validate.add_argument("--warmup", type=integer(1, 10_000), default=2, help="untimed steps first (default 2)")
    validate.add_argument("--json", type=new_path, help="also write the results to this new JSON file")
    add_local_launch(validate)
    validate.set_defaults(run=_run_validate)


def add_local_launch(command) -> None:
    command.add_argument("--nproc-per-node", type=integer(1, 4096), metavar="N",
                         help="start N processes on this machine, as torchrun --standalone does, without torchrun's "
                              "traceback after an error (gbmw.adapters.runtime.local_launch; OMP_NUM_THREADS, if "
                              "unset, becomes the CPUs this process may use — affinity and cgroup quota — / N)")


def _run_validate(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from gbmw.adapters.profile.validate import print_validation, run_validate

    rank = int(os.environ.get("RANK", "0"))
    results = run_validate(args.job, args.plans, args.steps, args.warmup,
                           say=lambda text: print(text, flush=True) if rank == 0 else None,
                           min_seconds=args.min_seconds, one_at_a_time=args.one_at_a_time,
                           profile_alongside=args.profile_alongside)
    if rank == 0:
        summary = print_validation(results)
        if args.json:
            from gbmw.specs.files import write_new_file

            write_new_file(args.json, json.dumps({"plans": [asdict(result) for result in results],
                                                  "summary": summary}, indent=2))
    return 0


def _profile_parser(commands) -> None:
    profile = commands.add_parser("profile", help="measure layers (model) or links (cluster) on this machine")
    what = profile.add_subparsers(dest="what", required=True, metavar="WHAT")
    model = what.add_parser("model", help="per-layer time and stashed activations on this device → a model YAML")
    model.add_argument("model", help="model recipe name, model YAML or HF config.json (family gpt or bert)")
    model.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="fp32 (default) or bf16")
    model.add_argument("--batches", default="2,8", help="the two batch sizes measured (default 2,8)")
    model.add_argument("--repeats", type=integer(1, 10_000), default=15,
                       help="whole-model passes of each kind, at least (the fastest quarter is kept; default 15)")
    model.add_argument("--min-seconds", type=number(0, 86_400), default=None,
                       help="keep repeating the interleaved passes for at least this long (default 20: "
                            "spans the slow and fast phases of a shared machine)")
    model.add_argument("-o", "--output", type=new_path, required=True, help="the new model YAML to write")
    add_model_settings(model)
    model.set_defaults(run=_run_profile_model)
    cluster = what.add_parser("cluster", help="collective bandwidth/latency and overlap slowdown among the launched "
                                              "processes → a cluster YAML (run under torchrun or deepspeed)")
    cluster.add_argument("-o", "--output", type=new_path, required=True, help="the new cluster YAML to write")
    cluster.add_argument("--name", help="the cluster's name (default: the output file's stem)")
    cluster.add_argument("--links", help="link levels innermost first as name=devices, e.g. intra_node=8,inter_node=32 "
                                         "(default: one level per machine, from LOCAL_WORLD_SIZE)")
    cluster.add_argument("--repeats", type=integer(1, 10_000), default=10, help="timed repetitions per message size (the fastest quarter's mean is kept)")
    add_local_launch(cluster)
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
        raise GbmwError(f"--batches {shown(args.batches)}: give two batch sizes, e.g. 2,8") from None
    if not 1 <= small < large <= 4096:
        raise GbmwError(f"--batches {args.batches}: give two batch sizes, the smaller first, from 1 to 4096, e.g. 2,8")
    extra = {} if args.min_seconds is None else {"min_seconds": args.min_seconds}
    run_profile_model(args.model, args.precision, args.output, (small, large), args.repeats,
                      say=lambda text: print(text, flush=True), seq_length=args.seq_length,
                      flash_attention=args.flash_attention, **extra)
    return 0


def _train_parser(commands) -> None:
    train = commands.add_parser("train", help="run a plan with gbmw's hybrid runtime (one process, torchrun or deepspeed)")
    train.add_argument("job", help="job YAML or bundled job recipe name")
    train.add_argument("--plan", required=True, help="plan YAML (from gbmw plan -o, for this job's model)")
    train.add_argument("--steps", type=integer(0, 1_000_000), default=10, help="training steps to run (default 10)")
    train.add_argument("--lr", type=number(0, 10, low_open=True), default=1e-4, help="Adam learning rate (default 1e-4)")
    train.add_argument("--clip-grad", type=number(0, 1e6), default=1.0,
                       help="clip the global gradient norm to this; 0 turns clipping off (default 1.0, as Megatron and "
                            "DeepSpeed)")
    train.add_argument("--seed", type=integer(0, 2**32 - 1), default=0,
                       help="seed of the initial weights and of the data (the synthetic tokens, or --data's sample order)")
    train.add_argument("--data", metavar="PATH",
                       help="train on a tokenised dataset: Megatron's indexed dataset (PATH.bin + PATH.idx, PATH may name "
                            "either) or a .npy array of token ids; samples of seq_length + 1 tokens, the same in the same "
                            "order under any plan (default: reproducible synthetic tokens)")
    train.add_argument("--save", type=new_path, help="write a plan-independent checkpoint to this new folder at the end")
    train.add_argument("--save-every", type=integer(1, 1_000_000), metavar="STEPS",
                       help="also save every STEPS steps: --save becomes a folder of checkpoints DIR/step-NNNNNNNN, each "
                            "complete or absent whenever the run is killed; --load DIR resumes from the latest")
    train.add_argument("--load", help="resume from a checkpoint folder (saved under any plan or device count), or from "
                                      "the latest checkpoint in a --save-every folder")
    train.add_argument("--timeout", type=number(1, 7 * 86_400), default=300.0,
                       help="seconds a collective may wait for a peer before the job stops (default 300)")
    add_local_launch(train)
    train.set_defaults(run=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from gbmw.adapters.runtime.train import TrainSettings, train

    settings = TrainSettings(steps=args.steps, learning_rate=args.lr, max_grad_norm=args.clip_grad or None,
                             seed=args.seed, save=args.save, save_every=args.save_every, load=args.load,
                             timeout_s=args.timeout, local_rank=args.local_rank, data=args.data)
    train(args.job, args.plan, settings)
    return 0


def _tune_parser(commands) -> None:
    tune = commands.add_parser("tune", help="drop-in: re-plan the parallel settings of an existing DeepSpeed job")
    tune.add_argument("--ds-config", required=True, help="the job's existing ds_config.json (read, never changed)")
    tune.add_argument("--model", required=True, help="model recipe name, model YAML, or HF config.json")
    tune.add_argument("--cluster", required=True, help="cluster recipe name or YAML")
    tune.add_argument("--target", default="deepspeed", help="deepspeed (default), megatron-deepspeed, megatron-core")
    tune.add_argument("--memory", type=memory_size, help="per-device memory budget (default: the cluster's usable memory)")
    tune.add_argument("--current-tp", type=integer(1, MAX_DEVICES), default=1, help="the job's current tensor-parallel size (default 1)")
    tune.add_argument("--current-pp", type=integer(1, MAX_DEVICES), default=1, help="the job's current pipeline-parallel size (default 1)")
    tune.add_argument("--current", metavar="LAYOUT",
                      help="the job's current layout in --uniform's keys, e.g. tp=2,pp=4,sp=on,ep=8 or ulysses=4 "
                           "(keys tp, pp, sp, cp, ulysses, ep, zero, ckpt; zero, ckpt and ulysses default to the "
                           "ds_config's: its ZeRO stage, activation_checkpointing, sequence_parallel_size)")
    tune.add_argument("--current-ckpt", choices=("full", "none"),
                      help="the job's current recomputation (Megatron's --recompute-granularity full; default: whether "
                           "the ds_config has an activation_checkpointing section)")
    tune.add_argument("--batch", type=integer(1, MAX_GLOBAL_BATCH),
                      help="global batch to plan at (default: the ds_config's train_batch_size; needed where it is "
                           "\"auto\", an HF Trainer config)")
    tune.add_argument("--precision", choices=("bf16", "fp16", "fp32"),
                      help="training precision where the ds_config leaves it \"auto\" (default there: bf16, with a "
                           "note)")
    add_model_settings(tune)
    tune.add_argument("--script", default="pretrain_gpt.py", help="training script for the launch line")
    tune.add_argument("-o", "--output", type=new_or_empty_folder, help="a new folder for ds_config.json, plan.yaml, megatron_args.txt, launch.sh")
    tune.set_defaults(run=_run_tune)


def _run_tune(args: argparse.Namespace) -> int:
    from gbmw.adapters.tune import tune
    from gbmw.cli.report import print_tune

    result = tune(args.ds_config, args.model, args.cluster, args.target, args.output, args.memory,
                  args.current_tp, args.current_pp, args.current_ckpt, args.script, batch=args.batch,
                  seq_length=args.seq_length, flash_attention=args.flash_attention, precision=args.precision,
                  current=args.current)
    print_notes(result.notes)
    print_tune(result)
    return 0
