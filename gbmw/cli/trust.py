"""How far an estimate can be trusted (issue 28): beside a plan's throughput, the error gbmw's estimator showed on the
published training runs nearest the plan's regime.

A regime is what decides which of the estimator's terms dominate: the target that runs the plan, the device, the
precision, the TP degree, the pipeline's depth and interleaving, the ZeRO stage, recomputation, experts and
sequence splitting (`plan_regime`). The published runs' regimes and errors are data, written by
`python benchmarks/published_runs.py --regimes FILE` from the runs it costs and kept in
recipes/published_errors.yaml (a test checks the file against the benchmark run anew). The nearest runs are those
sharing the most features with the plan among the runs of its kind (`SAME_KIND_FEATURES`: dense or mixture of
experts); when they share fewer than `MIN_SHARED_FEATURES`, no published run is of this regime, and the line says so.
"""

from __future__ import annotations

import statistics
from functools import cache
from typing import Any

import yaml

from gbmw.plan import Plan
from gbmw.specs.bundled import RECIPES_DIR
from gbmw.specs.jobs import JobSpec

PUBLISHED_ERRORS = RECIPES_DIR / "published_errors.yaml"
FEATURES = ("target", "device", "precision", "tensor parallel", "pipeline", "ZeRO", "recomputation", "experts",
            "sequence split")
MIN_SHARED_FEATURES = 8
"""Fewer features in common than this and the nearest published runs are not of the plan's regime."""
SAME_KIND_FEATURES = ("experts",)
"""Features the nearest runs share with the plan wherever a published run does: a mixture of experts' errors come
from terms a dense model has none of (routing, the experts' all-to-alls and GEMMs), so a dense plan is not judged by
MoE runs however many other features they share (nor an MoE plan by dense runs while an MoE run is published)."""


def _device_family(name: str) -> str:
    for family in ("A100", "H100", "H200", "H800", "B200", "GB200"):
        if family in name.upper():
            return family
    return name


def plan_regime(plan: Plan, job: JobSpec) -> dict[str, str]:
    """The plan's regime, one value per name of FEATURES."""
    strategies = plan.strategies
    tp = max(strategy.tp for strategy in strategies)
    zero = max(3 if strategy.degree("sdp") > 1 else 2 if strategy.degree("z2dp") > 1 else
               1 if strategy.degree("z1dp") > 1 else 0 for strategy in strategies)
    recompute = {strategy.recompute for strategy in strategies}
    pipeline = "none" if plan.pp == 1 else "PP 2–8" if plan.pp <= 8 else "PP > 8"
    return {
        "target": plan.target,
        "device": _device_family(job.cluster.device.name),
        "precision": "fp8" if job.precision == "fp8" else "16-bit" if job.precision in ("bf16", "fp16") else "fp32",
        "tensor parallel": "TP 1" if tp == 1 else "TP 2–4" if tp <= 4 else "TP 8+",
        "pipeline": pipeline + (", interleaved" if plan.virtual_stages > 1 else ""),
        "ZeRO": f"ZeRO-{zero}" if zero else "none",
        "recomputation": "full" if "full" in recompute else "selective" if "selective" in recompute else "none",
        "experts": "MoE" if job.model.is_mixture_of_experts else "dense",
        "sequence split": "yes" if any(strategy.sequence_axis for strategy in strategies) else "no",
    }


@cache
def published_errors() -> tuple[dict[str, Any], ...]:
    """The published runs' names, errors (estimate / measured − 1) and regimes (recipes/published_errors.yaml)."""
    if not PUBLISHED_ERRORS.is_file():
        return ()
    return tuple(yaml.safe_load(PUBLISHED_ERRORS.read_text())["runs"])


def nearest_runs(regime: dict[str, str]) -> tuple[int, list[dict[str, Any]]]:
    """(features shared, the published runs sharing that many — the most any run of the regime's kind shares with
    `regime`; any run's where none is of its kind)."""
    runs = published_errors()
    same_kind = [run for run in runs if all(run["regime"].get(f) == regime[f] for f in SAME_KIND_FEATURES)]
    runs = same_kind or runs
    if not runs:
        return 0, []
    shared = [sum(run["regime"].get(feature) == regime[feature] for feature in FEATURES) for run in runs]
    best = max(shared)
    return best, [run for run, count in zip(runs, shared) if count == best]


def trust_line(plan: Plan, job: JobSpec) -> str:
    """One line: the estimator's error on the published runs nearest the plan's regime, or that there are none."""
    regime = plan_regime(plan, job)
    shared, runs = nearest_runs(regime)
    if not runs:
        return "trust: no published runs are bundled to compare this regime with"
    differs = sorted({feature for run in runs for feature in FEATURES if run["regime"][feature] != regime[feature]})
    errors = [run["error"] for run in runs]
    names = f" ({', '.join(run['name'] for run in runs)})" if len(runs) <= 3 else ""
    summary = (f"{len(runs)} run{'s' if len(runs) > 1 else ''}{names} sharing {shared} of {len(FEATURES)} features"
               + (f" (not: {', '.join(differs)})" if differs else "") + ": mean |error| "
               f"{statistics.mean(map(abs, errors)):.1%}, signed mean {statistics.mean(errors):+.1%}, worst "
               f"{max(errors, key=abs):+.1%} (benchmarks/published_runs.py)")
    if shared < MIN_SHARED_FEATURES:
        return f"trust: no published run of this regime; the nearest, {summary}"
    return f"trust: on published runs of this regime, {summary}"
