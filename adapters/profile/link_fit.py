"""The arithmetic of `gbmw profile cluster` (pure: no torch): link fits from collective timings, and the
checks of its options (collectives, message sizes, world size, link levels).

Fit (`fit_link`): t = a + b·M by least squares on relative residuals, Σ((a + b·M_i − t_i)/t_i)², so the
small messages set the latency and the large ones the bandwidth (a plain fit lets the noise of a 16 MiB
message swamp a 50 µs intercept). Converted to the planner's ring formulas (Thakur et al., 2005; bus
bandwidth as nccl-tests define it):
  all-reduce      t = 2(n−1)/n · M/B + 2(n−1)·α  →  B = 2(n−1)/n / b,  α = a / (2(n−1))
  all-gather      t = (n−1)/n · M/B + (n−1)·α    →  B = (n−1)/n / b,   α = a / (n−1)   (M gathered)
  reduce-scatter  as all-gather                                                    (M before scattering)
  p2p             t = M/B + α                     →  B = 1 / b,         α = a
The timings come from collective_timing.py; groups are 2, 4, … consecutive ranks up to the world size,
so world sizes, group sizes and link levels' islands are powers of two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gbmw.errors import GbmwError, SpecError

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "p2p")
ELEMENT_BYTES = 4
"""Messages are fp32 tensors."""
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
    """Mean of the fastest quarter of repetitions of the slowest rank's time (collective_timing._timed); None when
    the backend lacks the collective."""
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
    """Latency and bus bandwidth from the fast-quarter times per message size (see the module docstring)."""
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
