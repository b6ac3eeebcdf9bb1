"""`gbmw validate JOB --plans …`: the estimator against the runtime, plan by plan (paper App.: estimation error).

Run under a launcher with as many processes as the plans' devices. For each plan the runtime trains
`warmup` + `steps` steps on synthetic batches; measured are the median step time (each step's slowest
rank) and, per pipeline stage, the largest memory a rank of that stage holds (held_memory: model states +
stashed activations at their in-flight peak). Predicted are the estimator's iteration time (Eq. 9) and
the same two memory terms of that stage; the estimator's backward extra (transient buffers the probe does
not hold) is printed beside them. Errors are (predicted − measured) / measured.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gbmw.errors import GbmwError, PlanError


@dataclass(frozen=True)
class PlanValidation:
    plan: str
    predicted_s: float
    measured_s: float
    predicted_held_bytes: tuple[float, ...]
    """Per stage: model states + stashed activations as the estimator counts them."""
    measured_held_bytes: tuple[float, ...]
    backward_extra_bytes: tuple[float, ...]
    """Per stage: the estimator's transient backward extra (not measured on CPU)."""

    @property
    def time_error(self) -> float:
        return relative_error(self.predicted_s, self.measured_s)

    @property
    def memory_errors(self) -> tuple[float, ...]:
        return tuple(relative_error(p, m) for p, m in zip(self.predicted_held_bytes, self.measured_held_bytes))


def relative_error(predicted: float, measured: float) -> float:
    """(predicted − measured) / measured."""
    if measured <= 0:
        raise ValueError(f"measured value {measured} must be positive")
    return (predicted - measured) / measured


def summarise(errors: list[float]) -> dict[str, float]:
    """Mean, median and maximum of the absolute errors."""
    if not errors:
        raise ValueError("no errors to summarise")
    magnitudes = [abs(error) for error in errors]
    return {"mean": statistics.fmean(magnitudes), "median": statistics.median(magnitudes), "max": max(magnitudes)}


def predicted_terms(job, plan) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
    """(iteration s, per-stage states + stash, per-stage backward extra) from the estimator."""
    from gbmw.comm import CommModel
    from gbmw.cost import CostSettings, estimate_plan, stage_estimate

    settings, comm = CostSettings(job.cluster, job.precision, job.optimizer), CommModel(job.cluster)
    stages = [stage_estimate(job.model, list(plan.stage_strategies(index)), first, index, plan.pp, plan.micro_batch,
                             plan.num_micro_batches, settings, comm, {}, plan.schedule)
              for index, (first, _) in enumerate(plan.stage_bounds)]
    held = tuple(stage.model_state_bytes + stage.stashed_activation_bytes for stage in stages)
    extra = tuple(stage.activation_bytes - stage.stashed_activation_bytes for stage in stages)
    return estimate_plan(job, plan).iteration_time_s, held, extra


def measure_plan(plan, architecture, device: str, steps: int, warmup: int) -> tuple[float, tuple[float, ...]]:
    """(median step seconds, per-stage held bytes) on the launched processes (collective)."""
    import torch
    import torch.distributed as dist

    from ..runtime.engine import HybridEngine
    from ..runtime.groups import GroupPool
    from ..runtime.model import synthetic_batch
    from .held_memory import HeldMemoryProbe

    engine = HybridEngine(plan, architecture, GroupPool(plan), device)
    probe = HeldMemoryProbe(engine)
    engine.observer = probe
    times = []
    for step in range(warmup + steps):
        batch = synthetic_batch(architecture, plan.global_batch, step, 0)
        probe.reset()
        dist.barrier()
        started = time.perf_counter()
        engine.train_step(batch)
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step >= warmup:
            times.append(float(elapsed))
    held = [None] * dist.get_world_size()
    dist.all_gather_object(held, probe.model_state_bytes + probe.peak_activation_bytes)
    size = plan.num_devices // plan.pp
    per_stage = tuple(float(max(held[stage * size:(stage + 1) * size])) for stage in range(plan.pp))
    return statistics.median(times), per_stage


def run_validate(job_reference: str, plan_paths: list[str], steps: int, warmup: int,
                 say: Callable[[str], None]) -> list[PlanValidation]:
    import os

    import torch.distributed as dist

    from gbmw.models import load_architecture
    from gbmw.plan import Plan
    from gbmw.spec import load_job

    from ..runtime.launch import init_distributed

    if not plan_paths:
        raise GbmwError("--plans: give at least one plan YAML")
    if steps < 1 or warmup < 1:
        raise GbmwError(f"--steps {steps} / --warmup {warmup}: need at least 1 each (warm-up creates Adam's states)")
    job = load_job(job_reference)
    architecture = load_architecture(job.model_path)
    plans = [(path, Plan.load(path)) for path in plan_paths]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for path, plan in plans:
        plan.check_against(job.model, job.cluster.num_devices)
        if plan.num_devices != world:
            raise PlanError(f"{path}: a plan for num_devices={plan.num_devices}, but {world} process(es) were "
                            f"launched; validate the plans of one device count per launch")
    context = init_distributed()
    results = []
    try:
        for path, plan in plans:
            say(f"validate: {Path(path).name} ({warmup} warm-up + {steps} timed steps)")
            predicted_s, predicted_held, extra = predicted_terms(job, plan)
            measured_s, measured_held = measure_plan(plan, architecture, context.device, steps, warmup)
            results.append(PlanValidation(Path(path).stem, predicted_s, measured_s, predicted_held, measured_held,
                                          extra))
    finally:
        dist.destroy_process_group()
    return results


def print_validation(results: list[PlanValidation], console: Any = None) -> dict[str, dict[str, float]]:
    """The table and the error summary; returns the summary."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(highlight=False)
    table = Table(title="predicted vs measured (error = (predicted − measured) / measured)")
    for column in ("plan", "predicted s/iter", "measured s/iter", "time error", "stage",
                   "predicted held MiB", "measured held MiB", "memory error", "backward extra MiB (not held)"):
        table.add_column(column, justify="left" if column in ("plan",) else "right")
    mib = 2**20
    for result in results:
        for stage, (predicted, measured, error, extra) in enumerate(zip(
                result.predicted_held_bytes, result.measured_held_bytes, result.memory_errors,
                result.backward_extra_bytes)):
            head = (result.plan, f"{result.predicted_s:.4f}", f"{result.measured_s:.4f}", f"{result.time_error:+.1%}") \
                if stage == 0 else ("", "", "", "")
            table.add_row(*head, str(stage), f"{predicted / mib:.3f}", f"{measured / mib:.3f}", f"{error:+.2%}",
                          f"{extra / mib:.3f}")
    console.print(table)
    summary = {"time": summarise([result.time_error for result in results]),
               "memory": summarise([error for result in results for error in result.memory_errors])}
    for what, numbers in summary.items():
        console.print(f"{what} error: mean {numbers['mean']:.1%}, median {numbers['median']:.1%}, "
                      f"max {numbers['max']:.1%}")
    return summary
