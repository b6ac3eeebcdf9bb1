"""The cluster YAML of `gbmw profile cluster` from its measurements (pure: no torch), and the fits as a table.

Each link level takes the all-reduce fit (link_fit.py) of the group size equal to its island; the device
figures (matmul rate, memory) come with sources that say how they were obtained. The file starts with a
comment header listing every fit and the raw fast-quarter times behind it. The mapping is validated as a
ClusterSpec before it is written.
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from gbmw.errors import SpecError

from .link_fit import CollectiveTiming, LinkFit, check_link_levels, fit_timings
from .overlap import OverlapMeasurement


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
                       memory_bandwidth_gb_per_s: float, devices_per_node: int | None = None, reserved_memory_bytes: int = 0,
                       sources: Sequence[str] = ()) -> dict[str, Any]:
    """The cluster YAML mapping (validated as a ClusterSpec) from measured timings.

    Each link level takes the all-reduce fit of the group size equal to its island. `peak_tflops` and
    `sustained_tflops` map precisions (`fp32`, `bf16`, …) to TFLOP/s; `sources` describe how the device
    figures were obtained and must start with "measured: " or cite an http address.
    """
    from gbmw.specs.cluster_spec import ClusterSpec
    from gbmw.specs.schema import validate_as

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
            "memory_bandwidth_gb_per_s": _round(memory_bandwidth_gb_per_s),
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
             "# Fits t = a + bytes·b in the planner's convention (gbmw/cost/comm.py); links use the all_reduce rows.",
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
