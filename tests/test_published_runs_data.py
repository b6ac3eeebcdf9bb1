"""benchmarks/published_runs.py keeps working on its data files (dense and mixture-of-experts): every run it can cost is costed (its model, cluster
and plan build and estimate), every other run names why not, and each run cites its source. The benchmark prints
the errors; this test asserts none of them (targets are met in benchmarks, not tests)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "published_runs.py"


@pytest.fixture(scope="module")
def benchmark():
    spec = importlib.util.spec_from_file_location("published_runs", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_every_costable_run_is_costed_and_every_other_says_why(benchmark):
    runs = yaml.safe_load(benchmark.DATA.read_text())["runs"]
    costed = [run for run in runs if benchmark.why_not_costable(run) is None]
    assert len(costed) >= 12 and len({run["source"]["title"] for run in costed}) >= 4
    for run in runs:
        assert run["source"]["url"] and run["source"]["quote"], run["name"]
    for run in costed:
        row = benchmark.cost(run)
        assert math.isfinite(row.predicted_s) and row.predicted_s > 0 and row.measured_s > 0, run["name"]


def test_every_costable_moe_run_is_costed_and_every_other_says_why(benchmark):
    """The mixture-of-experts runs (benchmarks/published_moe_runs.yaml): each costable one builds its MoE model,
    cluster and expert-parallel plan and estimates a finite time; each other names its reasons; each cites a source
    and, where a field comes from a recipe rather than the source, quotes the recipe."""
    runs = yaml.safe_load(benchmark.MOE_DATA.read_text())["runs"]
    assert runs and all(run["model"]["moe"] for run in runs)
    assert all(run["kind"] in ("moe", "moe+cp") for run in runs)
    costed = [run for run in runs if not benchmark.why_moe_run_not_costable(run)]
    assert costed
    for run in runs:
        assert run["source"]["url"] and run["source"]["quote"], run["name"]
        for field, recipe in (run.get("assumed_from_recipe") or {}).items():
            assert recipe["recipe"] and recipe["url"] and recipe["quote"] and recipe["why"], (run["name"], field)
        reasons = benchmark.why_moe_run_not_costable(run)
        assert all(reason.strip() for reason in reasons), run["name"]
        assert benchmark.why_not_costable(run) == ("; ".join(reasons) or None), run["name"]
        if (run["parallelism"].get("context") or 1) > 1:
            assert any("context parallelism" in reason for reason in reasons), run["name"]
    for run in costed:
        row = benchmark.cost(run)
        assert math.isfinite(row.predicted_s) and row.predicted_s > 0 and row.measured_s > 0, run["name"]
        assert math.isfinite(row.peak_memory_gib) and row.peak_memory_gib > 0, run["name"]


def test_the_bundled_regime_errors_are_what_the_benchmark_computes_now(benchmark, tmp_path, monkeypatch, capsys):
    """recipes/published_errors.yaml (what `plan`, `estimate` and `compare` print as their trust line) equals
    `published_runs.py --regimes` run now: same runs, same regimes, errors equal to their 4 printed decimals (the
    file rounds them; 1e-4 catches any change of the estimator that moves a run by 0.01 %). Regenerate with
    `python benchmarks/published_runs.py --regimes NEW_FILE` and move it over the bundled one."""
    written = tmp_path / "regimes.yaml"
    monkeypatch.setattr(sys, "argv", ["published_runs.py", "--regimes", str(written)])
    benchmark.main()
    capsys.readouterr()
    fresh = yaml.safe_load(written.read_text())["runs"]
    bundled = yaml.safe_load((BENCHMARK.parent.parent / "recipes" / "published_errors.yaml").read_text())["runs"]
    assert [run["name"] for run in bundled] == [run["name"] for run in fresh]
    for old, new in zip(bundled, fresh):
        assert old["regime"] == new["regime"], old["name"]
        assert old["error"] == pytest.approx(new["error"], abs=1.5e-4), old["name"]


def test_composer_runs_costed_on_bf16_weights_leave_the_regimes_alone(benchmark):
    """The Composer (FSDP) runs' second costing, on the target that holds bf16 compute weights as Composer's
    param_dtype does, gives each a finite time and memory and does not replace the run's regime (what `plan`,
    `estimate` and `compare` read comes from the headline costing)."""
    runs = yaml.safe_load(benchmark.DATA.read_text())["runs"]
    composer = [run for run in runs if benchmark.why_not_costable(run) is None
                and benchmark._framework(run) == "composer/llm-foundry"]
    assert composer
    for run in composer:
        headline = benchmark.cost(run)
        regime = dict(benchmark.REGIMES[run["name"]])
        bf16_weights = benchmark.cost(run, benchmark.COMPOSER_WEIGHTS_TARGET)
        assert benchmark.REGIMES[run["name"]] == regime, run["name"]
        assert math.isfinite(bf16_weights.predicted_s) and bf16_weights.predicted_s > 0, run["name"]
        # bf16 weights, no autocast copies: without recomputation the same run holds less than on the runtime, whose
        # autocast keeps a bf16 copy of every weight from forward to backward beside its fp32 ones. With full
        # recomputation those copies live one layer at a time, and DeepSpeed's 4 more bytes of states per parameter
        # (20 against FSDP's 16) can outweigh them: MPT-30B on 8 GPUs holds 77.1 GiB there against the runtime's 74.4.
        if run["parallelism"]["recompute"] == "none":
            assert bf16_weights.peak_memory_gib < headline.peak_memory_gib, run["name"]


def test_tp_comm_overlap_is_read_from_the_recipes_of_tp_runs_only(benchmark):
    """A TP > 1 run records its recipe's TP communication overlap (True / False, None where nothing states it); a TP 1
    run records nothing. Catches: the value not taken from `assumed_from_recipe`, a TP 1 run counted in the split."""
    runs = yaml.safe_load(benchmark.DATA.read_text())["runs"]
    benchmark.TP_COMM_OVERLAP.clear()
    for run in runs:
        if benchmark.why_not_costable(run) is None:
            benchmark.cost(run)
    stated = {run["name"]: run["assumed_from_recipe"]["tp_comm_overlap"]["value"] for run in runs
              if "tp_comm_overlap" in (run.get("assumed_from_recipe") or {}) and benchmark.why_not_costable(run) is None}
    assert any(stated.values()) and not all(stated.values())
    for name, value in stated.items():
        assert benchmark.TP_COMM_OVERLAP[name] is value, name
    tp1 = [run["name"] for run in runs if run["parallelism"]["tensor"] == 1 and benchmark.why_not_costable(run) is None]
    assert tp1 and not set(tp1) & set(benchmark.TP_COMM_OVERLAP)


def test_the_triton_attention_bracket_slows_the_attention_alone(benchmark):
    """published_runs.print_triton_attention's costing: the device's attention rate divided by the factor, its matmul
    rate untouched, and an llm-foundry run slower for it, its regime unchanged. Catches the factor applied to the
    matmuls, multiplied instead of divided, or left out."""
    run = next(run for run in yaml.safe_load(benchmark.DATA.read_text())["runs"]
               if run["name"] == "mpt-125m-a100-80gb-8gpu-seq2048-mbs40")
    cluster = benchmark.build_cluster(run, [])
    slowed = benchmark.with_attention_slowed(cluster, 2.5)
    assert slowed.attention_flops("bf16") == pytest.approx(cluster.attention_flops("bf16") / 2.5)
    assert slowed.sustained_flops("bf16") == cluster.sustained_flops("bf16")
    headline = benchmark.cost(run)
    regime = dict(benchmark.REGIMES[run["name"]])
    assert benchmark.cost(run, attention_slowdown=2.5).predicted_s > headline.predicted_s
    assert benchmark.REGIMES[run["name"]] == regime
