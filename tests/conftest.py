"""Test tiers, and shared fixtures: a small cluster and hand-made layers whose costs are easy to compute by hand.

Tiers, selected by markers (`pytest -m unit`, `-m "torch or dist"`, …):
  unit   the planner: no torch (any test without another tier marker; `--without-torch` makes importing torch,
         DeepSpeed or megatron-core an error, which is how `make test` runs this tier)
  torch  one process using torch, DeepSpeed or megatron-core (their own config validation, the runtime's modules)
  dist   several processes spawned with torch.distributed (gloo on CPU; tests/dist_fixture.py)
  gpu    needs a CUDA device (skipped without one)
"""

from __future__ import annotations

import sys

import pytest

from gbmw.specs.cluster_spec import ClusterSpec
from gbmw.specs.jobs import JobSpec
from gbmw.specs.model_spec import LayerSpec, LayerTimings, ModelSpec

RUNTIME_LIBRARIES = ("torch", "deepspeed", "megatron")
NON_UNIT_TIERS = ("torch", "dist", "gpu")


def pytest_addoption(parser):
    parser.addoption("--without-torch", action="store_true",
                     help="make importing torch, deepspeed or megatron an ImportError (run the unit tier with it)")


def pytest_configure(config):
    if config.getoption("--without-torch"):
        for name in RUNTIME_LIBRARIES:
            sys.modules[name] = None  # `import torch` now raises ImportError; importorskip skips


def pytest_collection_modifyitems(config, items):
    """Every test without a tier marker is a unit test, and so may not live in a module that imports torch."""
    misplaced = []
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in NON_UNIT_TIERS):
            item.add_marker(pytest.mark.unit)
            if any(name in vars(item.module) for name in RUNTIME_LIBRARIES):
                misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError(f"unit tests in modules that import torch (mark them torch, dist or gpu, or import "
                                f"torch inside the tests that need it): {', '.join(misplaced)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under --without-torch, a unit test that skips because torch, DeepSpeed or megatron-core cannot be imported
    fails instead: it belongs to another tier, and `make test` would otherwise run it in neither session."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.config.getoption("--without-torch") and item.get_closest_marker("unit"):
        reason = str(report.longrepr)
        if any(f"import '{name}" in reason for name in RUNTIME_LIBRARIES):
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid} is a unit test but needs a runtime library ({reason}); mark it torch"


def make_cluster(nodes: int = 1, devices_per_node: int = 8, intra_gb_per_s: float = 100.0,
                 inter_gb_per_s: float = 10.0, latency_us: float = 0.0, overlap: float = 1.3,
                 memory_gb_per_s: float = 1000.0) -> ClusterSpec:
    links = [{"name": "intra_node", "devices": devices_per_node, "bandwidth_gb_per_s": intra_gb_per_s,
              "latency_us": latency_us}]
    if nodes > 1:
        links.append({"name": "inter_node", "devices": nodes * devices_per_node,
                      "bandwidth_gb_per_s": inter_gb_per_s, "latency_us": latency_us})
    return ClusterSpec.model_validate({
        "name": "test-cluster",
        "nodes": nodes,
        "devices_per_node": devices_per_node,
        "device": {"name": "test-device", "memory": "16GiB",
                   "peak_tflops": {"fp32": 2.0, "bf16": 4.0}, "sustained_tflops": {"fp32": 1.0, "bf16": 2.0},
                   "memory_bandwidth_gb_per_s": memory_gb_per_s},
        "links": links,
        "overlap_slowdown": overlap,
    })


def make_layer(name: str = "block", **overrides) -> LayerSpec:
    fields = dict(
        name=name, kind="encoder", parameter_count=1000, tp_split_parameter_count=800,
        forward_flops_per_sample=1e6, boundary_activation_bytes_per_sample=100.0,
        intermediate_activation_bytes_per_sample=50.0, intermediate_tp_split_activation_bytes_per_sample=200.0,
        tp_allreduce_bytes_per_sample=100.0,
    )
    fields.update(overrides)
    return LayerSpec(**fields)


def with_timings(layer: LayerSpec, **fields) -> LayerSpec:
    """`layer` with measured timings (LayerTimings) set or changed, as a profile would give them; a field given
    None is unmeasured."""
    current = layer.timings.model_dump() if layer.timings is not None else {}
    return layer.model_copy(update={"timings": LayerTimings(**{**current, **fields})})


def make_model(layers: list[LayerSpec], precision: str = "fp32") -> ModelSpec:
    return ModelSpec(name="test-model", family="profiled", precision=precision, sequence_length=1,
                     hidden_size=1, layers=tuple(layers))


def make_job(model: ModelSpec, cluster: ClusterSpec, precision: str = "fp32", budget: int = 2**30) -> JobSpec:
    return JobSpec(name="test-job", model=model, cluster=cluster, precision=precision,
                   memory_budget_bytes=budget)


@pytest.fixture
def cluster8() -> ClusterSpec:
    return make_cluster()
