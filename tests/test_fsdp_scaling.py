"""benchmarks/fsdp_scaling.py keeps running: torchtitan's measured row and gbmw's four rows, each rate finite, the
clusters one node and sixteen, and the forward all-gathers it names growing from one node to sixteen (the inter-node
links are slower than NVLink). The benchmark prints the comparison; nothing here asserts its outcome."""

from __future__ import annotations

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import fsdp_scaling as benchmark  # noqa: E402

pytestmark = pytest.mark.unit


def test_every_row_is_costed_and_the_gathers_grow_across_nodes(capsys):
    assert benchmark.main() == 0
    out = capsys.readouterr().out
    assert "5,762" in out and "5,605" in out
    jobs = {devices: benchmark.job_for(devices) for devices in (8, 128)}
    assert jobs[8].cluster.nodes == 1 and jobs[128].cluster.nodes == 16
    for target in benchmark.TARGETS:
        assert benchmark.forward_gathers_s(jobs[128], target) > benchmark.forward_gathers_s(jobs[8], target) > 0
        for ckpt in benchmark.RECOMPUTATION:
            rates = [benchmark.tokens_per_s_per_gpu(jobs[devices], target, ckpt) for devices in (8, 128)]
            assert all(math.isfinite(rate) and rate > 0 for rate in rates), (target, ckpt)
