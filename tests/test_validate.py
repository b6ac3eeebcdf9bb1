"""`gbmw validate`: the error arithmetic, and the held memory the runtime measures equals the estimator's on
2-process plans (model states from the tensors, stashed activations at their in-flight peak)."""

import pytest
from dist_fixture import run_distributed

from gbmw.adapters.profile.validate import PlanValidation, relative_error, summarise  # imports torch only to run


def test_error_arithmetic():
    assert relative_error(110.0, 100.0) == pytest.approx(0.10)
    assert relative_error(90.0, 100.0) == pytest.approx(-0.10)
    with pytest.raises(ValueError):
        relative_error(1.0, 0.0)
    assert summarise([0.1, -0.3, 0.2]) == pytest.approx({"mean": 0.2, "median": 0.2, "max": 0.3})
    result = PlanValidation("p", 1.2, 1.0, (110.0, 50.0), (100.0, 50.0), (0.0, 0.0))
    assert result.time_error == pytest.approx(0.2)
    assert result.memory_errors == pytest.approx((0.1, 0.0))


def test_device_peaks_are_printed_beside_the_estimated_peak():
    from rich.console import Console

    from gbmw.adapters.profile.validate import print_validation

    on_cpu = PlanValidation("cpu-plan", 1.0, 1.0, (100.0,), (100.0,), (0.0,), 1.0, (120.0,), ())
    on_gpu = PlanValidation("gpu-plan", 1.0, 1.0, (100.0,), (100.0,), (0.0,), 1.0, (2**30 * 1.05,), (2**30,))
    assert on_gpu.device_peak_errors == pytest.approx((0.05,))
    console = Console(record=True, width=200)
    summary = print_validation([on_cpu, on_gpu], console)
    text = console.export_text()
    assert "max_memory_allocated" in text and "1075.2" in text and "+5.0%" in text and "cpu-plan" in text
    assert summary["device peak"]["max"] == pytest.approx(0.05)
    assert "device peak" not in print_validation([on_cpu], Console(record=True))


def test_timings_keep_the_mean_of_the_fastest_quarter():
    from gbmw.adapters.profile.timing import fast_mean_s, fast_quarter

    times = [5.0, 1.0, 4.0, 2.0, 9.0, 3.0, 8.0, 7.0]
    assert fast_quarter(times) == [1, 3]  # the two fastest of eight, by index
    assert fast_mean_s(times) == pytest.approx(1.5)
    assert fast_mean_s([2.0, 3.0]) == 2.0  # at least one repetition is kept
    with pytest.raises(ValueError):
        fast_mean_s([])


def _cluster_yaml(folder):
    """The cpu-x4 recipe cut to the two processes the test launches."""
    import yaml

    from gbmw.specs.bundled import RECIPES_DIR
    from gbmw.specs.files import read_yaml

    data = read_yaml(RECIPES_DIR / "clusters" / "cpu-x4.yaml")
    data.update(name="cpu-x2", devices_per_node=2)
    data["links"][0]["devices"] = 2
    (folder / "cpu-x2.yaml").write_text(yaml.safe_dump(data))
    (folder / "job.yaml").write_text("model: gpt-tiny\ncluster: cpu-x2.yaml\nprecision: fp32\nglobal_batch: 8\n"
                                     "memory_budget: 1GiB\n")
    return folder / "job.yaml"


def _measure(rank, world_size, job_path, plans):
    from gbmw.adapters.profile.validate import PlanRun, measure_plans, predicted_terms
    from gbmw.specs.jobs import load_job

    job = load_job(job_path)
    architecture = job.model.architecture
    runs = [PlanRun(plan, architecture, "cpu") for plan in plans]
    measure_plans(runs, steps=2, warmup=1, min_seconds=0.0)  # interleaved: every plan's steps round by round
    return [(predicted_terms(job, plan)[1], run.held_per_stage, len(run.times)) for plan, run in zip(plans, runs)]


@pytest.mark.dist
def test_held_memory_matches_the_estimator(tmp_path):
    from gbmw.plan import plan_from_strategy_names
    from gbmw.specs.jobs import load_job

    job_path = _cluster_yaml(tmp_path)
    job = load_job(job_path)
    layers = job.model.num_layers
    plans = [plan_from_strategy_names(job.model, 2, names, partition, 8, micro)
             for names, partition, micro in (
                 (["dp2"] * layers, [layers], 2),
                 (["tp2"] * layers, [layers], 2),
                 (["single"] * layers, [3, layers - 3], 4),
                 (["dp2", "dp2+ckpt", "tp2", "tp2+ckpt", "dp2", "dp2"], [layers], 2),
             )]
    for predicted, measured, timed_steps in run_distributed(2, _measure, str(job_path), plans, timeout_s=180)[0]:
        assert timed_steps == 2
        for stage_predicted, stage_measured in zip(predicted, measured):
            # Within 0.1 %: what the estimator leaves out is a few hundred bytes per micro-batch that do not grow
            # with the batch (position indices, the loss scalar).
            assert stage_predicted == pytest.approx(stage_measured, rel=1e-3)


def _cli_without_launcher(tmp_path, monkeypatch):
    """(job path, a dp2 plan path) for `gbmw validate` run as one plain process."""
    from gbmw.plan import plan_from_strategy_names
    from gbmw.specs.jobs import load_job

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    job_path = _cluster_yaml(tmp_path)
    job = load_job(job_path)
    plan = plan_from_strategy_names(job.model, 2, ["dp2"] * job.model.num_layers, [job.model.num_layers], 8, 2)
    (tmp_path / "dp2.yaml").write_text(plan.to_yaml())
    return job_path, tmp_path / "dp2.yaml"


def test_validate_bad_input_is_one_error(tmp_path, capsys, monkeypatch):
    from gbmw.cli.main import main

    job_path, _ = _cli_without_launcher(tmp_path, monkeypatch)
    assert main(["validate", str(job_path), "--plans", str(tmp_path / "dp2.yaml")]) == 2
    err = capsys.readouterr().err
    assert "num_devices=2, but 1 process(es) were launched" in err and "Traceback" not in err
    (tmp_path / "taken.json").write_text("{}")
    assert main(["validate", str(job_path), "--plans", str(tmp_path / "dp2.yaml"), "--json",
                 str(tmp_path / "taken.json")]) == 2
    assert "exists; gbmw does not overwrite" in capsys.readouterr().err
    assert (tmp_path / "taken.json").read_text() == "{}"


def _validate_alongside(rank, world_size, job_path, plan_path, profile_path):
    from gbmw.adapters.profile.validate import run_validate

    results = run_validate(job_path, [plan_path], steps=2, warmup=1, say=lambda text: None,
                           profile_alongside=profile_path)
    return [(result.predicted_s, result.measured_s) for result in results]


@pytest.mark.dist
def test_profile_alongside_writes_the_profile_it_predicts_from(tmp_path):
    """`validate --profile-alongside`: the model is profiled in the same rounds as the timed steps; the profile
    is written to the new file, loads as a job's model, and the printed prediction is the estimator's on it."""
    from gbmw.adapters.profile.validate import predicted_terms
    from gbmw.plan import Plan, plan_from_strategy_names
    from gbmw.specs.files import read_yaml
    from gbmw.specs.jobs import load_job
    from gbmw.specs.model_spec import ModelSpec

    job_path = _cluster_yaml(tmp_path)
    job = load_job(job_path)
    plan = plan_from_strategy_names(job.model, 2, ["dp2", "tp2+ckpt", "sdp2", "tp2", "dp2", "tp2"], [6], 8, 2)
    (tmp_path / "mix.yaml").write_text(plan.to_yaml())
    profile = tmp_path / "alongside.yaml"
    [(predicted_s, measured_s)] = run_distributed(2, _validate_alongside, str(job_path), str(tmp_path / "mix.yaml"),
                                                  str(profile), timeout_s=180)[0]
    spec = ModelSpec.model_validate(read_yaml(profile))
    assert spec.family == "profiled" and spec.timings.slice_gather_time_s > 0 and spec.timings.p2p_time_s > 0
    assert all(layer.timings.tp2_time_s > 0 and layer.timings.sdp2_time_s > 0 and layer.timings.ckpt_time_s > 0
               for layer in spec.layers)
    profiled_job = job.model_copy(update={"model": spec})
    assert predicted_s == pytest.approx(predicted_terms(profiled_job, Plan.load(tmp_path / "mix.yaml"))[0], rel=1e-9)
    assert predicted_s != pytest.approx(predicted_terms(job, plan)[0], rel=1e-3) and measured_s > 0


def test_profile_alongside_bad_input(tmp_path, capsys, monkeypatch):
    from gbmw.cli.main import main

    job_path, plan_path = _cli_without_launcher(tmp_path, monkeypatch)
    (tmp_path / "taken.yaml").write_text("keep")
    assert main(["validate", str(job_path), "--plans", str(plan_path), "--profile-alongside",
                 str(tmp_path / "taken.yaml")]) == 2
    assert "exists; gbmw does not overwrite" in capsys.readouterr().err and (tmp_path / "taken.yaml").read_text() == "keep"
    assert main(["validate", str(job_path), "--plans", str(plan_path), "--profile-alongside",
                 str(tmp_path / "new.yaml"), "--one-at-a-time"]) == 2
    assert "cannot run --one-at-a-time" in capsys.readouterr().err
