"""The settings a plan carries from its job (gbmw.specs.jobs.LAUNCH_SETTINGS): each is a Plan field of the same name,
written to the plan's YAML only when it is not the default (plans written before a field existed read the same), read
back equal, and checked against the job in one line naming the field."""

from __future__ import annotations

import dataclasses

import pytest

import gbmw
from gbmw.errors import PlanError
from gbmw.plan import Plan
from gbmw.specs.jobs import LAUNCH_SETTINGS

JOB = ("model: gpt3-15b\ncluster: h100-80g-x64\nprecision: bf16\ngradient_reduce_dtype: bf16\n"
       "adam_moments_dtype: bf16\ntp_comm_overlap: true\nglobal_batch: 512\n")
# (field, the value the job above sets, the default)
NON_DEFAULT = [("gradient_reduce_dtype", "bf16", "fp32"), ("adam_moments_dtype", "bf16", "fp32"),
               ("tp_comm_overlap", True, False)]


@pytest.fixture(scope="module")
def job_and_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("jobs") / "gpt3-15b-settings_h100-80g-x64.yaml"
    path.write_text(JOB)
    job = gbmw.load_job(path)
    return job, gbmw.uniform_plan(job, "tp=4,pp=2,zero=1,sp=on,micro=1,target=megatron-core")


def test_the_plan_carries_every_launch_setting_of_its_job(job_and_plan):
    job, plan = job_and_plan
    assert set(LAUNCH_SETTINGS) <= {field.name for field in dataclasses.fields(Plan)}
    assert {name: getattr(plan, name) for name in LAUNCH_SETTINGS} == job.launch_settings()
    plan.check_against(job.model, job.cluster.num_devices, **job.launch_settings())  # agrees: no error


@pytest.mark.parametrize("name, value, default", NON_DEFAULT)
def test_a_setting_is_written_only_when_not_the_default_and_checked_against_the_job(job_and_plan, name, value,
                                                                                     default):
    """Catches: a default written (old plans would read differently), a value lost on the way back, a mismatch with
    the job let through or worded without the field."""
    job, plan = job_and_plan
    word = lambda setting: str(setting).lower()  # noqa: E731 (YAML's words for booleans)
    assert f"{name}: {word(value)}" in plan.to_yaml() and Plan.from_yaml(plan.to_yaml()) == plan
    plain = dataclasses.replace(plan, **{name: default})
    assert name not in plain.to_yaml() and Plan.from_yaml(plain.to_yaml()) == plain
    with pytest.raises(PlanError, match=f"^plan is for {name} {word(default)} but the job sets {word(value)}; plan "
                                        f"again \\(gbmw plan\\) or set the job's {name} to {word(default)}$"):
        plain.check_against(job.model, **{name: value})
