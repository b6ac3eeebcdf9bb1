"""Process start-up for the runtime: the device and backend (CUDA/NCCL when present, CPU/gloo otherwise)
and torch.distributed initialisation from what torchrun or the deepspeed launcher provides.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; the deepspeed launcher sets the
same environment and also passes `--local_rank=N` on the command line.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
from dataclasses import dataclass
from typing import Callable, TypeVar

from gbmw.adapters.runtime.cpu_threads import threads_per_process
from gbmw.errors import GbmwError, LostContactError, error_line


@dataclass(frozen=True)
class ProcessContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str


def device_and_backend(local_rank: int) -> tuple[str, str]:
    """("cuda:<local_rank>", "nccl") when CUDA is available, else ("cpu", "gloo")."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{local_rank % torch.cuda.device_count()}", "nccl"
    return "cpu", "gloo"


def cpu_threads_per_process(world_size: int) -> int:
    """The usable CPUs shared among the processes on this machine (gbmw.adapters.runtime.cpu_threads)."""
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or world_size)
    return threads_per_process(local_processes)


EXPANDABLE_SEGMENTS = "expandable_segments:True"


def expandable_segments_unless_set(environment) -> bool:
    """Ask torch's CUDA caching allocator for expandable segments unless the user configured it
    (PYTORCH_CUDA_ALLOC_CONF, or PYTORCH_ALLOC_CONF, its newer name): set the variable for this process and the ones
    it starts, and say whether this process must apply it too. gbmw's estimate of a stage's peak is what is
    allocated; with fixed-size segments the allocator also keeps blocks it cannot reuse for a new size. Measured on
    one H100 (docs/gpu-measurements.md): a plan estimated at 76.8 of the 77.65 GiB budget ran out of memory in its
    first step with 2.40 GiB reserved but unallocated, and ran with expandable segments."""
    if "PYTORCH_CUDA_ALLOC_CONF" in environment or "PYTORCH_ALLOC_CONF" in environment:
        return False
    environment["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE_SEGMENTS
    return True


def init_distributed(timeout_s: float = 300.0, local_rank: int | None = None) -> ProcessContext:
    """Initialise torch.distributed from the launcher's environment (one process when none is set)."""
    import torch
    import torch.distributed as dist

    environment = os.environ
    store = None
    if "RANK" not in environment or "WORLD_SIZE" not in environment:
        rank, world_size = 0, 1
        store = dist.HashStore()  # one process: no rendezvous, no port to collide with
    else:
        try:
            rank, world_size = int(environment["RANK"]), int(environment["WORLD_SIZE"])
        except ValueError:
            raise GbmwError(f"RANK={environment['RANK']!r} / WORLD_SIZE={environment['WORLD_SIZE']!r} are not "
                            "integers; start gbmw with torchrun or the deepspeed launcher") from None
    local = local_rank if local_rank is not None else int(environment.get("LOCAL_RANK", rank))
    device, backend = device_and_backend(local)
    if device.startswith("cuda"):
        if expandable_segments_unless_set(environment):
            torch.cuda.memory._set_allocator_settings(EXPANDABLE_SEGMENTS)
        torch.cuda.set_device(device)
    elif "OMP_NUM_THREADS" not in environment:
        torch.set_num_threads(cpu_threads_per_process(world_size))
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world_size, store=store,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return ProcessContext(rank, world_size, local, backend, device)


def finish_distributed(completed: bool) -> None:
    """Tear the process group down together: after a completed run every rank first meets at a barrier, so no
    rank destroys its gloo context while another still uses the group (seen as "terminate called without
    an active exception" on the rank that left first, after rank 0 spent a moment writing a file). After a
    failure there is no barrier — a peer may be gone — and the group is destroyed at once."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if completed:
        dist.barrier()
    dist.destroy_process_group()


T = TypeVar("T")


def start_after_checking(read: Callable[[], T], timeout_s: float = 300.0,
                         local_rank: int | None = None) -> tuple[T, ProcessContext]:
    """Run `read()` (which reads and checks a command's inputs), start torch.distributed, and agree: a GbmwError
    that any rank's `read` raised is raised on every rank (`agree`), so a rank that finds a problem the others do not
    stops them with it rather than leaving them to wait for it at the start. One process raises at once, without
    starting torch. Returns what `read` returned and the process context."""
    problem, value = None, None
    try:
        value = read()
    except GbmwError as error:
        if int(os.environ.get("WORLD_SIZE", "1") or 1) == 1:
            raise
        problem = str(error)
    context = init_distributed(timeout_s=timeout_s, local_rank=local_rank)
    try:
        agree(problem)
    except GbmwError:
        finish_distributed(True)  # every rank raises here together
        raise
    return value, context


def agree(problem: str | None, error: type[GbmwError] = GbmwError) -> None:
    """Every rank raises the same `error` when any rank has a problem — the first such rank's message, naming that
    rank where it is another — so no rank waits in a collective for a peer that stopped, and every rank exits with
    the same status. Rank 0 prints it at once, before any rank leaves (so a launcher cannot stop rank 0 before it has
    said why), and the error is marked `all_ranks` (gbmw.cli.main prints nothing more). A peer that died meanwhile is a
    DistributedError."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        problems = [problem]
    else:
        problems = [None] * dist.get_world_size()
        try:
            dist.all_gather_object(problems, problem)
        except RuntimeError as failure:
            raise lost_contact(failure, "while the processes compared their inputs") from None
    for rank, message in enumerate(problems):
        if message is not None:
            raised = error(message if rank == 0 else f"{message} (reported by rank {rank})")
            raised.all_ranks = True  # printed here, on rank 0: gbmw.cli.main prints nothing more
            if len(problems) > 1:
                _stop_with_user_error_status()
            if not dist.is_initialized() or dist.get_rank() == 0:
                print(error_line(raised), file=sys.stderr, flush=True)  # before any rank leaves (the teardown meets)
            raise raised


def _stop_with_user_error_status() -> None:
    """Every rank stops with status 2 now; a launcher that sees one rank exit first terminates the others (torchrun
    sends SIGTERM), and that must not turn their status into a signal's."""
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(2))
    except ValueError:  # not the main thread: leave the handler as it is
        pass


def lost_contact(failure: BaseException, when: str, then: str = "") -> LostContactError:
    """The one message of a rank whose peer died (torch.distributed reports it as a RuntimeError); `then` says what
    was saved."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    error = LostContactError(f"rank {rank}: lost contact with another process {when} "
                             f"({str(failure).splitlines()[0][:160] if str(failure) else type(failure).__name__}); "
                             f"a process died or was killed — stopping{then}")
    error.reported_by_another_rank = not _first_to_report_lost_contact()
    return error


LOST_CONTACT_REPORTS = "gbmw/lost-contact-reports"
"""The counter, in the job's key-value store, of survivors that found a peer gone."""
STORE_WAIT_S = 2.0


def _first_to_report_lost_contact() -> bool:
    """Whether this survivor is the first to find a peer gone, so the job's user reads one line and not one per
    survivor (issue 31): a counter in the job's key-value store — torchrun's agent holds it, or rank 0's process
    under a plain environment rendezvous. A store that does not answer within STORE_WAIT_S (its host died) makes
    every survivor report. Under gbmw's own launcher the launcher prints the one line (local_launch)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return True
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=STORE_WAIT_S))
        return store.add(LOST_CONTACT_REPORTS, 1) == 1
    except Exception:  # noqa: BLE001 - a dead store host fails in several ways: the node decides
        return _first_on_this_node()


_CLAIM: list = []
"""The socket that holds this node's claim to report (`_first_on_this_node`) until the process exits."""


def _first_on_this_node() -> bool:
    """Whether this survivor is the first on its node to report, when the job's store is gone with its host (rank 0
    under the deepspeed launcher): the first to bind a name in Linux's abstract socket namespace, unique to the job
    (its rendezvous address and port), wins. The name lives only as long as the process — nothing is written to
    disk. Where the namespace does not exist (not Linux) every survivor reports."""
    import errno
    import socket

    name = f"\0gbmw-lost-contact-{os.environ.get('MASTER_ADDR', '')}-{os.environ.get('MASTER_PORT', '')}"
    try:
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        claim.bind(name)
    except OSError as error:  # another survivor here holds it; any other failure (no abstract namespace): report
        return error.errno != errno.EADDRINUSE
    _CLAIM.append(claim)
    return True


def is_communication_failure(error: BaseException) -> bool:
    """Whether `error` is torch.distributed reporting a dead or unreachable peer."""
    import torch.distributed as dist

    text = str(error).lower()
    return isinstance(error, getattr(dist, "DistBackendError", ())) or (isinstance(error, RuntimeError) and any(
        marker in text for marker in ("connection", "gloo", "nccl", "timed out", "peer")))
