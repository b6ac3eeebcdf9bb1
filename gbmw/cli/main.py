"""The `gbmw` command.

    gbmw space --devices 8 [--no-prune] [--json]
    gbmw estimate JOB (--plan plan.yaml | --uniform tp=8,pp=2,zero=1,ckpt=full,micro=1) [--memory 16GiB] [--json]
    gbmw plan JOB [--memory 16GiB] [--batch N | --sweep] [--target T] [--variant V] [-o plan.yaml] [--json]
                  [--figure plan.png]
    gbmw compare JOB [--memory 8GiB,16GiB] [--batch N | --sweep] [--handtuned NAME]
    gbmw tune --ds-config ds_config.json --model MODEL --cluster CLUSTER [--target T] [--batch N] [--seq-length S]
                  [--flash-attention] [--precision P] [-o DIR]
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
import logging
import os
import sys
import warnings
from typing import Sequence

from gbmw.cli.argument_types import OneLineParser, integer
from gbmw.cli.planning import add_planning_commands
from gbmw.cli.running import add_running_commands
from gbmw.errors import GbmwError, error_line


FRAMEWORK_IMPORT_WARNINGS = ("Transformer Engine and Apex are not installed",)
"""megatron-core's import-time UserWarnings about fused kernels gbmw's runtime does not use: printed before a
command's one line of output (issue 31: 8 lines before every --data error), they say nothing about the job."""
FRAMEWORK_LOG_LINES = ("Setting accelerator to CPU",)
"""DeepSpeed's log line on a machine without a GPU (its logger "DeepSpeed"), printed before tune's one line."""


def _quiet_framework_noise() -> None:
    for message in FRAMEWORK_IMPORT_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    deepspeed_logger = logging.getLogger("DeepSpeed")  # the same object DeepSpeed configures when it is imported
    if not any(isinstance(existing, _DropLines) for existing in deepspeed_logger.filters):
        deepspeed_logger.addFilter(_DropLines(FRAMEWORK_LOG_LINES))


class _DropLines(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def main(argv: Sequence[str] | None = None) -> int:
    _quiet_framework_noise()
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # a bad flag (one line already printed) or --help: the status, not an exception
        return stop.code if isinstance(stop.code, int) else 2
    try:
        if getattr(args, "nproc_per_node", None) is not None:
            from gbmw.adapters.runtime.local_launch import check_under_launcher, die_with_launcher, launch_locally

            if "RANK" not in os.environ:  # gbmw is the launcher: the workers run this same command line
                return launch_locally(args.nproc_per_node, list(sys.argv[1:] if argv is None else argv))
            die_with_launcher()
            check_under_launcher(args.nproc_per_node)
        status = args.run(args)
    except GbmwError as error:
        # Under a launcher an error every rank raised together (gbmw.adapters.runtime.launch.agree) was printed by
        # rank 0 alone, before the ranks parted; every rank exits with status 2.
        # … and a survivor of a dead peer prints only if it is the first to find it gone (adapters/runtime/launch.py)
        if not (getattr(error, "all_ranks", False) or getattr(error, "reported_by_another_rank", False)
                or _left_for_the_launcher(error)):
            print(error_line(error), file=sys.stderr, flush=True)
        status = 2
    except KeyboardInterrupt:
        print("gbmw: interrupted", file=sys.stderr)
        return 130
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        # Under a launcher every rank leaves now, after its process group was torn down, without the interpreter's
        # shutdown: a launcher that sees one rank exit terminates the others, and that shutdown (torch loaded) is long
        # enough for it to turn their status into SIGTERM's; and gloo's threads can abort the process during it
        # ("terminate called without an active exception", status -6) — after a peer died, and now and then after
        # a finished run too (pytorch/pytorch#179291 describes the finalisation race).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _left_for_the_launcher(error: GbmwError) -> bool:
    """Under gbmw's own launcher, a rank that lost a peer leaves its line for the launcher to print once."""
    if "GBMW_FAILURE_REPORTS" not in os.environ:
        return False
    from gbmw.adapters.runtime.local_launch import report_to_launcher

    return report_to_launcher(error)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gbmw",
        description="Galvatron-BMW automatic hybrid parallelism for Transformer training.",
    )
    parser.add_argument("--local_rank", "--local-rank", type=integer(0, 4096), dest="local_rank", default=None,
                        help=argparse.SUPPRESS)  # the deepspeed launcher passes --local_rank=N before the command
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_planning_commands(commands)
    add_running_commands(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
