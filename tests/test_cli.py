"""The `gbmw` command end to end: output, JSON, and one clear error line for bad input."""

import json
import os
import stat
import subprocess
import sys

import pytest

from gbmw.cli.main import main


def run(*args):
    result = subprocess.run([sys.executable, "-m", "gbmw.cli.main", *args], capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout, result.stderr


def test_space_says_44_for_8_devices(capsys):
    assert main(["space", "--devices", "8"]) == 0
    assert "total: 44" in capsys.readouterr().out
    assert main(["space", "--devices", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total"] == 44 and len(data["by_pp"]["1"]) == 22
    assert main(["space", "--devices", "8", "--no-prune", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 68


@pytest.mark.parametrize("size", ["15b", "39b", "65b"])
def test_estimate_gpt3_jobs_under_a_megatron_style_config(size, capsys):
    assert main(["estimate", f"gpt3-{size}_a100-80g-x32", "--uniform", "tp=8,pp=2,zero=1,ckpt=full,micro=1",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("iteration_time_s", "samples_per_s", "stage_peak_memory_bytes", "fits", "model_tflops_per_device", "mfu"):
        assert key in data
    assert data["fits"]
    assert 0.15 < data["mfu"] < 0.52  # below the sustained/peak ratio the cluster recipe is calibrated to
    assert data["samples_per_s"] == pytest.approx(data["plan"]["global_batch"] / data["iteration_time_s"])


def test_estimate_table_and_plan_file(tmp_path, capsys):
    assert main(["estimate", "bert-huge-32_rtx-titan-x8", "--uniform", "zero=3,micro=2,batch=16"]) == 0
    out = capsys.readouterr().out
    assert "sdp8 ×34" in out and "samples/s" in out and "fits in 16.00 GiB" in out
    assert main(["estimate", "bert-huge-32_rtx-titan-x8", "--uniform", "zero=3,micro=2,batch=16", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    from gbmw.plan import Plan
    path = Plan.from_dict(plan).save(tmp_path / "plan.yaml")
    assert main(["estimate", "bert-huge-32_rtx-titan-x8", "--plan", str(path), "--memory", "4GiB"]) == 0
    assert "does NOT fit in 4.00 GiB" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["estimate", "no-such-job", "--uniform", "tp=1"], "job 'no-such-job': no such file or bundled recipe"),
        (["estimate", "gpt3-15b_a100-80g-x32", "--uniform", "tp=16"], "not divisible by tp=16"),
        (["estimate", "gpt3-15b_a100-80g-x32", "--uniform", "tp=8", "--memory", "lots"], "--memory: value 'lots'"),
        (["estimate", "gpt3-15b_a100-80g-x32", "--plan", "/nonexistent/plan.yaml"], "/nonexistent/plan.yaml: no such plan"),
        (["space", "--devices", "6"], "6 devices: the search space needs a power-of-two device count"),
    ],
)
def test_bad_input_is_one_clear_line(args, message):
    code, out, err = run(*args)
    assert code == 2
    assert "Traceback" not in err
    assert err.startswith("gbmw: error:") and message in err
    assert len(err.strip().splitlines()) == 1


def test_plan_for_another_device_count_is_refused(tmp_path, capsys):
    assert main(["estimate", "bert-huge-32_rtx-titan-x8", "--uniform", "micro=1,batch=8", "--json"]) == 0
    from gbmw.plan import Plan
    path = Plan.from_dict(json.loads(capsys.readouterr().out)["plan"]).save(tmp_path / "p.yaml")
    code, _, err = run("estimate", "bert-huge-32_a100-2x8", "--plan", str(path))
    assert code == 2 and "plan is for 8 devices but 16 are available" in err


def test_plan_prints_stages_and_writes_plan_and_figure(tmp_path, capsys):
    out_plan, out_figure = tmp_path / "plan.yaml", tmp_path / "plan.png"
    assert main(["plan", "bert-huge-32_rtx-titan-x8", "--batch", "32", "-o", str(out_plan),
                 "--figure", str(out_figure)]) == 0
    out = capsys.readouterr().out
    assert "samples/s" in out and "search (gbmw (BMW + ZeRO-1/2)" in out and f"wrote plan {out_plan}" in out
    from gbmw.plan import Plan
    plan = Plan.load(out_plan)
    assert plan.global_batch == 32 and plan.estimate.fits
    assert out_figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # never overwrite: the same command again fails before searching and leaves the files alone
    before = out_plan.read_bytes()
    code, _, err = run("plan", "bert-huge-32_rtx-titan-x8", "--batch", "32", "-o", str(out_plan))
    assert code == 2 and "exists; gbmw does not overwrite" in err and out_plan.read_bytes() == before


def test_plan_json_and_targets(capsys):
    assert main(["plan", "bert-huge-32_rtx-titan-x8", "--batch", "32", "--target", "megatron-core", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["target"] == "megatron-core" and data["search_s"] > 0 and data["estimate"]["fits"]
    assert len({run["strategy"].removesuffix("+ckpt") for run in data["strategies"]}) == 1


def test_compare_prints_every_baseline_and_variant(capsys):
    assert main(["compare", "bert-huge-32_rtx-titan-x8", "--batch", "16", "--memory", "8GiB,20GiB"]) == 0
    out = capsys.readouterr().out
    for label in ("PyTorch DDP (DP)", "Megatron (TP)", "PyTorch GPipe (PP)", "FSDP/ZeRO-3 (SDP)", "DeepSpeed 3D",
                  "Galvatron (DP+TP)", "Galvatron (DP+PP)", "Galvatron-Base", "Galvatron (1F1B+Bi-obj)",
                  "Galvatron-BMW", "target megatron-core"):
        assert label in out
    assert "OOM" in out and "8 GiB" in out and "20 GiB" in out
    assert main(["compare", "bert-huge-32_rtx-titan-x8", "--batch", "16", "--memory", "8GiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    ddp = next(row for row in rows if row["name"] == "ddp")
    assert ddp["oom"] is True


@pytest.mark.parametrize(
    "args, message",
    [
        (["plan", "gpt-tiny_cpu-x4", "--memory", "1MiB"],
         "nothing fits: no plan for gpt-tiny on 4 × CPU process (one thread) with global batch 16 fits 1.00 MiB per "
         "device (gbmw (BMW + ZeRO-1/2)); the smallest per-device memory that fits is 1,"),
        (["plan", "gpt3-65b_a100-80g-x32", "--memory", "4GiB", "--variant", "bmw", "--approximate"],
         "nothing fits: gpt3-65b on 32 × NVIDIA A100-SXM4-80GB with global batch 1792"),
        (["plan", "bert-huge-32_rtx-titan-x8", "--variant", "nope"], "variant 'nope' is unknown"),
        (["plan", "bert-huge-32_rtx-titan-x8", "--target", "horovod"], "--target 'horovod' is unknown"),
        (["plan", "bert-huge-32_rtx-titan-x8", "--batch", "0"], "argument --batch: value 0 — must be from 1 to"),
    ],
)
def test_plan_errors_are_one_line(args, message):
    code, out, err = run(*args)
    assert code == 2 and "Traceback" not in err and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_users_usual_permissions(tmp_path, umask, mode):
    """An output is written to a private temporary file and linked into place (gbmw.specs.files); it must end with the
    mode a plain open() gives under the user's umask, not mkstemp's 0600, which hides it from the job's group."""
    previous = os.umask(umask)
    try:
        assert main(["plan", "gpt-tiny_cpu-x4", "-o", str(tmp_path / "plan.yaml")]) == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "plan.yaml").stat().st_mode) == mode


def test_a_fitting_plan_near_the_budget_says_so(capsys):
    """Above 95 % of the budget the estimate prints one line naming the stage and its share; at or below, nothing.
    Catches: the note missing, printed for plans with room, or printed for plans that do not fit."""
    from dataclasses import replace as replaced
    from gbmw.cli.report import near_budget_note
    assert main(["estimate", "bert-huge-32_rtx-titan-x8", "--uniform", "zero=3,micro=2,batch=16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    from gbmw.plan import Estimate
    estimate = Estimate(**{key: tuple(value) if isinstance(value, list) else value
                           for key, value in data.items() if key in Estimate.__dataclass_fields__})
    budget = max(estimate.stage_peak_memory_bytes)
    assert near_budget_note(replaced(estimate, memory_budget_bytes=budget / 0.95)) is None
    note = near_budget_note(replaced(estimate, memory_budget_bytes=budget / 0.97))
    assert note is not None and "97.0% of the budget" in note and "stage" in note
    assert near_budget_note(replaced(estimate, memory_budget_bytes=budget / 1.2, fits=False)) is None
    assert main(["estimate", "bert-huge-32_rtx-titan-x8", "--uniform", "zero=3,micro=2,batch=16", "--memory",
                 f"{int(budget / 0.97)}B"]) == 0
    assert "of the budget" in capsys.readouterr().out


def test_the_nearest_published_runs_are_of_the_plans_kind_dense_or_experts():
    """A dense regime otherwise equal to an MoE run's is judged by dense runs only, and an MoE regime otherwise equal
    to a dense run's by MoE runs only. Catches: the kind ignored (the MoE run itself, sharing 8 of 9, would be
    nearest), or the filter applied the wrong way round."""
    from gbmw.cli.trust import nearest_runs, published_errors
    runs = published_errors()
    for kind, other in (("MoE", "dense"), ("dense", "MoE")):
        run = next(run for run in runs if run["regime"]["experts"] == kind)
        regime = dict(run["regime"], experts=other)
        shared, nearest = nearest_runs(regime)
        assert nearest and all(near["regime"]["experts"] == other for near in nearest), (kind, nearest)
        assert run not in nearest


def test_the_trust_line_names_the_nearest_published_runs_and_says_when_none_is_of_the_regime(capsys):
    """A regime equal to a bundled published run's finds it among all 9 features; one sharing fewer than 8 is
    reported as of no published regime; `estimate` prints the line. Catches: a wrong count of shared features, the
    nearest runs missed, the out-of-regime case worded as in-regime."""
    from gbmw.cli.trust import FEATURES, MIN_SHARED_FEATURES, nearest_runs, published_errors
    runs = published_errors()
    assert len(runs) >= 25
    first = runs[0]
    shared, nearest = nearest_runs(first["regime"])
    assert shared == len(FEATURES) and first in nearest
    assert all(run["regime"] == first["regime"] for run in nearest)
    alien = {feature: "none of these" for feature in FEATURES}
    shared, nearest = nearest_runs(alien)
    assert shared == 0 and len(nearest) == len(runs)
    assert MIN_SHARED_FEATURES == 8
    assert main(["estimate", "gpt3-39b_a100-80g-x32", "--uniform", "tp=8,pp=2,zero=0,ckpt=full,micro=1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "trust: on published runs of this regime, 1 run (sc21-table1-gpt-39B) sharing 8 of 9 features" in out
    assert main(["estimate", "gpt3-39b_a100-80g-x32", "--uniform", "tp=8,pp=2,zero=1,ckpt=full,micro=1"]) == 0
    assert "trust: no published run of this regime" in " ".join(capsys.readouterr().out.split())
