"""`gbmw profile cluster`: measure the interconnect among the launched processes and write a cluster YAML.

Every rank runs the same measurements (torch.distributed already initialised: NCCL tensors on the
rank's CUDA device, gloo tensors on the CPU); rank 0 writes the file and prints the fits.

1. Collectives (`measure_collectives`). For each group size g (2, 4, … up to the world size) the
   ranks split into groups of g consecutive ranks that all run at once — the planner's convention
   (gbmw/comm.py): a level's bandwidth is what a collective reaches when every device of every
   island takes part. Per message size: one untimed warm-up, then `repeats` repetitions, each
   after a barrier; a repetition's time is the slowest rank's (all-reduce MAX); the mean of the
   fastest quarter of repetitions is kept (timing.py says why). p2p: the first half of each group sends to the second half (rank r to
   r + g/2), all pairs at once, as pipeline stages do (CommModel.p2p_s).
2. Fit (`fit_link`): t = a + b·M by least squares on relative residuals, Σ((a + b·M_i − t_i)/t_i)²,
   so the small messages set the latency and the large ones the bandwidth (a plain fit lets the
   noise of a 16 MiB message swamp a 50 µs intercept). Converted to the planner's ring formulas
   (Thakur et al., 2005; bus bandwidth as nccl-tests define it):
     all-reduce      t = 2(n−1)/n · M/B + 2(n−1)·α  →  B = 2(n−1)/n / b,  α = a / (2(n−1))
     all-gather      t = (n−1)/n · M/B + (n−1)·α    →  B = (n−1)/n / b,   α = a / (n−1)   (M gathered)
     reduce-scatter  as all-gather                                                    (M before scattering)
     p2p             t = M/B + α                     →  B = 1 / b,         α = a
3. Overlap slowdown (`measure_overlap_slowdown`): a matmul loop and an all-reduce loop of about
   equal length, alone and at once (paper Sec. 5: overlapped compute and communication both slow
   down). The factor f is the one that makes the estimator's overlapped time
   max(c, g) + (f − 1)·min(c, g) (gbmw/layer_cost.py) equal the measured wall time.
4. Device: fp32 matmul rate on every rank at once (the slowest rank's) as the peak; sustained =
   peak × `sustained_fraction` (default 0.5, an assumption stated in the file's sources; `gbmw
   profile model` measures layer times that supersede it). Memory: the CUDA device's total, or
   the machine's physical memory divided among the processes on it.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gbmw.errors import GbmwError, SpecError

from .timing import fast_mean_s

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "p2p")
ELEMENT_BYTES = 4
"""Messages are fp32 tensors."""
DEFAULT_SIZES_BYTES_CPU: tuple[int, ...] = (2**12, 2**16, 2**20, 2**22, 2**24)
"""4 KiB … 16 MiB: gloo moves ~1 GB/s, so the largest takes ~20 ms."""
DEFAULT_SIZES_BYTES_CUDA: tuple[int, ...] = (2**13, 2**17, 2**21, 2**25, 2**28)
"""8 KiB … 256 MiB: NCCL reaches its bus bandwidth only with messages of hundreds of MiB."""
DEFAULT_REPEATS = 10
DEFAULT_SUSTAINED_FRACTION = 0.5
LAUNCH_HINT = "launch with torchrun --nproc_per_node 2 -m gbmw profile cluster …"


@dataclass(frozen=True)
class CollectiveTiming:
    """The fast-quarter time (timing.py) of one collective over groups of `group_size` ranks for one message size."""

    collective: str
    """One of COLLECTIVES."""
    group_size: int
    message_bytes: int
    """all-reduce: the tensor; all-gather: the gathered output; reduce-scatter: the input; p2p: what is sent."""
    seconds: float | None
    """Median over repetitions of the slowest rank's time; None when the backend lacks the collective."""
    repeats: int
    variant: str = ""
    """The torch.distributed call that ran (e.g. `all_gather_single`)."""
    note: str = ""
    """Why the collective was not measured."""


@dataclass(frozen=True)
class LinkFit:
    """Latency and bus bandwidth of one collective over one group size, in the planner's convention."""

    collective: str
    group_size: int
    latency_us: float | None
    """Per-step latency α (µs); None when not measured."""
    bandwidth_gb_per_s: float | None
    """Bus bandwidth B (GB/s, 1e9 bytes/s); None when not measured."""
    sizes_bytes: tuple[int, ...] = ()
    note: str = ""
    """Non-empty when the fit was degenerate (what was clamped and why) or nothing was measured."""


@dataclass(frozen=True)
class OverlapMeasurement:
    """Compute and communication loops alone and overlapped; times of the slowest rank, fast-quarter means."""

    compute_alone_s: float
    communication_alone_s: float
    compute_overlapped_s: float
    communication_overlapped_s: float
    matmul_dim: int
    message_bytes: int
    matmuls: int
    all_reduces: int

    @property
    def slowdown(self) -> float:
        """f with max(c, g) + (f − 1)·min(c, g) = the overlapped wall time; at least 1.0."""
        alone_long = max(self.compute_alone_s, self.communication_alone_s)
        alone_short = min(self.compute_alone_s, self.communication_alone_s)
        together = max(self.compute_overlapped_s, self.communication_overlapped_s)
        return max(1.0, 1.0 + (together - alone_long) / alone_short)


# ----------------------------------------------------------------------------------------------
# Fits and options (pure: no torch)
# ----------------------------------------------------------------------------------------------


def bus_factor(collective: str, group_size: int) -> float:
    """Bus bandwidth over algorithm bandwidth (nccl-tests): what each link carries per message byte."""
    n = group_size
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "p2p": 1.0}[collective]


def latency_steps(collective: str, group_size: int) -> int:
    """Sequential steps of the ring algorithm, each paying the per-step latency α."""
    n = group_size
    return {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1, "p2p": 1}[collective]


def fit_link(collective: str, group_size: int, sizes_bytes: Sequence[int], seconds: Sequence[float]) -> LinkFit:
    """Latency and bus bandwidth from the fast-quarter times per message size (see the module docstring, 2.)."""
    check_collectives([collective])
    x = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if len(x) != len(t) or len(x) == 0 or np.any(t <= 0):
        raise ValueError(f"fit_link needs one positive time per size; got sizes {list(sizes_bytes)}, times {list(seconds)}")
    note = ""
    if len(np.unique(x)) < 2:
        a, b = 0.0, float(np.median(t / x))
        note = "one message size cannot separate latency from bandwidth: latency 0, bandwidth from size over time"
    else:
        weights = 1.0 / t
        (a, b), *_ = np.linalg.lstsq(np.stack([weights, x * weights], axis=1), np.ones_like(t), rcond=None)
    if b <= 0:
        largest = int(np.argmax(x))
        a, b = 0.0, t[largest] / x[largest]
        note = ("time does not grow with message size: bandwidth is the largest message's size over its time "
                "(a lower bound) and latency 0; measure larger sizes")
    elif a < 0:
        intercept_us = a * 1e6
        a, b = 0.0, float(np.sum(x / t) / np.sum((x / t) ** 2))
        note = f"negative intercept ({intercept_us:.1f} µs): latency clamped to 0, bandwidth refit through the origin"
    return LinkFit(
        collective=collective,
        group_size=group_size,
        latency_us=float(a) / latency_steps(collective, group_size) * 1e6,
        bandwidth_gb_per_s=bus_factor(collective, group_size) / float(b) / 1e9,
        sizes_bytes=tuple(int(size) for size in sizes_bytes),
        note=note,
    )


def fit_timings(timings: Sequence[CollectiveTiming]) -> list[LinkFit]:
    """One LinkFit per (collective, group size), in the order first seen."""
    grouped: dict[tuple[str, int], list[CollectiveTiming]] = {}
    for timing in timings:
        grouped.setdefault((timing.collective, timing.group_size), []).append(timing)
    fits = []
    for (collective, group_size), rows in grouped.items():
        measured = sorted((row for row in rows if row.seconds is not None), key=lambda row: row.message_bytes)
        if not measured:
            fits.append(LinkFit(collective, group_size, None, None, note=rows[0].note or "not measured"))
            continue
        fits.append(fit_link(collective, group_size, [row.message_bytes for row in measured],
                             [row.seconds for row in measured]))
    return fits


def check_collectives(collectives: Sequence[str]) -> tuple[str, ...]:
    unknown = [name for name in collectives if name not in COLLECTIVES]
    if unknown or not collectives:
        raise SpecError(f"collectives {list(collectives)!r}: unknown {unknown or 'none given'}; "
                        f"choose from {', '.join(COLLECTIVES)}")
    return tuple(dict.fromkeys(collectives))


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def power_of_two_group_sizes(world_size: int) -> tuple[int, ...]:
    """2, 4, … up to `world_size`."""
    return tuple(2**k for k in range(1, world_size.bit_length()) if 2**k <= world_size)


def check_world_size(world_size: int) -> None:
    if world_size < 2:
        raise GbmwError(f"profiling a cluster needs at least 2 processes, got world size {world_size}; {LAUNCH_HINT}")
    if not _is_power_of_two(world_size):
        raise SpecError(f"world size {world_size}: profiling times groups of 2, 4, 8, … consecutive ranks, so the "
                        "number of processes must be a power of two (2, 4, 8, …)")


def check_link_levels(link_levels: Sequence[tuple[str, int]], world_size: int) -> tuple[tuple[str, int], ...]:
    """Levels innermost first, each island a power of two dividing the world size, growing, the last = world."""
    if not link_levels:
        raise SpecError(f"link_levels is empty; give at least one level spanning all {world_size} processes, "
                        f"e.g. [('intra_node', {world_size})]")
    checked = []
    previous = 1
    for index, level in enumerate(link_levels):
        try:
            name, devices = level
        except (TypeError, ValueError):
            raise SpecError(f"link_levels[{index}] {level!r}: expected (level name, island devices), "
                            "e.g. ('intra_node', 8)") from None
        where = f"link_levels[{index}] ({name!r}, {devices!r})"
        if not isinstance(name, str) or not name:
            raise SpecError(f"{where}: the level name must be a non-empty string such as 'intra_node'")
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 2 or not _is_power_of_two(devices):
            raise SpecError(f"{where}: island size {devices!r} is not a power of two ≥ 2; "
                            f"use one of {list(power_of_two_group_sizes(world_size))}")
        if world_size % devices != 0:
            raise SpecError(f"{where}: island size {devices} does not divide the world size {world_size}; "
                            f"use one of {list(power_of_two_group_sizes(world_size))}")
        if devices <= previous:
            raise SpecError(f"{where}: island size {devices} is not larger than the previous level's ({previous}); "
                            "list levels innermost first with growing islands")
        checked.append((name, devices))
        previous = devices
    if previous != world_size:
        raise SpecError(f"link_levels: the outermost level {checked[-1]!r} spans {previous} devices but "
                        f"{world_size} processes were launched; the last level must span all of them")
    return tuple(checked)


def parse_link_levels(text: str) -> tuple[tuple[str, int], ...]:
    """`intra_node=8,inter_node=32` → (('intra_node', 8), ('inter_node', 32)) (for the CLI)."""
    levels = []
    for part in text.split(","):
        name, _, devices = part.strip().partition("=")
        if not name or not devices.strip().isdigit():
            raise SpecError(f"--links {text!r}: {part.strip()!r} is not NAME=DEVICES; "
                            "write e.g. intra_node=8,inter_node=32 (innermost first)")
        levels.append((name.strip(), int(devices)))
    return tuple(levels)


def default_link_levels(world_size: int, local_world_size: int) -> tuple[tuple[str, int], ...]:
    """One `intra_node` level on one machine; `intra_node` + `inter_node` across machines."""
    if local_world_size >= world_size:
        return (("intra_node", world_size),)
    if local_world_size < 2 or not _is_power_of_two(local_world_size) or world_size % local_world_size:
        raise SpecError(f"{local_world_size} processes per node of {world_size}: cannot form an intra_node level "
                        "of power-of-two islands; pass link_levels explicitly, e.g. [('inter_node', "
                        f"{world_size})]")
    return (("intra_node", local_world_size), ("inter_node", world_size))


def check_sizes(sizes_bytes: Sequence[int], largest_group: int) -> tuple[int, ...]:
    """Distinct message sizes, ascending; each a multiple of 4 bytes × the largest group (all-gather shards)."""
    quantum = ELEMENT_BYTES * largest_group
    sizes = sorted(set(sizes_bytes))
    bad = [size for size in sizes if isinstance(size, bool) or not isinstance(size, int) or size <= 0 or size % quantum]
    if bad:
        raise SpecError(f"sizes_bytes {list(sizes_bytes)}: {bad} are not positive multiples of {quantum} bytes "
                        f"(fp32 elements × group size {largest_group}); use e.g. 4096, 1048576")
    if len(sizes) < 2:
        raise SpecError(f"sizes_bytes {list(sizes_bytes)}: give at least two message sizes to separate latency "
                        "from bandwidth, e.g. 4096,16777216")
    return tuple(sizes)


def format_size(count: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:g} {unit}"
    return f"{count:g} B"


def _round(value: float, digits: int = 4) -> float:
    """A readable number for the YAML (4 significant digits)."""
    return float(f"{value:.{digits}g}")


def build_cluster_spec(name: str, timings: Sequence[CollectiveTiming], overlap_slowdown: float,
                       link_levels: Sequence[tuple[str, int]], device_name: str, memory_bytes: int,
                       peak_tflops: Mapping[str, float], sustained_tflops: Mapping[str, float],
                       devices_per_node: int | None = None, reserved_memory_bytes: int = 0,
                       sources: Sequence[str] = ()) -> dict[str, Any]:
    """The cluster YAML mapping (validated as a ClusterSpec) from measured timings.

    Each link level takes the all-reduce fit of the group size equal to its island. `peak_tflops` and
    `sustained_tflops` map precisions (`fp32`, `bf16`, …) to TFLOP/s; `sources` describe how the device
    figures were obtained and must start with "measured: " or cite an http address.
    """
    from gbmw.cluster_spec import ClusterSpec
    from gbmw.schema import validate_as

    try:
        world_size = int(link_levels[-1][1]) if link_levels else 0
    except (TypeError, IndexError, ValueError):
        world_size = 0
    levels = check_link_levels(link_levels, world_size)
    fits = {(fit.collective, fit.group_size): fit for fit in fit_timings(timings)}
    by_size = {}
    for timing in timings:
        if timing.collective == "all_reduce" and timing.seconds is not None:
            by_size.setdefault(timing.group_size, []).append(timing)
    links, link_sources = [], []
    for level_name, devices in levels:
        fit = fits.get(("all_reduce", devices))
        if fit is None or fit.bandwidth_gb_per_s is None:
            measured = sorted(size for (collective, size) in fits if collective == "all_reduce")
            raise SpecError(f"link level ({level_name!r}, {devices}) needs all_reduce timings over groups of {devices}; "
                            f"measured all_reduce group sizes: {measured}")
        links.append({"name": level_name, "devices": devices, "bandwidth_gb_per_s": _round(fit.bandwidth_gb_per_s),
                      "latency_us": _round(fit.latency_us)})
        rows = sorted(by_size[devices], key=lambda row: row.message_bytes)
        link_sources.append(
            f"measured: {level_name}: all_reduce of fp32 messages {format_size(rows[0].message_bytes)}–"
            f"{format_size(rows[-1].message_bytes)} ({len(rows)} sizes) over every group of {devices} consecutive "
            f"ranks of {world_size} at once, mean of the fastest quarter of {rows[0].repeats} repetitions of the slowest rank, fit "
            f"t = a + bytes·b on relative residuals: {fit.bandwidth_gb_per_s:.4g} GB/s bus bandwidth, "
            f"{fit.latency_us:.4g} µs per ring step" + (f" ({fit.note})" if fit.note else "")
            + f" — gbmw profile cluster, {datetime.date.today().isoformat()}")
    per_node = devices_per_node or world_size
    if world_size % per_node:
        raise SpecError(f"devices_per_node {per_node} does not divide the {world_size} processes")
    all_sources = [*link_sources, *sources]
    uncited = [source for source in all_sources if not (source.startswith("measured: ") or "http" in source)]
    if uncited:
        raise SpecError(f"sources {uncited!r}: each source must start with 'measured: ' or cite an http address")
    mapping = {
        "name": name,
        "nodes": world_size // per_node,
        "devices_per_node": per_node,
        "device": {
            "name": device_name,
            "memory": int(memory_bytes),
            "peak_tflops": {precision: _round(value) for precision, value in peak_tflops.items()},
            "sustained_tflops": {precision: _round(value) for precision, value in sustained_tflops.items()},
        },
        "reserved_memory": int(reserved_memory_bytes),
        "links": links,
        "overlap_slowdown": _round(max(1.0, overlap_slowdown)),
        "provenance": "profiled",
        "sources": all_sources,
    }
    validate_as(ClusterSpec, mapping, f"profiled cluster {name!r}")
    return mapping


def cluster_yaml_text(mapping: Mapping[str, Any], timings: Sequence[CollectiveTiming],
                      overlap: OverlapMeasurement | None = None) -> str:
    """The YAML with a comment header listing every fit and the raw fast-quarter times behind it."""
    when = datetime.datetime.now().isoformat(timespec="seconds")
    lines = [f"# Profiled by `gbmw profile cluster` on {when} ({platform.node() or 'unknown host'}).",
             "# Fits t = a + bytes·b in the planner's convention (gbmw/comm.py); links use the all_reduce rows.",
             "# collective, ranks per group: latency µs per step, bus bandwidth GB/s; fast-quarter times per message size"]
    fastest: dict[tuple[str, int], list[str]] = {}
    for timing in timings:
        if timing.seconds is not None:
            fastest.setdefault((timing.collective, timing.group_size), []).append(
                f"{format_size(timing.message_bytes)} {timing.seconds * 1e3:.3g} ms")
    for fit in fit_timings(timings):
        if fit.bandwidth_gb_per_s is None:
            lines.append(f"#   {fit.collective}, {fit.group_size}: not measured ({fit.note})")
            continue
        lines.append(f"#   {fit.collective}, {fit.group_size}: {fit.latency_us:.4g} µs, {fit.bandwidth_gb_per_s:.4g} GB/s"
                     + (f" [{fit.note}]" if fit.note else ""))
        lines.append(f"#     {'; '.join(fastest[(fit.collective, fit.group_size)])}")
    if overlap is not None:
        lines.append(f"# overlap: compute {overlap.compute_alone_s * 1e3:.4g} ms alone, "
                     f"{overlap.compute_overlapped_s * 1e3:.4g} ms overlapped; all_reduce "
                     f"{overlap.communication_alone_s * 1e3:.4g} ms alone, "
                     f"{overlap.communication_overlapped_s * 1e3:.4g} ms overlapped → {overlap.slowdown:.3f}")
    body = yaml.safe_dump(dict(mapping), sort_keys=False, allow_unicode=True, width=100)
    return "\n".join(lines) + "\n" + body


# ----------------------------------------------------------------------------------------------
# Measurement (torch.distributed initialised on every rank)
# ----------------------------------------------------------------------------------------------


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


def _matmul_inputs(ranks: _Ranks, dim: int, dtype: Any):
    import torch

    generator = torch.Generator(device="cpu").manual_seed(ranks.rank)
    return [torch.randn(dim, dim, generator=generator, dtype=torch.float32).to(ranks.device, dtype) for _ in range(2)]


def default_matmul_dim(ranks: _Ranks) -> int:
    return 4096 if ranks.is_cuda else 256


def measure_matmul_tflops(precision: str = "fp32", dim: int | None = None, repeats: int = 5,
                          seconds_per_repeat: float = 0.05) -> float:
    """TFLOP/s of a square matmul on every rank at once; the slowest rank's, fast-quarter mean (fp32 without TF32)."""
    import torch

    ranks = _ranks()
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    dim = dim or default_matmul_dim(ranks)
    left, right = _matmul_inputs(ranks, dim, dtype)
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        single = _timed(ranks, lambda: left @ right, 3)
        count = int(max(1, _slowest(ranks, [math.ceil(seconds_per_repeat / max(single, 1e-9))])[0]))
        seconds = _timed(ranks, _repeated(lambda: left @ right, count), repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    return 2 * dim**3 * count / seconds / 1e12


def measure_overlap_slowdown(message_bytes: int, matmul_dim: int | None = None, phase_seconds: float = 0.2,
                             repeats: int = 3) -> OverlapMeasurement:
    """A matmul loop and an all-reduce loop over all ranks of about equal length: alone, then at once.

    The all-reduces run in a second thread (on a side CUDA stream under NCCL) while this thread
    multiplies; each side's time ends when its own work is done. The loop lengths are agreed across
    ranks (slowest rank's single-step times) so every rank issues the same collectives.
    """
    import torch
    import torch.distributed as dist

    ranks = _ranks()
    if message_bytes < ELEMENT_BYTES or message_bytes % ELEMENT_BYTES:
        raise SpecError(f"overlap message_bytes {message_bytes}: must be a positive multiple of {ELEMENT_BYTES}")
    dim = matmul_dim or default_matmul_dim(ranks)
    left, right = _matmul_inputs(ranks, dim, torch.float32)
    message = torch.ones(message_bytes // ELEMENT_BYTES, device=ranks.device)
    one_reduce = _timed(ranks, _repeated(lambda: dist.all_reduce(message), 4), 3) / 4
    one_matmul = _timed(ranks, _repeated(lambda: left @ right, 8), 3) / 8
    all_reduces = max(1, math.ceil(phase_seconds / one_reduce))
    matmuls = max(1, round(all_reduces * one_reduce / one_matmul))

    def compute() -> float:
        start = time.perf_counter()
        for _ in range(matmuls):
            left @ right
        if ranks.is_cuda:
            torch.cuda.current_stream(ranks.device).synchronize()
        return time.perf_counter() - start

    def communicate(start: float) -> float:
        for _ in range(all_reduces):
            dist.all_reduce(message)
        if ranks.is_cuda:
            torch.cuda.current_stream(ranks.device).synchronize()
        return time.perf_counter() - start

    def overlapped() -> tuple[float, float]:
        result: dict[str, Any] = {}

        def side(start: float) -> None:
            try:
                if ranks.is_cuda:
                    torch.cuda.set_device(ranks.device)  # the current device is per thread
                    with torch.cuda.stream(torch.cuda.Stream(ranks.device)):
                        result["seconds"] = communicate(start)
                else:
                    result["seconds"] = communicate(start)
            except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
                result["error"] = error

        _barrier(ranks)
        start = time.perf_counter()
        thread = threading.Thread(target=side, args=(start,), name="gbmw-overlap-all-reduce")
        thread.start()
        compute_seconds = compute()
        thread.join()
        if "error" in result:
            raise result["error"]
        return compute_seconds, result["seconds"]

    samples = []
    for _ in range(repeats):
        _barrier(ranks)
        compute_alone = compute()
        _barrier(ranks)
        communication_alone = communicate(time.perf_counter())
        compute_together, communication_together = overlapped()
        samples.append(_slowest(ranks, [compute_alone, communication_alone, compute_together, communication_together]))
    fastest = [fast_mean_s(column) for column in zip(*samples)]
    return OverlapMeasurement(*fastest, matmul_dim=dim, message_bytes=message_bytes, matmuls=matmuls,
                              all_reduces=all_reduces)


def _local_world_size(world_size: int) -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or world_size)


def device_description(ranks: _Ranks, local_world_size: int) -> tuple[str, int, int, str]:
    """(device name, memory bytes per process, reserved bytes, source) of this rank's device."""
    import torch

    if ranks.is_cuda:
        properties = torch.cuda.get_device_properties(ranks.device)
        free, total = torch.cuda.mem_get_info(ranks.device)
        reserved = max(0, total - free - torch.cuda.memory_reserved(ranks.device))
        source = (f"measured: device memory {properties.total_memory} bytes (torch.cuda.get_device_properties); "
                  f"reserved_memory = memory in use outside PyTorch's allocator after profiling ({reserved} bytes: "
                  "CUDA context and the NCCL communicators profiling created; a plan's runtime creates more)")
        return properties.name, int(properties.total_memory), int(reserved), source
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    model = ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    threads = torch.get_num_threads()
    name = f"CPU process ({threads} thread{'s' if threads != 1 else ''}, {model})"
    return (name, physical // local_world_size, 0,
            f"measured: memory = physical memory {physical} bytes (sysconf) / {local_world_size} processes per node")


def profile_cluster(output_path: str | Path, name: str | None = None,
                    link_levels: Sequence[tuple[str, int]] | None = None,
                    sizes_bytes: Sequence[int] | None = None, repeats: int = DEFAULT_REPEATS,
                    collectives: Sequence[str] = COLLECTIVES, overlap_message_bytes: int | None = None,
                    overlap_seconds: float = 0.2, sustained_fraction: float = DEFAULT_SUSTAINED_FRACTION,
                    peak_tflops: Mapping[str, float] | None = None,
                    sustained_tflops: Mapping[str, float] | None = None, extra_sources: Sequence[str] = (),
                    verbose: bool = True) -> Path:
    """Measure the launched processes and write a cluster YAML (rank 0); returns the path on every rank.

    `link_levels`: [(name, island devices)], innermost first, the last spanning all processes (default:
    `intra_node` per machine, `inter_node` across machines, from LOCAL_WORLD_SIZE). `sizes_bytes`:
    message sizes (default 4 KiB–16 MiB on CPU, 8 KiB–256 MiB on CUDA). `peak_tflops` /
    `sustained_tflops` ({precision: TFLOP/s}) replace the measured matmul rate (fp32; on CUDA also
    fp16 and bf16) and peak × `sustained_fraction`; `extra_sources` cite figures given that way (each starting
    with "measured: " or holding an http address). Refuses an existing `output_path`.
    """
    from rich.console import Console

    from gbmw.files import write_new_file

    ranks = _ranks()
    output_path = Path(output_path)
    name = name or output_path.stem
    local_world_size = _local_world_size(ranks.world_size)
    levels = check_link_levels(link_levels or default_link_levels(ranks.world_size, local_world_size), ranks.world_size)
    collectives = check_collectives(collectives)
    if "all_reduce" not in collectives:
        raise SpecError(f"collectives {list(collectives)}: all_reduce is needed (link levels come from its fits)")
    if sizes_bytes is None:
        sizes_bytes = DEFAULT_SIZES_BYTES_CUDA if ranks.is_cuda else DEFAULT_SIZES_BYTES_CPU
    sizes = check_sizes(sizes_bytes, ranks.world_size)
    if not 0 < sustained_fraction <= 1:
        raise SpecError(f"sustained_fraction {sustained_fraction}: must be in (0, 1], e.g. 0.5")
    exists = _slowest(ranks, [1.0 if ranks.rank == 0 and output_path.exists() else 0.0])[0]
    if exists:
        raise GbmwError(f"{output_path} exists; gbmw does not overwrite files — choose a new name or remove it first")

    progress_console = Console(stderr=True, highlight=False)

    def say(text: str) -> None:
        if verbose and ranks.rank == 0:
            progress_console.print(f"[dim]profile cluster:[/dim] {text}")

    say(f"{ranks.world_size} processes, {ranks.device.type}; link levels "
        + ", ".join(f"{level} ({devices})" for level, devices in levels))
    timings = measure_collectives(sizes, repeats, power_of_two_group_sizes(ranks.world_size), collectives, say)
    overlap_message_bytes = overlap_message_bytes or sizes[-1]
    say(f"overlap: matmuls beside all_reduce of {format_size(overlap_message_bytes)} over all ranks")
    overlap = measure_overlap_slowdown(overlap_message_bytes, phase_seconds=overlap_seconds)
    sources = [(
        f"measured: overlap_slowdown {overlap.slowdown:.3f}: {overlap.matmuls} fp32 matmuls {overlap.matmul_dim}² and "
        f"{overlap.all_reduces} all_reduce of {format_size(overlap.message_bytes)} over all {ranks.world_size} ranks, "
        f"alone {overlap.compute_alone_s * 1e3:.4g} / {overlap.communication_alone_s * 1e3:.4g} ms, at once "
        f"{overlap.compute_overlapped_s * 1e3:.4g} / {overlap.communication_overlapped_s * 1e3:.4g} ms; "
        "f solves max(c, g) + (f − 1)·min(c, g) = the overlapped wall time (gbmw/layer_cost.py)")]
    if peak_tflops is None:
        precisions = ["fp32"] + (["fp16", "bf16"] if ranks.is_cuda and _supports_bf16() else [])
        say(f"matmul rate: {', '.join(precisions)}")
        peak_tflops = {precision: measure_matmul_tflops(precision) for precision in precisions}
        dim = default_matmul_dim(ranks)
        sources.append(f"measured: peak_tflops = torch.matmul {dim}×{dim} on all {ranks.world_size} processes at once, "
                       "slowest process: " + ", ".join(f"{p} {v * 1e3:.4g} GFLOP/s" for p, v in peak_tflops.items())
                       + " (fp32 without TF32)")
    if sustained_tflops is None:
        sustained_tflops = {precision: value * sustained_fraction for precision, value in peak_tflops.items()}
        sources.append(f"measured: sustained_tflops = peak × {sustained_fraction} — an assumed fraction for whole "
                       "Transformer layers, not a measurement; `gbmw profile model` measures layer times instead")
    device_name, memory_bytes, reserved_bytes, memory_source = device_description(ranks, local_world_size)
    memory_bytes = int(_slowest(ranks, [-memory_bytes])[0] * -1)  # the smallest device
    reserved_bytes = int(_slowest(ranks, [reserved_bytes])[0])
    sources += [memory_source, *extra_sources]
    mapping = build_cluster_spec(name, timings, overlap.slowdown, levels, device_name, memory_bytes, peak_tflops,
                                 sustained_tflops, devices_per_node=min(local_world_size, ranks.world_size),
                                 reserved_memory_bytes=reserved_bytes, sources=sources)
    failure = ""
    if ranks.rank == 0:
        try:
            write_new_file(output_path, cluster_yaml_text(mapping, timings, overlap))
        except GbmwError as error:
            failure = str(error)
        else:
            if verbose:
                print_fits(fit_timings(timings), overlap, peak_tflops)
                Console(highlight=False).print(f"wrote {output_path}")
    if _slowest(ranks, [1.0 if failure else 0.0])[0]:
        raise GbmwError(failure or f"rank 0 could not write {output_path}")
    return output_path


def _supports_bf16() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def print_fits(fits: Sequence[LinkFit], overlap: OverlapMeasurement | None = None,
               peak_tflops: Mapping[str, float] | None = None) -> None:
    """The fits as a table: collective, ranks per group, latency per step, bus bandwidth, notes."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Interconnect fits (t = a + bytes·b; planner convention)")
    for column, justify in (("collective", "left"), ("ranks", "right"), ("latency µs/step", "right"),
                            ("bus GB/s", "right"), ("note", "left")):
        table.add_column(column, justify=justify)
    for fit in fits:
        if fit.bandwidth_gb_per_s is None:
            table.add_row(fit.collective, str(fit.group_size), "—", "—", fit.note)
        else:
            table.add_row(fit.collective, str(fit.group_size), f"{fit.latency_us:.1f}",
                          f"{fit.bandwidth_gb_per_s:.3f}", fit.note)
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=120)
    console.print(table)
    if overlap is not None:
        console.print(f"overlap slowdown {overlap.slowdown:.3f} (compute {overlap.compute_alone_s * 1e3:.1f} → "
                      f"{overlap.compute_overlapped_s * 1e3:.1f} ms, all_reduce {overlap.communication_alone_s * 1e3:.1f}"
                      f" → {overlap.communication_overlapped_s * 1e3:.1f} ms)")
    if peak_tflops:
        console.print("matmul: " + ", ".join(f"{p} {v * 1e3:.1f} GFLOP/s" for p, v in peak_tflops.items()))
