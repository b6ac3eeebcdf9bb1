"""Every bundled job's plans and estimates — `gbmw plan JOB --json` for every target, `gbmw compare JOB`, the
hand-tuned compares, and `--approximate` on a few jobs — equal the recorded goldens (tests/golden/bundled/, made by
tests/bundled_outputs.py). A change meant to change plans re-records them (`python tests/bundled_outputs.py
--write`) and says why in its commit; `python tests/bundled_outputs.py` also checks every `--approximate` plan."""

import json

import pytest
from bundled_outputs import GOLDEN, bundled_jobs, differences, dumps, job_outputs

APPROXIMATE_IN_CI = {"bert-huge-48_rtx-titan-x8", "gpt-tiny_cpu-x4", "gpt3-65b_h100-80g-x64", "llama-7b_a100-80g-x8",
               "t5-large-32_rtx-titan-x8", "vit-huge-32_rtx-titan-x8"}
"""Jobs whose `--approximate` plan is checked here too (a subset of bundled_outputs.APPROXIMATE_JOBS)."""
COMPARE_OUTSIDE_CI = {"bert-xhuge_a100-40g-x64", "vit-xhuge_a100-40g-x64", "deepseek-v2-lite_h100-80g-x64",
                      "gpt3-39b_a100-80g-x32", "gpt3-65b_a100-80g-x32", "gpt3-65b_h100-80g-x64",
                      "mixtral-8x7b_h100-80g-x64"}
"""Jobs whose `gbmw compare` outputs (every variant and target, and the hand-tuned compares) take the longest on a
2-core machine — 35 to 85 s a job with their plans — and run the same code as the other jobs' compares: here their
plans for every target are compared; `python tests/bundled_outputs.py` compares their compare outputs too."""


@pytest.mark.parametrize("job", bundled_jobs())
def test_bundled_plans_and_estimates_are_unchanged(job):
    expected = json.loads((GOLDEN / f"{job}.json").read_text())
    if job not in APPROXIMATE_IN_CI:
        expected.pop("plan --approximate", None)
    if job in COMPARE_OUTSIDE_CI:
        expected = {key: value for key, value in expected.items() if not key.startswith("compare")}
    actual = json.loads(dumps(job_outputs(job, approximate=job in APPROXIMATE_IN_CI,
                                          compare=job not in COMPARE_OUTSIDE_CI)))
    assert not differences(expected, actual)
