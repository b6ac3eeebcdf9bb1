"""`gbmw train … --nproc-per-node N`: start N local processes as `torchrun --standalone` does, and end as gbmw ends.

torchrun reports any worker's non-zero exit by re-raising `ChildFailedError` from its `@record`-decorated main, so a
user error that rank 0 already printed in one line (gbmw.cli.main.main) is followed by torchrun's own Python traceback
and a failure table, and torchrun exits with status 1 rather than the workers' 2. Nothing in torchrun turns that
off. This launcher runs the same machinery (torch.distributed.launcher.api.elastic_launch: a c10d rendezvous on a
free local port, no restarts) from inside gbmw, so it can catch that exception: the workers' one line stays the only
output and gbmw exits with the first failed worker's status. A worker that died without gbmw's line (a signal, an
uncaught exception whose traceback the worker printed itself) gets one more line naming its rank and status.

The workers die with this launcher (issue 31: killed with SIGKILL, it left them training to the end): each asks
Linux to send it SIGTERM when its parent exits (`prctl(PR_SET_PDEATHSIG)`, `die_with_launcher`), and a SIGTERM or
SIGINT of the launcher stops the workers (torch's agent) and ends gbmw with one line, not the agent's traceback.

A worker killed alone (any rank, any signal) leaves its peers to find it gone in their next collective: each survivor
would print its own "lost contact" line. Under this launcher a survivor instead leaves that line in a folder the
launcher made for the run (`FAILURE_REPORTS`, `report_to_launcher`), and the launcher prints one line — the lowest
surviving rank's, which says at which step and what was saved, plus the rank that ended by a signal.

One node only: a multi-node job still uses torchrun or the deepspeed launcher on every node.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Sequence

from gbmw.errors import GbmwError, LostContactError, error_line
from gbmw.adapters.runtime.cpu_threads import threads_per_process

LAUNCHER_PID = "GBMW_LAUNCHER_PID"
"""Set for the workers of `launch_locally`: the process they must not outlive."""
PR_SET_PDEATHSIG = 1
"""prctl(2): the signal a process gets when its parent exits."""

FAILURE_REPORTS = "GBMW_FAILURE_REPORTS"
"""Set for the workers of `launch_locally`: the folder where a survivor of a dead peer leaves its line."""

RANK_ZERO_FIRST_S = 2.0
"""How long the other ranks wait before leaving with an error only rank 0 prints (it needs well under a second)."""


def launch_locally(num_processes: int, argv: Sequence[str]) -> int:
    """Run `python -m gbmw *argv` in `num_processes` local processes under torch's elastic agent; returns the exit
    status gbmw should end with (0, or the first failed worker's status). The workers see RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR and MASTER_PORT as under torchrun, and run `argv` unchanged (under a launcher gbmw reads
    `--nproc-per-node` only to check it against LOCAL_WORLD_SIZE)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from torch.distributed.elastic.multiprocessing.api import SignalException

    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(threads_per_process(num_processes))
    os.environ[LAUNCHER_PID] = str(os.getpid())
    reports = Path(tempfile.mkdtemp(prefix="gbmw-launch-"))  # this run's own folder, removed at the end
    os.environ[FAILURE_REPORTS] = str(reports)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=num_processes, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1)
    # The agent's log lines ("failed (exitcode: 2)", "Received 15 death signal, shutting down workers") repeat what gbmw
    # says in its one line; torch gives each of its modules a logger with its own level, so each is quietened.
    elastic_loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
                       if name.startswith("torch.distributed.elastic")]
    levels = [elastic_logger.level for elastic_logger in elastic_loggers]
    for elastic_logger in elastic_loggers:
        elastic_logger.setLevel(logging.CRITICAL)
    try:
        elastic_launch(config, sys.executable)("-m", "gbmw", *argv)
    except SignalException as stopped:  # torch's agent stopped the workers before re-raising it
        print(f"gbmw: error: stopped by signal {int(stopped.sigval)}; the {num_processes} local processes were "
              "stopped (a checkpoint is written only when complete)", file=sys.stderr, flush=True)
        return 128 + int(stopped.sigval)
    except ChildFailedError as failed:
        return _report_failure(failed.failures, _read_reports(reports), num_processes)
    finally:
        for elastic_logger, level in zip(elastic_loggers, levels):
            elastic_logger.setLevel(level)
        shutil.rmtree(reports, ignore_errors=True)
        os.environ.pop(FAILURE_REPORTS, None)
    return 0


def _report_failure(failures: dict, survivor_lines: dict[int, str], num_processes: int) -> int:
    """One line for workers that failed, and gbmw's exit status: nothing more after gbmw's own error (status 2, rank 0
    printed it); a survivor's "lost contact" line with the rank a signal ended; else the first failed rank's status."""
    ended = {rank: failure.exitcode for rank, failure in failures.items() if rank not in survivor_lines}
    if survivor_lines:
        killed = sorted((rank for rank, code in ended.items() if code < 0), key=lambda rank: ended[rank] == -15)
        cause = (f" (rank {killed[0]} of {num_processes} ended with signal {-ended[killed[0]]}, "
                 f"{signal.Signals(-ended[killed[0]]).name})" if killed else "")
        print(f"{survivor_lines[min(survivor_lines)]}{cause}", file=sys.stderr, flush=True)
        return 1
    if 2 in ended.values():  # gbmw's own error: rank 0 printed its one line
        return 2
    rank = min(ended, key=lambda rank: (failures[rank].timestamp, rank))
    code = ended[rank]
    how = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"status {code}"
    print(f"gbmw: error: rank {rank} of {num_processes} local processes ended with {how}", file=sys.stderr, flush=True)
    return code if code > 0 else 1


def _read_reports(folder: Path) -> dict[int, str]:
    lines = {}
    for file in folder.glob("rank-*.txt"):
        try:
            lines[int(file.stem.removeprefix("rank-"))] = file.read_text(encoding="utf-8").strip()
        except (OSError, ValueError, UnicodeDecodeError):
            continue
    return lines


def report_to_launcher(error: GbmwError) -> bool:
    """In a worker of `launch_locally`: leave a lost-contact line for the launcher to print once (module docstring)
    instead of printing it; False (print it yourself) for any other error or launcher."""
    folder = os.environ.get(FAILURE_REPORTS)
    if not isinstance(error, LostContactError) or folder is None or str(os.getppid()) != os.environ.get(LAUNCHER_PID):
        return False
    try:
        (Path(folder) / f"rank-{int(os.environ.get('RANK', '0'))}.txt").write_text(error_line(error), encoding="utf-8")
    except OSError:
        return False
    return True


def die_with_launcher() -> None:
    """In a worker of `launch_locally`: receive SIGTERM when the launcher exits, however it ends (Linux; elsewhere
    nothing), and stop at once if it is already gone."""
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher is None or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the launcher's own shutdown still stops the workers
        return
    if str(os.getppid()) != launcher:  # it died before prctl took effect
        os._exit(128 + int(signal.SIGTERM))


def check_under_launcher(num_processes: int) -> None:
    """Under a launcher, `--nproc-per-node` must say what the launcher started (LOCAL_WORLD_SIZE, or WORLD_SIZE)."""
    launched = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
    if launched != num_processes:
        error = GbmwError(f"--nproc-per-node {num_processes}: a launcher already started {launched} process(es) on "
                          "this node; drop --nproc-per-node under torchrun or deepspeed, or run gbmw alone with it")
        # every rank reads the same environment and finds the same problem: rank 0 alone prints it (gbmw.cli.main). No
        # collective orders the ranks here, so the others wait a moment before leaving: a launcher that sees one of
        # them exit first terminates rank 0 before its line is out (seen on CI).
        error.all_ranks = os.environ.get("RANK", "0") != "0"
        if error.all_ranks:
            time.sleep(RANK_ZERO_FIRST_S)
        raise error
