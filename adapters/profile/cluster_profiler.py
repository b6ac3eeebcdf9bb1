"""`gbmw profile cluster`: measure the interconnect among the launched processes and write a cluster YAML.

Every rank runs the same measurements (torch.distributed already initialised: NCCL tensors on the
rank's CUDA device, gloo tensors on the CPU); rank 0 writes the file and prints the fits.

1. Collectives over groups of 2, 4, … consecutive ranks at several message sizes (collective_timing.py).
2. Fit of latency and bus bandwidth per collective and group size, in the planner's convention (link_fit.py).
3. Overlap slowdown of matmuls beside all-reduces (overlap.py).
4. Device: the matmul rate on every rank at once (the slowest rank's) as the peak and, × `sustained_fraction`
   (default 1.0), as the matmul rate the estimator uses; the STREAM-copy memory bandwidth (overlap.py).
   Memory: the CUDA device's total, or the machine's physical memory divided among the processes on it.
The YAML is built and written by cluster_yaml.py.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path

from gbmw.errors import GbmwError, SpecError

from .cluster_yaml import build_cluster_spec, cluster_yaml_text, format_size, print_fits
from .collective_timing import DEFAULT_REPEATS, _Ranks, _ranks, _slowest, measure_collectives
from .link_fit import (COLLECTIVES, check_collectives, check_link_levels, check_sizes, default_link_levels, fit_timings,
                       power_of_two_group_sizes)
from .overlap import (default_matmul_dim, measure_matmul_tflops, measure_memory_bandwidth_gb_per_s,
                      measure_overlap_slowdown)

DEFAULT_SIZES_BYTES_CPU: tuple[int, ...] = (2**12, 2**16, 2**20, 2**22, 2**24)
"""4 KiB … 16 MiB: gloo moves ~1 GB/s, so the largest takes ~20 ms."""
DEFAULT_SIZES_BYTES_CUDA: tuple[int, ...] = (2**13, 2**17, 2**21, 2**25, 2**28)
"""8 KiB … 256 MiB: NCCL reaches its bus bandwidth only with messages of hundreds of MiB."""
DEFAULT_SUSTAINED_FRACTION = 1.0


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

    from gbmw.specs.files import write_new_file

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
        "f solves max(c, g) + (f − 1)·min(c, g) = the overlapped wall time (gbmw/cost/layer_cost.py)")]
    if peak_tflops is None:
        precisions = (["fp32"] + (["tf32"] if ranks.is_cuda and _supports_tf32() else [])
                      + (["fp16", "bf16"] if ranks.is_cuda and _supports_bf16() else []))
        say(f"matmul rate: {', '.join(precisions)}")
        peak_tflops = {precision: measure_matmul_tflops(precision) for precision in precisions}
        dim = default_matmul_dim(ranks)
        sources.append(f"measured: peak_tflops = torch.matmul {dim}×{dim} on all {ranks.world_size} processes at once, "
                       "slowest process: " + ", ".join(f"{p} {v * 1e3:.4g} GFLOP/s" for p, v in peak_tflops.items())
                       + " (fp32 without TF32, tf32 with it)")
    if sustained_tflops is None:
        sustained_tflops = {precision: value * sustained_fraction for precision, value in peak_tflops.items()}
        sources.append(f"measured: sustained_tflops = the measured matmul rate × {sustained_fraction} (the estimator "
                       "adds memory-bound kernels at memory_bandwidth_gb_per_s; `gbmw profile model` measures layers)")
    say("memory bandwidth: STREAM copy")
    memory_bandwidth = measure_memory_bandwidth_gb_per_s()
    sources.append(f"measured: memory_bandwidth_gb_per_s = STREAM copy (bytes read + written) on all "
                   f"{ranks.world_size} processes at once, slowest process: {memory_bandwidth:.4g} GB/s")
    device_name, memory_bytes, reserved_bytes, memory_source = device_description(ranks, local_world_size)
    memory_bytes = int(_slowest(ranks, [-memory_bytes])[0] * -1)  # the smallest device
    reserved_bytes = int(_slowest(ranks, [reserved_bytes])[0])
    sources += [memory_source, *extra_sources]
    mapping = build_cluster_spec(name, timings, overlap.slowdown, levels, device_name, memory_bytes, peak_tflops,
                                 sustained_tflops, memory_bandwidth, devices_per_node=min(local_world_size, ranks.world_size),
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


def _supports_tf32() -> bool:
    """TF32 tensor cores: compute capability 8.0 (Ampere) and later."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8)


def _supports_bf16() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
