"""How many CPU threads each of the runtime's processes gets when the user set no OMP_NUM_THREADS.

`os.cpu_count()` counts the host's logical CPUs, not the ones this process may use: in a container limited to a few
CPUs by a cgroup quota (`docker --cpus 2`, a Kubernetes CPU limit, a Slurm allocation) on a many-core host it
reports the whole host, and a process that starts one thread per reported CPU has most of them waiting for a time
slice — each OpenMP barrier of each matmul then waits for the slowest preempted thread (issue 30 measured a
one-process CPU run 13× slower without OMP_NUM_THREADS than with it). The CPUs a process can use are the fewest of
its affinity mask (`taskset`, Slurm's binding) and its cgroup's quota (cgroup v2 `cpu.max`, v1
`cpu.cfs_quota_us` / `cpu.cfs_period_us`), rounded up to whole CPUs.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT) -> int | None:
    """Whole CPUs the cgroup's quota allows (rounded up), or None when it sets none or cannot be read."""
    quota_and_period = _read_words(cgroup_root / "cpu.max")  # cgroup v2: "max 100000" or "200000 100000"
    if quota_and_period is None:
        quota, period = (_read_words(cgroup_root / "cpu" / name) for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        quota_and_period = quota + period if quota and period else None  # cgroup v1: quota -1 means none
    if quota_and_period is None or len(quota_and_period) != 2:
        return None
    try:
        quota_us, period_us = int(quota_and_period[0]), int(quota_and_period[1])
    except ValueError:  # "max", or text gbmw does not know: no quota it can use
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return max(1, math.ceil(quota_us / period_us))


def usable_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process can run on: its affinity mask, capped by its cgroup's CPU quota."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call (macOS): every CPU the OS reports
        allowed = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root)
    return max(1, min(allowed, quota) if quota is not None else allowed)


def threads_per_process(local_processes: int, cgroup_root: Path = CGROUP_ROOT) -> int:
    """OMP threads for each of `local_processes` processes on this machine: the usable CPUs split evenly (torchrun's
    OMP_NUM_THREADS=1 leaves most of them idle for the CPU runtime; the deepspeed launcher sets nothing, and N
    processes each starting one thread per CPU oversubscribe it — gloo's waits then spin against compute: 50× slower
    steps measured with 4 processes on 2 cores)."""
    return max(1, usable_cpus(cgroup_root) // max(1, local_processes))


def _read_words(path: Path) -> list[str] | None:
    try:
        return path.read_text().split()
    except OSError:
        return None
