"""Spawn N CPU processes with torch.distributed (gloo) on a free port and run a test function in each."""

from __future__ import annotations

import os
import socket
import time
import traceback


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, function, args, errors) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import torch.distributed as dist

    from gbmw.adapters.runtime.launch import init_distributed

    try:
        init_distributed(timeout_s=60)
        function(rank, world_size, *args)
    except BaseException:  # noqa: BLE001 - reported to the parent
        errors.put((rank, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(world_size: int, function, *args, timeout_s: float = 90.0) -> None:
    """Run `function(rank, world_size, *args)` on `world_size` processes; raise with the first failure."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    errors = context.SimpleQueue()
    port = free_port()
    processes = [context.Process(target=_worker, args=(rank, world_size, port, function, args, errors))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    alive = [process for process in processes if process.is_alive()]
    for process in alive:
        process.kill()
    if not errors.empty():
        rank, text = errors.get()
        raise AssertionError(f"rank {rank} failed:\n{text}")
    if alive:
        raise AssertionError(f"{len(alive)} processes did not finish within {timeout_s} s")
    failed = [process.exitcode for process in processes if process.exitcode != 0]
    if failed:
        raise AssertionError(f"processes exited with {failed}")
