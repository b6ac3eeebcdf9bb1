"""Collective timing on the launched processes for `gbmw profile cluster` (torch.distributed initialised on
every rank; torch is imported inside the functions).

Every rank runs the same measurements (NCCL tensors on the rank's CUDA device, gloo tensors on the CPU).
For each group size g (2, 4, … up to the world size) the ranks split into groups of g consecutive ranks
that all run at once — the planner's convention (gbmw/cost/comm.py): a level's bandwidth is what a collective
reaches when every device of every island takes part. Per message size: one untimed warm-up, then
`repeats` repetitions, each after a barrier; a repetition's time is the slowest rank's (all-reduce MAX);
the mean of the fastest quarter of repetitions is kept (timing.py says why). p2p: the first half of each
group sends to the second half (rank r to r + g/2), all pairs at once, as pipeline stages do
(CommModel.p2p_s). link_fit.py turns the timings into latency and bus bandwidth.

The rank helpers here (`_ranks`, `_barrier`, `_slowest`, `_timed`) serve the other cluster measurements too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gbmw.errors import GbmwError, SpecError

from .link_fit import (COLLECTIVES, ELEMENT_BYTES, LAUNCH_HINT, CollectiveTiming, _is_power_of_two, check_collectives,
                       check_sizes, check_world_size, power_of_two_group_sizes)
from .timing import fast_mean_s

DEFAULT_REPEATS = 10


@dataclass(frozen=True)
class _Ranks:
    rank: int
    world_size: int
    device: Any
    """torch.device: the rank's CUDA device under NCCL, else the CPU."""

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def _ranks() -> _Ranks:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise GbmwError(f"profiling a cluster needs torch.distributed initialised with at least 2 processes; {LAUNCH_HINT}")
    world_size = dist.get_world_size()
    check_world_size(world_size)
    backend = str(dist.get_backend()).lower()
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
    return _Ranks(dist.get_rank(), world_size, device)


def _synchronize(ranks: _Ranks) -> None:
    if ranks.is_cuda:
        import torch

        torch.cuda.synchronize(ranks.device)


def _barrier(ranks: _Ranks) -> None:
    """All ranks here before any goes on (a one-element all-reduce; works alike on gloo and NCCL)."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.zeros(1, device=ranks.device))
    _synchronize(ranks)


def _slowest(ranks: _Ranks, seconds: Sequence[float]) -> list[float]:
    """Element-wise maximum over ranks."""
    import torch
    import torch.distributed as dist

    values = torch.tensor(list(seconds), dtype=torch.float64, device=ranks.device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values.cpu().tolist()


def _timed(ranks: _Ranks, operation: Callable[[], None], repeats: int) -> float:
    """Fast-quarter mean over `repeats` of the slowest rank's time of `operation`, each after a barrier."""
    own = []
    for _ in range(repeats):
        _barrier(ranks)
        start = time.perf_counter()
        operation()
        _synchronize(ranks)
        own.append(time.perf_counter() - start)
    return fast_mean_s(_slowest(ranks, own))


def _repeated(operation: Callable[[], Any], count: int) -> Callable[[], None]:
    def loop() -> None:
        for _ in range(count):
            operation()

    return loop


def _groups(ranks: _Ranks, group_sizes: Sequence[int]) -> dict[int, Any]:
    """This rank's group of each size: groups of consecutive ranks, created in the same order everywhere."""
    import torch.distributed as dist

    mine = {}
    for size in group_sizes:
        if size == ranks.world_size:
            mine[size] = dist.group.WORLD
            continue
        for first in range(0, ranks.world_size, size):
            group = dist.new_group(list(range(first, first + size)))
            if first <= ranks.rank < first + size:
                mine[size] = group
    return mine


def _operation(collective: str, ranks: _Ranks, group: Any, group_size: int, message_bytes: int):
    """(variant name, callable) candidates for one collective, preferred first."""
    import torch
    import torch.distributed as dist

    elements = message_bytes // ELEMENT_BYTES
    full = torch.ones(elements, device=ranks.device)
    shard = torch.ones(elements // group_size, device=ranks.device)
    if collective == "all_reduce":
        return [("all_reduce", lambda: dist.all_reduce(full, group=group))]
    chunks = list(full.chunk(group_size))

    def tensor_call(name: str, output: Any, source: Any) -> tuple[str, Callable[[], None]]:
        call = getattr(dist, name)
        return name, lambda: call(output, source, group=group)

    if collective == "all_gather":  # newest tensor API first (torch 2.13 deprecates all_gather_into_tensor)
        return [*(tensor_call(name, full, shard) for name in ("all_gather_single", "all_gather_into_tensor")
                  if hasattr(dist, name)),
                ("all_gather", lambda: dist.all_gather(chunks, shard, group=group))]
    if collective == "reduce_scatter":
        return [*(tensor_call(name, shard, full) for name in ("reduce_scatter_single", "reduce_scatter_tensor")
                  if hasattr(dist, name)),
                ("reduce_scatter", lambda: dist.reduce_scatter(shard, chunks, group=group))]
    # p2p: the first half of each group sends to the second half, rank r to r + g/2
    half = group_size // 2
    offset = ranks.rank % group_size
    if offset < half:
        return [("send/recv", lambda: dist.send(full, ranks.rank + half))]
    return [("send/recv", lambda: dist.recv(full, ranks.rank - half))]


def measure_collectives(sizes_bytes: Sequence[int], repeats: int = DEFAULT_REPEATS,
                        group_sizes: Sequence[int] | None = None,
                        collectives: Sequence[str] = COLLECTIVES,
                        progress: Callable[[str], None] | None = None) -> list[CollectiveTiming]:
    """Time each collective over groups of each size (default 2, 4, … world size) for each message size.

    Call on every rank with the same arguments. Returns the same list on every rank. A collective the
    backend lacks (every variant raises) is returned with `seconds=None` and the backend's reason.
    """
    ranks = _ranks()
    collectives = check_collectives(collectives)
    group_sizes = tuple(group_sizes or power_of_two_group_sizes(ranks.world_size))
    for size in group_sizes:
        if size < 2 or not _is_power_of_two(size) or ranks.world_size % size:
            raise SpecError(f"group_sizes {list(group_sizes)}: {size} is not a power of two ≥ 2 dividing the world "
                            f"size {ranks.world_size}; use some of {list(power_of_two_group_sizes(ranks.world_size))}")
    sizes = check_sizes(sizes_bytes, max(group_sizes))
    if repeats < 1:
        raise SpecError(f"repeats {repeats}: must be at least 1 (10 is a good default)")
    groups = _groups(ranks, group_sizes)
    timings = []
    for group_size in group_sizes:
        for collective in collectives:
            if progress is not None:
                progress(f"{collective} over groups of {group_size}: {len(sizes)} sizes × {repeats} repeats")
            variant, reason = None, ""
            for message_bytes in sizes:
                candidates = _operation(collective, ranks, groups[group_size], group_size, message_bytes)
                if variant is not None:
                    candidates = [candidate for candidate in candidates if candidate[0] == variant]
                chosen = None
                for name, operation in candidates:
                    try:
                        operation()  # warm-up; also finds the variant the backend supports
                        _synchronize(ranks)
                    except (RuntimeError, NotImplementedError, ValueError) as error:
                        reason = f"{name}: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
                        continue
                    chosen = name, operation
                    break
                if chosen is None:
                    timings.append(CollectiveTiming(collective, group_size, message_bytes, None, repeats,
                                                    note=f"the backend lacks it ({reason})"))
                    continue
                variant = chosen[0]
                seconds = _timed(ranks, chosen[1], repeats)
                timings.append(CollectiveTiming(collective, group_size, message_bytes, seconds, repeats, variant))
    return timings
