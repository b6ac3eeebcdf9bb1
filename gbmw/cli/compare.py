"""The paper's comparison (Tables 3–7): every baseline and variant, and the best plan per target, on one job.

Each row is searched at its best batch size (or the fixed one) by the same estimator, for one or
more memory budgets; a row with no fitting plan is OOM.
"""

from __future__ import annotations

from dataclasses import dataclass

from gbmw.plan import Plan
from gbmw.search.nothing_fits import NothingFitsError
from gbmw.search.planner import Planner
from gbmw.space.spaces import BASELINES, DEFAULT_VARIANT, OPT_IN_VARIANTS, VARIANTS, search_space
from gbmw.space.targets import STOCK_TARGETS, get_target
from gbmw.specs.jobs import JobSpec, load_job

ROWS: list[tuple[str, str, str]] = (
    [("baseline", name, "runtime") for name in BASELINES]
    + [("variant", name, "runtime") for name in VARIANTS if name not in OPT_IN_VARIANTS]
    + [("target", DEFAULT_VARIANT, name) for name in STOCK_TARGETS]
)


@dataclass
class ComparisonCell:
    budget_bytes: int
    plan: Plan | None
    """None: out of memory, or refused."""
    refusal: str | None = None
    """Why the row's target cannot run the job's settings (precision, gradient dtype, TP communication overlap), in
    the one line `gbmw plan --target` would print; None where it can."""


@dataclass
class ComparisonRow:
    kind: str
    name: str
    label: str
    cells: list[ComparisonCell]


def compare_job(job_reference: str, budgets: list[str | None], batch: int | None = None, sweep: bool = False,
                progress=None) -> list[ComparisonRow]:
    """Every row of the comparison for a job file at each memory budget (None: the job's)."""
    return compare_jobs([load_job(job_reference, memory_budget=budget) for budget in budgets], batch, sweep, progress)


def compare_jobs(jobs: list[JobSpec], batch: int | None = None, sweep: bool = False,
                 progress=None) -> list[ComparisonRow]:
    """Every row of the comparison for one job loaded at several memory budgets."""
    rows = []
    total = len(ROWS) * len(jobs)
    for index, (kind, variant, target) in enumerate(ROWS):
        cells = []
        label = ""
        for offset, job in enumerate(jobs):
            if progress is not None:
                progress(index * len(jobs) + offset, total)
            spec = search_space(variant, target)
            label = spec.label if kind != "target" else f"target {target}: {spec.label}"
            refusal = get_target(spec.target).precision_refusal(job.precision, job.gradient_reduce_dtype,
                                                                job.tp_comm_overlap, job.adam_moments_dtype)
            if refusal is not None:  # the other rows still compare what can run the job
                cells.append(ComparisonCell(job.memory_budget_bytes, None, refusal))
                continue
            planner = Planner(job, variant, batch, sweep, target=target, explain_failure=False)
            try:
                cells.append(ComparisonCell(job.memory_budget_bytes, planner.run()))
            except NothingFitsError:
                cells.append(ComparisonCell(job.memory_budget_bytes, None))
        rows.append(ComparisonRow(kind, variant if kind != "target" else target, label, cells))
    if progress is not None:
        progress(total, total)
    return rows


@dataclass
class HandTunedComparison:
    """A hand-tuned configuration beside gbmw's best plan for each target, on one job."""

    job: object
    handtuned: object
    rows: list[tuple[str, Plan | None, str]]
    """(label, plan or None, why none)"""


def compare_handtuned(job, handtuned) -> HandTunedComparison:
    """Cost a published configuration on the job's cluster and search gbmw's best plan for every target
    at the same global batch."""
    from gbmw.cost.estimate import estimate_plan
    from gbmw.errors import GbmwError
    from gbmw.plan import replace_estimate

    rows: list[tuple[str, Plan | None, str]] = []
    try:
        plan = handtuned.uniform.to_plan(job)
        plan = replace_estimate(plan, estimate_plan(job, plan))
        rows.append((f"hand-tuned {handtuned.name} ({handtuned.uniform.describe()})", plan, ""))
        batch = plan.global_batch
    except GbmwError as error:
        rows.append((f"hand-tuned {handtuned.name}", None, str(error)))
        batch = job.global_batch
    for target in ("runtime", *STOCK_TARGETS):
        label = f"gbmw, target {target}"
        try:
            rows.append((label, Planner(job, batch=batch, target=target, explain_failure=False).run(), ""))
        except NothingFitsError as error:
            rows.append((label, None, str(error)))
    return HandTunedComparison(job, handtuned, rows)
