"""Precision tf32: fp32 training with the matmuls on TF32 tensor cores (gbmw.specs.model_spec.PRECISIONS) — stored
exactly as fp32, only the matmuls faster; refused where a device has no TF32 rate or a stock framework's configuration
cannot turn it on; run by gbmw's runtime with torch's TF32 switch on for its steps only."""

from pathlib import Path

import pytest
import yaml

from gbmw.cost.estimate import estimate_plan
from gbmw.errors import GbmwError
from gbmw.plan import Plan
from gbmw.search.planner import Planner
from gbmw.specs.jobs import load_job

pytestmark = pytest.mark.unit


def _job(precision: str, cluster_job: str = "bert-huge-32_a100-2x8"):
    return load_job(cluster_job, memory_budget="16GiB").model_copy(update={"global_batch": 64, "precision": precision})


def test_tf32_keeps_fp32_memory_and_only_speeds_the_matmuls():
    """The same plan under fp32 and tf32: every stage's memory equal to the byte, the iteration faster, but by at most
    the matmul rates' ratio (if every second were a matmul; communication and memory-bound kernels keep their time).
    Catches tf32 stored as 16 bits (memory would halve) and tf32 speeding anything but the matmuls (the bound)."""
    plan = Planner(_job("tf32"), explain_failure=False).run()
    assert plan.precision == "tf32"
    tf32 = estimate_plan(_job("tf32"), plan)
    fp32 = estimate_plan(_job("fp32"), Plan.from_dict({**plan.to_dict(), "precision": "fp32"}))
    assert tf32.stage_peak_memory_bytes == fp32.stage_peak_memory_bytes
    assert tf32.stage_model_state_bytes == fp32.stage_model_state_bytes
    device = _job("fp32").cluster.device.sustained_tflops
    assert fp32.iteration_time_s * device.fp32 / device.tf32 < tf32.iteration_time_s < fp32.iteration_time_s


def test_a_device_without_tf32_cores_is_refused_in_one_line(tmp_path):
    """A job file asking tf32 on the paper's TITAN RTX testbed (Turing: no TF32) fails as it loads."""
    with pytest.raises(GbmwError) as error:
        load_job(_job_file(tmp_path, "bert-huge-32_rtx-titan-x8", precision="tf32"))
    message = str(error.value)
    assert "precision tf32" in message and "TITAN RTX" in message and "\n" not in message


def _job_file(folder: Path, name: str, **changes) -> Path:
    """A copy of bundled job `name` with `changes`, its model and cluster named by path."""
    from gbmw.specs.bundled import resolve_recipe

    source = resolve_recipe(name, "jobs")
    data = yaml.safe_load(source.read_text())
    recipes = source.parent.parent
    data.update(model=str(recipes / "models" / f"{data['model']}.yaml"),
                cluster=str(recipes / "clusters" / f"{data['cluster']}.yaml"), **changes)
    path = folder / f"{name}-{'-'.join(map(str, changes.values()))}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("target", ["deepspeed", "megatron-deepspeed", "megatron-core"])
def test_stock_targets_refuse_tf32_naming_what_runs_it(target):
    with pytest.raises(GbmwError) as error:
        Planner(_job("tf32"), target=target, explain_failure=False)
    message = str(error.value)
    assert message.startswith(f"precision tf32: --target {target}") and "--target runtime" in message
    assert "TF32" in message and "\n" not in message


def test_a_tf32_job_file_plans_through_the_cli_and_its_plan_reads_back(tmp_path, capsys):
    from gbmw.cli.main import main

    job_file = _job_file(tmp_path, "bert-huge-32_a100-2x8", precision="tf32", global_batch=64)
    plan_file = tmp_path / "plan.yaml"
    assert main(["plan", str(job_file), "--output", str(plan_file)]) == 0
    assert "tf32" in capsys.readouterr().out
    assert Plan.load(plan_file).precision == "tf32"
