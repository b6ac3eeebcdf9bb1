"""CPU threads per runtime process (gbmw.adapters.runtime.cpu_threads): a container's cgroup CPU quota caps the
threads, not the host's CPU count `os.cpu_count()` reports (issue 30: a one-process CPU run 13× slower without
OMP_NUM_THREADS). The cgroup files are written into a temporary folder in each format the kernel writes them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gbmw.adapters.runtime.cpu_threads import cgroup_cpu_quota, threads_per_process, usable_cpus


def _cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("files, cpus", [
    ({"cpu.max": "200000 100000\n"}, 2),  # docker --cpus 2 (cgroup v2)
    ({"cpu.max": "150000 100000\n"}, 2),  # --cpus 1.5: a second CPU is partly usable, rounded up
    ({"cpu.max": "50000 100000\n"}, 1),  # half a CPU: one thread
    ({"cpu.max": "max 100000\n"}, None),  # no quota
    ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),  # cgroup v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1, no quota
    ({"cpu.max": "garbage\n"}, None),  # a format gbmw does not know: no cap rather than a wrong one
    ({}, None),  # no cgroup files (macOS, a bare process)
])
def test_cgroup_quota_in_each_format(tmp_path, files, cpus):
    assert cgroup_cpu_quota(_cgroup(tmp_path, files)) == cpus


def test_quota_caps_the_host_count(tmp_path):
    allowed = len(os.sched_getaffinity(0))
    assert usable_cpus(_cgroup(tmp_path, {"cpu.max": "100000 100000"})) == 1
    # A quota above the affinity mask does not raise the count: the mask is what the scheduler honours.
    assert usable_cpus(_cgroup(tmp_path, {"cpu.max": f"{(allowed + 7) * 100000} 100000"})) == allowed
    assert threads_per_process(4, _cgroup(tmp_path, {"cpu.max": "800000 100000"})) == min(allowed, 8) // 4 or 1
    assert threads_per_process(16, tmp_path) == 1  # never zero threads


@pytest.mark.torch
def test_one_process_run_takes_the_capped_count():
    """`init_distributed` with no launcher sets torch's threads to the usable CPUs (affinity and quota), and leaves a
    user's OMP_NUM_THREADS alone."""
    pytest.importorskip("torch")
    program = ("import torch; from gbmw.adapters.runtime.launch import init_distributed; init_distributed(); "
               "print(torch.get_num_threads())")
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    threads = subprocess.run([sys.executable, "-c", program], env=environment, capture_output=True, text=True,
                             check=True).stdout.split()[-1]
    assert int(threads) == usable_cpus()
    environment["OMP_NUM_THREADS"] = "1"
    threads = subprocess.run([sys.executable, "-c", program], env=environment, capture_output=True, text=True,
                             check=True).stdout.split()[-1]
    assert threads == "1"
