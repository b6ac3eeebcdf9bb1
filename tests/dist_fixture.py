"""Start N CPU processes with torch.distributed (gloo) on a free port, run a test function in each, and return what
each rank's call returned (the dist tier's fixture, as nanotron's and torchtitan's). The processes are forked by
multiprocessing's fork server, which imports torch and the runtime once (`PRELOADED_MODULES`)."""

from __future__ import annotations

import io
import os
import socket
import sys
import time
import traceback


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, function, args, results) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    from gbmw.adapters.runtime.launch import finish_distributed, init_distributed

    completed = False
    try:
        init_distributed(timeout_s=60)
        value = function(rank, world_size, *args)
        buffer = io.BytesIO()
        torch.save(value, buffer)  # tensors by value (a queue would share their memory with a process that exits)
        results.put((rank, "ok", buffer.getvalue()))
        completed = True
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, "failed", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            finish_distributed(completed)
        # Leave without the interpreter's shutdown, as `gbmw` does under a launcher (gbmw.cli.main.main): gloo's threads
        # can abort it now and then ("terminate called without an active exception", status -6, seen on CI after a
        # finished two-rank run). The queue's feeder thread hands over what was put first.
        results.close()
        results.join_thread()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if completed else 1)


PRELOADED_MODULES = ["torch", "torch.distributed", "gbmw.adapters.runtime.engine", "gbmw.adapters.runtime.launch",
                     "gbmw.adapters.runtime.train"]
"""What the fork server imports once, before it forks every rank of every test of this pytest process: importing torch,
megatron-core and the runtime took about 7 s of CPU per process, most of the dist tier's time when each rank was a
fresh interpreter (spawn). Each rank is still a new process whose modules are as imported (the server runs no test)."""


def run_distributed(world_size: int, function, *args, timeout_s: float = 90.0) -> list:
    """Run `function(rank, world_size, *args)` on `world_size` processes; returns their return values in rank order
    (tensors, numbers, strings and containers of them); raises with the first rank's traceback if any failed."""
    import queue

    import torch
    import torch.multiprocessing as mp

    context = mp.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED_MODULES)  # read when the server starts: the first call of the process
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_worker, args=(rank, world_size, port, function, args, results))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout_s  # a hang guard, not a speed check
    messages: dict[int, tuple[str, object]] = {}
    while len(messages) < world_size and time.monotonic() < deadline:
        try:  # read while the ranks run: a rank blocks on exit until its result is read
            rank, status, payload = results.get(timeout=0.5)
        except queue.Empty:
            if not any(process.is_alive() for process in processes):
                break  # some rank died without reporting
            continue
        messages[rank] = (status, payload)
        if status == "failed":  # the others may wait in a collective for it: give them a moment, then stop them
            deadline = min(deadline, time.monotonic() + 10)
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    alive = [process for process in processes if process.is_alive()]
    for process in alive:
        process.kill()
    failures = sorted((rank, text) for rank, (status, text) in messages.items() if status == "failed")
    if failures:
        rank, text = failures[0]
        raise AssertionError(f"rank {rank} failed:\n{text}")
    if alive:
        raise AssertionError(f"{len(alive)} processes did not finish within {timeout_s} s")
    if len(messages) != world_size or any(process.exitcode != 0 for process in processes):
        raise AssertionError(f"processes exited with {[process.exitcode for process in processes]} and "
                             f"{len(messages)} of {world_size} reported")
    return [torch.load(io.BytesIO(messages[rank][1]), weights_only=True) for rank in range(world_size)]
