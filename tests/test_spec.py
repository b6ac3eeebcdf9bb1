"""Loading specs: every bundled recipe loads; every bad input is one SpecError naming file, field, value."""

import pytest

from gbmw.errors import SpecError
from gbmw.specs.bundled import RECIPES_DIR
from gbmw.specs.cluster_spec import load_cluster
from gbmw.specs.jobs import load_job
from gbmw.specs.schema import parse_bytes

JOBS = sorted(path.stem for path in (RECIPES_DIR / "jobs").glob("*.yaml"))
CLUSTERS = sorted((RECIPES_DIR / "clusters").glob("*.yaml"))


def test_required_recipes_exist():
    for job in ("gpt3-15b_a100-80g-x32", "gpt3-39b_a100-80g-x32", "gpt3-65b_a100-80g-x32", "bert-huge-32_rtx-titan-x8"):
        assert job in JOBS
    clusters = {path.stem for path in CLUSTERS}
    assert {"rtx-titan-x8", "rtx-titan-2x8", "a100-2x8", "a100-40g-x64", "a100-80g-x32", "h100-80g-x64"} <= clusters


@pytest.mark.parametrize("job", JOBS)
def test_every_bundled_job_loads_as_its_file_says(job):
    """The model, precision, batch and per-device budget are the job file's (read here as plain YAML): the budget is
    its `memory_budget`, else the device memory less the cluster's reserved memory."""
    import yaml

    raw = yaml.safe_load((RECIPES_DIR / "jobs" / f"{job}.yaml").read_text())
    cluster = yaml.safe_load((RECIPES_DIR / "clusters" / f"{raw['cluster']}.yaml").read_text())
    if "memory_budget" in raw:
        budget = parse_bytes(raw["memory_budget"], "job")
    else:
        budget = parse_bytes(cluster["device"]["memory"], "cluster") - parse_bytes(cluster.get("reserved_memory", 0), "cluster")
    spec = load_job(job)
    assert (spec.model.name, spec.precision, spec.model.precision) == (raw["model"], raw["precision"], raw["precision"])
    assert spec.global_batch == raw.get("global_batch") and spec.memory_budget_bytes == budget


@pytest.mark.parametrize("path", CLUSTERS, ids=lambda p: p.stem)
def test_every_cluster_cites_sources(path):
    cluster = load_cluster(path)
    assert cluster.name == path.stem
    # A public source, or a measurement on the machine the recipe describes (the test machine, cpu-x4).
    assert cluster.sources and all("http" in source or source.startswith("measured: ") for source in cluster.sources)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


CLUSTER = """
name: c
nodes: 1
devices_per_node: 8
device: {name: d, memory: 16GiB, peak_tflops: {fp32: 10}, sustained_tflops: {fp32: 5}, memory_bandwidth_gb_per_s: 100}
links: [{name: intra_node, devices: 8, bandwidth_gb_per_s: 10}]
"""


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: [unclosed", "not valid YAML at line 1"),
        ("- a\n- b\n", "expected a mapping"),
        (CLUSTER.replace("nodes: 1", "nodes: -1"), "field `nodes`: value -1 — must be at least 1"),
        (CLUSTER.replace("nodes: 1\n", ""), "field `nodes` is required"),
        (CLUSTER + "bandwith: 3\n", "unknown field `bandwith`"),
        (CLUSTER.replace("memory: 16GiB", "memory: lots"), "field `device.memory`: value 'lots'"),
        (CLUSTER.replace("sustained_tflops: {fp32: 5}", "sustained_tflops: {fp32: 50}"),
         "sustained_tflops.fp32 (50.0) exceeds peak_tflops.fp32 (10.0)"),
        (CLUSTER.replace("devices: 8,", "devices: 4,"), "outermost link level spans 4 devices but the cluster has"),
        (CLUSTER.replace(", memory_bandwidth_gb_per_s: 100", ""), "field `device.memory_bandwidth_gb_per_s` is required"),
    ],
)
def test_cluster_errors_name_the_field_and_value(tmp_path, text, message):
    path = write(tmp_path, "c.yaml", text)
    with pytest.raises(SpecError) as error:
        load_cluster(path)
    assert message in str(error.value)
    assert str(path) in str(error.value)


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_cluster(tmp_path / "absent.yaml")


def test_job_errors(tmp_path):
    write(tmp_path, "c.yaml", CLUSTER)
    write(tmp_path, "m.yaml", "name: m\nfamily: gpt\nnum_layers: 2\nhidden_size: 64\nnum_heads: 4\nseq_length: 8\nvocab_size: 10\n")
    good = "model: m.yaml\ncluster: c.yaml\nprecision: fp32\n"
    assert load_job(write(tmp_path, "j.yaml", good)).model.num_layers == 4
    cases = [
        (good.replace("fp32", "fp4"), "field `precision`: value 'fp4' — Input should be 'fp32', 'tf32', 'fp16', 'bf16' or 'fp8'"),
        (good.replace("fp32", "fp8"), "precision fp8: device d has no FP8 rate (device.peak_tflops.fp8 and "
                                      "sustained_tflops.fp8 are not given"),
        (good.replace("fp32", "bf16"), "has no bf16 FLOP/s; supported precisions: ['fp32']"),
        (good.replace("m.yaml", "nosuch"), "model 'nosuch': no such file or bundled recipe; bundled models: bert-huge-32"),
        (good + "global_batch: 0\n", "field `global_batch`: value 0"),
    ]
    for text, message in cases:
        with pytest.raises(SpecError) as error:
            load_job(write(tmp_path, "bad.yaml", text))
        assert message in str(error.value)
    with pytest.raises(SpecError, match="field `family`: value 'rnn'"):
        write(tmp_path, "m.yaml", "name: m\nfamily: rnn\n")
        load_job(write(tmp_path, "j2.yaml", good))
    write(tmp_path, "m.yaml", "name: m\nfamily: gpt\nnum_layers: 2\nhidden_size: 64\nnum_heads: 4\nseq_length: 8\n")
    with pytest.raises(SpecError, match="field `vocab_size` is required"):
        load_job(write(tmp_path, "j3.yaml", good))


def test_memory_sizes():
    assert parse_bytes("16GiB", "x") == 16 * 2**30
    assert parse_bytes("1.5 GB", "x") == 1_500_000_000
    with pytest.raises(SpecError, match="--memory: value 'sixteen' is not a memory size"):
        parse_bytes("sixteen", "--memory")
