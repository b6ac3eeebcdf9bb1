"""`gbmw profile cluster`: the fit arithmetic on synthetic timings, option checks, and a real 2-process profile."""

import pytest
from dist_fixture import run_distributed

from gbmw.adapters.profile.cluster_profiler import profile_cluster  # imports torch only when it measures
from gbmw.adapters.profile.cluster_yaml import build_cluster_spec, cluster_yaml_text
from gbmw.adapters.profile.link_fit import (CollectiveTiming, check_collectives, check_link_levels, check_sizes,
                                            default_link_levels, fit_link, fit_timings, parse_link_levels)
from gbmw.adapters.profile.overlap import OverlapMeasurement
from gbmw.errors import GbmwError, SpecError
from gbmw.specs.cluster_spec import load_cluster

SIZES = (2**12, 2**16, 2**20, 2**24)


def synthetic(collective, group_size, latency_s, seconds_per_byte, sizes=SIZES):
    return [CollectiveTiming(collective, group_size, size, latency_s + size * seconds_per_byte, 3) for size in sizes]


# ---------------------------------------------------------------------------------------------- fits


def test_all_reduce_of_two_ranks_by_hand():
    # t = 10 µs + bytes / (1 GB/s). Ring all-reduce of n = 2: 2(n-1)/n = 1 byte per byte over the bus,
    # 2(n-1) = 2 latency steps → bus bandwidth 1 GB/s, latency 5 µs per step.
    fit = fit_link("all_reduce", 2, SIZES, [10e-6 + size / 1e9 for size in SIZES])
    assert fit.bandwidth_gb_per_s == pytest.approx(1.0, rel=1e-9)
    assert fit.latency_us == pytest.approx(5.0, rel=1e-9)
    assert fit.note == ""


@pytest.mark.parametrize("collective, group_size, bandwidth, latency", [
    ("all_reduce", 4, 2 * 3 / 4, 10 / 6),   # 2(n-1)/n, a / 2(n-1)
    ("all_gather", 4, 3 / 4, 10 / 3),       # (n-1)/n, a / (n-1)
    ("reduce_scatter", 8, 7 / 8, 10 / 7),
    ("p2p", 2, 1.0, 10.0),                  # bytes / t, a
])
def test_conversion_to_the_planner_convention(collective, group_size, bandwidth, latency):
    fit = fit_link(collective, group_size, SIZES, [10e-6 + size / 1e9 for size in SIZES])
    assert fit.bandwidth_gb_per_s == pytest.approx(bandwidth, rel=1e-9)
    assert fit.latency_us == pytest.approx(latency, rel=1e-9)


def test_relative_residuals_keep_the_latency_of_noisy_large_messages():
    # +5 % noise on the 16 MiB message: a plain least-squares intercept drops from 50 to 32 µs;
    # on relative residuals the latency stays within 1 µs of the true 50 µs.
    times = [50e-6 + size / 1e9 for size in SIZES]
    times[-1] *= 1.05
    fit = fit_link("p2p", 2, SIZES, times)
    assert fit.latency_us == pytest.approx(50.0, abs=1.0)
    assert 1 / 1.05 <= fit.bandwidth_gb_per_s < 1.0


def test_negative_intercept_is_clamped_and_said():
    fit = fit_link("all_reduce", 2, (1000, 2000), (0.5e-6, 1.5e-6))  # a = -0.5 µs, b = 1 ns/byte
    assert fit.latency_us == 0.0
    assert fit.bandwidth_gb_per_s > 0
    assert "negative intercept" in fit.note and "clamped to 0" in fit.note


def test_time_not_growing_with_size_is_said():
    fit = fit_link("all_reduce", 2, (1000, 2000), (3e-6, 2e-6))
    assert fit.latency_us == 0.0
    assert fit.bandwidth_gb_per_s == pytest.approx(2000 / 2e-6 / 1e9)
    assert "does not grow" in fit.note


def test_unmeasured_collective_is_kept_with_its_reason():
    timings = synthetic("all_reduce", 2, 1e-5, 1e-9) + [
        CollectiveTiming("reduce_scatter", 2, size, None, 3, note="the backend lacks it (x)") for size in SIZES]
    fits = {fit.collective: fit for fit in fit_timings(timings)}
    assert fits["reduce_scatter"].bandwidth_gb_per_s is None and "lacks" in fits["reduce_scatter"].note
    assert fits["all_reduce"].bandwidth_gb_per_s == pytest.approx(1.0)


def test_overlap_slowdown_matches_the_estimator():
    # compute 100 ms and communication 80 ms alone, 150 ms wall overlapped:
    # max(c, g) + (f - 1) min(c, g) = 100 + (f - 1) 80 = 150  →  f = 1.625
    overlap = OverlapMeasurement(0.100, 0.080, 0.120, 0.150, 256, 2**20, 10, 10)
    assert overlap.slowdown == pytest.approx(1.625)
    assert OverlapMeasurement(0.1, 0.1, 0.09, 0.09, 256, 2**20, 1, 1).slowdown == 1.0  # clamped


# ---------------------------------------------------------------------------------------------- the YAML


def test_levels_take_the_all_reduce_fit_of_their_island(tmp_path):
    timings = (synthetic("all_reduce", 2, 20e-6, 1 / 10e9) + synthetic("all_reduce", 4, 60e-6, 1 / 2e9)
               + synthetic("p2p", 4, 5e-6, 1 / 3e9))
    overlap = OverlapMeasurement(0.1, 0.1, 0.12, 0.12, 256, 2**20, 10, 10)
    mapping = build_cluster_spec(
        "two-levels", timings, overlap.slowdown, [("pair", 2), ("quad", 4)], "test device", 2**30,
        {"fp32": 1.0}, {"fp32": 0.5}, 20.0, devices_per_node=2, sources=["measured: synthetic device figures"])
    path = tmp_path / "two-levels.yaml"
    path.write_text(cluster_yaml_text(mapping, timings, overlap))
    cluster = load_cluster(path)
    assert (cluster.nodes, cluster.devices_per_node, cluster.provenance) == (2, 2, "profiled")
    pair, quad = cluster.links
    # n = 2: bus factor 1, 2 steps; n = 4: bus factor 1.5, 6 steps
    assert (pair.name, pair.devices, pair.bandwidth_gb_per_s, pair.latency_us) == ("pair", 2, 10.0, 10.0)
    assert (quad.name, quad.devices, quad.bandwidth_gb_per_s, quad.latency_us) == ("quad", 4, 3.0, 10.0)
    assert cluster.overlap_slowdown == pytest.approx(1.2)
    assert cluster.device.memory_bandwidth_gb_per_s == 20.0
    assert all(source.startswith("measured: ") for source in cluster.sources)
    assert "#   p2p, 4: 5 µs, 3 GB/s" in path.read_text()


def test_a_level_without_its_all_reduce_is_refused():
    with pytest.raises(SpecError, match=r"link level \('quad', 4\) needs all_reduce timings over groups of 4; "
                                        r"measured all_reduce group sizes: \[2\]"):
        build_cluster_spec("x", synthetic("all_reduce", 2, 1e-5, 1e-9), 1.3, [("pair", 2), ("quad", 4)], "d",
                           2**30, {"fp32": 1.0}, {"fp32": 0.5}, 20.0)


def test_uncited_sources_are_refused():
    with pytest.raises(SpecError, match="must start with 'measured: '"):
        build_cluster_spec("x", synthetic("all_reduce", 2, 1e-5, 1e-9), 1.3, [("pair", 2)], "d", 2**30,
                           {"fp32": 1.0}, {"fp32": 0.5}, 20.0, sources=["a guess"])


# ---------------------------------------------------------------------------------------------- options


@pytest.mark.parametrize("levels, message", [
    ([], "link_levels is empty"),
    ([("a", 3), ("b", 4)], r"link_levels\[0\] \('a', 3\): island size 3 is not a power of two ≥ 2; use one of \[2, 4\]"),
    ([("a", 1), ("b", 4)], r"island size 1 is not a power of two ≥ 2"),
    ([("a", 8)], r"island size 8 does not divide the world size 4"),
    ([("a", 4), ("b", 2)], r"link_levels\[1\] \('b', 2\): island size 2 is not larger than the previous level's \(4\)"),
    ([("a", 2)], r"the outermost level \('a', 2\) spans 2 devices but 4 processes were launched"),
    ([("a", 2, 3)], r"link_levels\[0\] \('a', 2, 3\): expected \(level name, island devices\)"),
    ([("", 4)], r"the level name must be a non-empty string"),
])
def test_bad_link_levels_are_named(levels, message):
    with pytest.raises(SpecError, match=message):
        check_link_levels(levels, 4)


def test_good_link_levels_and_their_text_form():
    assert check_link_levels(parse_link_levels("nvlink=2, node=4"), 4) == (("nvlink", 2), ("node", 4))
    assert default_link_levels(8, 8) == (("intra_node", 8),)
    assert default_link_levels(16, 8) == (("intra_node", 8), ("inter_node", 16))
    with pytest.raises(SpecError, match="--links 'nvlink:2': 'nvlink:2' is not NAME=DEVICES"):
        parse_link_levels("nvlink:2")
    with pytest.raises(SpecError, match="3 processes per node of 12"):
        default_link_levels(12, 3)


def test_bad_sizes_and_collectives_are_named():
    with pytest.raises(SpecError, match=r"\[1000\] are not positive multiples of 16 bytes"):
        check_sizes([4096, 1000], 4)
    with pytest.raises(SpecError, match="at least two message sizes"):
        check_sizes([4096, 4096], 2)
    with pytest.raises(SpecError, match=r"unknown \['allreduce'\]; choose from all_reduce, all_gather"):
        check_collectives(["allreduce"])


@pytest.mark.torch
def test_without_torch_distributed_the_error_says_how_to_launch(tmp_path):
    import torch.distributed as dist

    assert not dist.is_initialized()
    with pytest.raises(GbmwError, match="at least 2 processes; launch with torchrun --nproc_per_node 2 -m gbmw"):
        profile_cluster(tmp_path / "cluster.yaml")


# ---------------------------------------------------------------------------------------------- processes

SMALL = {"sizes_bytes": (2**12, 2**16, 2**18), "repeats": 2, "overlap_message_bytes": 2**16,
         "overlap_seconds": 0.03, "verbose": False}


@pytest.mark.torch
def test_one_process_is_refused(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no rendezvous, no port
    try:
        with pytest.raises(GbmwError, match="needs at least 2 processes, got world size 1; launch with torchrun"):
            profile_cluster(tmp_path / "cluster.yaml", **SMALL)
    finally:
        dist.destroy_process_group()
    assert not (tmp_path / "cluster.yaml").exists()


def _profile_two(rank, world_size, path):
    with pytest.raises(SpecError, match=r"island size 4 does not divide the world size 2"):
        profile_cluster(path, link_levels=[("intra_node", 4)], **SMALL)
    assert profile_cluster(path, name="cpu-x2-test", **SMALL).name == "cpu-x2-test.yaml"
    with pytest.raises(GbmwError, match="exists; gbmw does not overwrite files"):  # on every rank alike
        profile_cluster(path, **SMALL)


@pytest.mark.dist
def test_two_processes_write_a_cluster_the_planner_loads(tmp_path):
    path = tmp_path / "cpu-x2-test.yaml"
    run_distributed(2, _profile_two, str(path), timeout_s=60)
    cluster = load_cluster(path)
    assert (cluster.name, cluster.nodes, cluster.devices_per_node, cluster.provenance) == ("cpu-x2-test", 1, 2, "profiled")
    (link,) = cluster.links
    assert (link.name, link.devices) == ("intra_node", 2)
    assert link.bandwidth_gb_per_s > 0 and link.latency_us >= 0
    assert cluster.overlap_slowdown >= 1.0
    assert 0 < cluster.device.sustained_tflops.fp32 <= cluster.device.peak_tflops.fp32
    assert int(cluster.device.memory) > 0
    assert all(source.startswith("measured: ") for source in cluster.sources)
    text = path.read_text()
    for collective in ("all_reduce", "all_gather", "reduce_scatter", "p2p"):
        assert f"#   {collective}, 2: " in text
