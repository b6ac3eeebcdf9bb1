"""`gbmw profile model`: measured stashed activations equal the analytic ones on the tiny GPT, the TP split measured
on two processes equals the analytic split, a profile YAML loads into the planner, and bad input is one error."""

import pytest

torch = pytest.importorskip("torch")

from dist_fixture import run_distributed  # noqa: E402
from runtime_reference import architecture  # noqa: E402

from gbmw.cli.main import main  # noqa: E402
from gbmw.specs.models import build_model, load_model  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def profiled():
    from gbmw.adapters.profile.model_profiler import profile_model

    return profile_model(architecture("gpt-tiny"), "fp32", torch.device("cpu"), repeats=1)


def test_measured_activations_equal_analytic(profiled):
    """Every byte autograd keeps for the runtime's layers is what gbmw.specs.models charges (flash attention, fp32)."""
    analytic = build_model(architecture("gpt-tiny"), "fp32")
    for expected, measured in zip(analytic.layers, profiled.layers):
        assert measured.boundary_activation_bytes_per_sample == expected.boundary_activation_bytes_per_sample
        assert measured.stashed_activation_bytes_per_sample == expected.stashed_activation_bytes_per_sample, expected.name
    for layer in profiled.layers:  # time = overhead per call + seconds per sample × samples, both measured
        timings = layer.timings
        assert timings.forward_time_per_sample_s >= 0 and timings.forward_overhead_s >= 0
        assert timings.forward_overhead_s + 8 * timings.forward_time_per_sample_s > 0
        assert timings.backward_overhead_s + 8 * timings.backward_time_per_sample_s > 0
    assert profiled.timings.optimizer_step_s_per_parameter > 0
    assert profiled.architecture == architecture("gpt-tiny")  # what the runtime builds the profiled model from


def _profile_on_two(rank, world_size):
    from gbmw.adapters.profile.model_profiler import profile_model, tp_pair_for_profiling

    spec = profile_model(architecture("gpt-tiny"), "fp32", torch.device("cpu"), repeats=1,
                         tp_pair=tp_pair_for_profiling())
    return [(layer.intermediate_activation_bytes_per_sample, layer.intermediate_tp_split_activation_bytes_per_sample)
            for layer in spec.layers]


@pytest.mark.dist
def test_tp_split_measured_on_two_processes():
    measured = run_distributed(2, _profile_on_two, timeout_s=120)[0]
    analytic = build_model(architecture("gpt-tiny"), "fp32")
    for layer, (replicated, split) in zip(analytic.layers[:-1], measured):  # embedding and blocks: exact
        assert (replicated, split) == (layer.intermediate_activation_bytes_per_sample,
                                       layer.intermediate_tp_split_activation_bytes_per_sample), layer.name
    head_split = measured[-1][1]  # megatron's CE also keeps a 1-byte mask per token beside the softmax
    assert head_split == pytest.approx(analytic.layers[-1].intermediate_tp_split_activation_bytes_per_sample, rel=0.01)


def test_profile_yaml_loads_into_the_planner(tmp_path, profiled):
    from gbmw.adapters.profile.model_profiler import model_spec_yaml
    from gbmw.search.planner import plan_job
    from gbmw.specs.jobs import load_job

    (tmp_path / "gpt-tiny-profile.yaml").write_text(model_spec_yaml(profiled))
    (tmp_path / "job.yaml").write_text("model: gpt-tiny-profile.yaml\ncluster: cpu-x4\nprecision: fp32\n"
                                       "global_batch: 16\nmemory_budget: 2MiB\n")
    job = load_job(tmp_path / "job.yaml")
    assert job.model.layers == load_model(tmp_path / "gpt-tiny-profile.yaml", "fp32").layers
    assert job.model.architecture == architecture("gpt-tiny")  # the runtime builds the model from what it carries
    plan = plan_job(job, batch=16)
    assert plan.estimate.fits
    analytic_job = load_job("gpt-tiny_cpu-x4")
    from gbmw.cost.estimate import estimate_plan  # the measured times, not FLOPs, price the same plan

    assert estimate_plan(job, plan).iteration_time_s != estimate_plan(analytic_job, plan).iteration_time_s


@pytest.mark.parametrize("argv, expected", [
    (["profile", "model", "no-such-model", "-o", "x.yaml"], "no-such-model"),
    (["profile", "model", "t5-large-32", "-o", "x.yaml"], "family: t5"),
    (["profile", "model", "gpt-tiny", "--precision", "fp16", "-o", "x.yaml"], "invalid choice: 'fp16'"),
    (["profile", "model", "gpt-tiny", "--batches", "8,2", "-o", "x.yaml"], "--batches 8,2"),
    (["profile", "model", "gpt-tiny", "--batches", "eight", "-o", "x.yaml"], "--batches 'eight'"),
])
def test_bad_input_is_one_error(tmp_path, monkeypatch, capsys, argv, expected):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert not (tmp_path / "x.yaml").exists()
