"""`gbmw validate JOB --plans …`: the estimator against the runtime, plan by plan (paper App.: estimation error).

Run under a launcher with as many processes as the plans' devices. For each plan the runtime trains
`warmup` steps, one step with the held-memory probe attached, then timed steps (without the probe, whose
saved-tensor hooks slow a step) on synthetic batches, every plan's steps interleaved round by round for at
least `steps` rounds and `min_seconds`. Measured are each plan's mean step (each step's slowest rank) over
the fast rounds — the fastest quarter of rounds by the sum of all plans' steps (timing.py says why; the
median step is printed beside it) — and, per pipeline stage, the largest memory a rank of that stage holds (held_memory: model states + stashed activations at
their in-flight peak). Predicted are the estimator's iteration time (Eq. (9)) and
the same two memory terms of that stage; the estimator's backward extra (transient buffers the probe does
not hold) is printed beside them. On a CUDA device, a plan run alone (one plan, or --one-at-a-time) also reports
each stage's torch.cuda.max_memory_allocated over one step beside the estimator's whole peak. Errors are
(predicted − measured) / measured.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gbmw.errors import GbmwError, PlanError

from .timing import fast_mean_s, fast_quarter


@dataclass(frozen=True)
class PlanValidation:
    plan: str
    predicted_s: float
    measured_s: float
    """The mean over the fast rounds (the fastest quarter of the interleaved rounds, timing.py)."""
    predicted_held_bytes: tuple[float, ...]
    """Per stage: model states + stashed activations as the estimator counts them."""
    measured_held_bytes: tuple[float, ...]
    backward_extra_bytes: tuple[float, ...]
    """Per stage: the estimator's transient backward extra (not measured on CPU)."""
    measured_median_s: float = float("nan")
    """The median timed step: above measured_s by what contention on the machine added."""
    predicted_peak_bytes: tuple[float, ...] = ()
    """Per stage: the estimator's peak (states, activations at their peak, the optimizer step's reserve)."""
    device_peak_bytes: tuple[float, ...] = ()
    """Per stage, on a CUDA device: torch.cuda.max_memory_allocated over one step of the plan run alone (the
    largest of the stage's ranks); empty on a CPU, or where plans ran interleaved (their allocations mix)."""

    @property
    def device_peak_errors(self) -> tuple[float, ...]:
        return tuple(relative_error(p, m) for p, m in zip(self.predicted_peak_bytes, self.device_peak_bytes))

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


def predicted_terms(job, plan) -> tuple[float, tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """(iteration s, per-stage states + stash, per-stage backward extra, per-stage peak) from the estimator."""
    from gbmw.cost.estimate import estimate_plan, plan_stage_estimates

    stages = plan_stage_estimates(job, plan)
    held = tuple(stage.model_state_bytes + stage.stashed_activation_bytes for stage in stages)
    extra = tuple(stage.activation_bytes - stage.stashed_activation_bytes for stage in stages)
    peak = tuple(stage.peak_memory_bytes for stage in stages)
    return estimate_plan(job, plan).iteration_time_s, held, extra, peak


class PlanRun:
    """One plan on the launched processes: its engine, a step counter and the timed steps (collective)."""

    def __init__(self, plan, architecture, device: str):
        from ..runtime.engine import HybridEngine
        from ..runtime.groups import GroupPool

        self.plan, self.architecture = plan, architecture
        self.engine = HybridEngine(plan, architecture, GroupPool(plan), device)
        self.steps_run = 0
        self.times: list[float] = []
        self.held_per_stage: tuple[float, ...] = ()
        self.device_peak_per_stage: tuple[float, ...] = ()

    def step(self, timed: bool) -> None:
        """One training step, timed on the slowest rank when `timed`."""
        import torch
        import torch.distributed as dist

        from ..runtime.model import synthetic_batch

        batch = synthetic_batch(self.architecture, self.plan.global_batch, self.steps_run, 0)
        dist.barrier()
        started = time.perf_counter()
        self.engine.train_step(batch)
        device = self.engine.device
        if device.type == "cuda":  # the step's kernels may still run: time them too
            torch.cuda.synchronize(device)
        # on the device: NCCL reduces device tensors only
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        self.steps_run += 1
        if timed:
            self.times.append(float(elapsed))

    def measure_memory(self) -> None:
        """One step with the held-memory probe attached (its saved-tensor hooks slow a step: not timed)."""
        import torch.distributed as dist

        from .held_memory import HeldMemoryProbe

        probe = HeldMemoryProbe(self.engine)
        self.engine.observer = probe
        try:
            self.step(timed=False)
        finally:
            self.engine.observer = None
        held = [None] * dist.get_world_size()
        dist.all_gather_object(held, probe.model_state_bytes + probe.peak_activation_bytes)
        size = self.plan.num_devices // self.plan.pp
        self.held_per_stage = tuple(float(max(held[stage * size:(stage + 1) * size])) for stage in range(self.plan.pp))


    def measure_device_peak(self) -> None:
        """On a CUDA device: one untimed step's torch.cuda.max_memory_allocated, the largest of each stage's ranks
        (nothing on a CPU). Only meaningful with no other plan's engine on the device."""
        import torch
        import torch.distributed as dist

        device = self.engine.device
        if device.type != "cuda":
            return
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        self.step(timed=False)
        peaks = [None] * dist.get_world_size()
        dist.all_gather_object(peaks, torch.cuda.max_memory_allocated(device))
        size = self.plan.num_devices // self.plan.pp
        self.device_peak_per_stage = tuple(float(max(peaks[stage * size:(stage + 1) * size]))
                                           for stage in range(self.plan.pp))


def measure_plans(runs: list[PlanRun], steps: int, warmup: int, min_seconds: float,
                  say: Callable[[str], None] = lambda text: None, alongside: list | None = None) -> list[int]:
    """Warm-up steps and one memory step per plan, then rounds of one timed step of every plan, for at least
    `steps` rounds and `min_seconds` (rank 0's clock, broadcast): interleaving puts every plan through the
    same fast and slow phases of a shared machine (timing.py). `alongside`: more runners (e.g. the model
    profiler) whose run() joins every round. Returns the fast rounds: the fastest quarter by the sum of the
    plans' steps in the round (the same on every rank: step times are the slowest rank's); every plan's time,
    and the profile's, is then the mean over those same rounds."""
    import torch.distributed as dist

    from .model_profiler import run_rounds

    for run in runs:
        for _ in range(warmup):
            run.step(timed=False)
        run.measure_memory()
    if len(runs) == 1:  # alone on the device: its allocator's peak is its own
        runs[0].measure_device_peak()
    rounds = run_rounds([_TimedRound(runs), *(alongside or ())], steps, min_seconds, dist.group.WORLD, say)
    return fast_quarter([sum(run.times[index] for run in runs) for index in range(rounds)])


class _TimedRound:
    """One timed step of every plan: one round's runner for run_rounds."""

    def __init__(self, runs: list[PlanRun]):
        self.runs = runs

    def run(self) -> None:
        for run in self.runs:
            run.step(timed=True)


def run_validate(job_reference: str, plan_paths: list[str], steps: int, warmup: int,
                 say: Callable[[str], None], min_seconds: float = 0.0,
                 one_at_a_time: bool = False, profile_alongside: str | None = None) -> list[PlanValidation]:
    """Predicted and measured terms of every plan. The plans' engines are built together and their steps
    interleaved, unless `one_at_a_time` (for models whose plans do not fit in memory together).
    `profile_alongside`: profile the job's model (`gbmw profile model`'s timers) in the same rounds as the
    plans' steps, write that profile to this new file, and predict from it — the estimator is then judged
    on measurements taken in the same seconds as the runs it predicts, whatever phase the machine is in."""
    import os

    from gbmw.plan import Plan
    from gbmw.specs.jobs import load_job

    from ..runtime.launch import finish_distributed, start_after_checking
    from ..runtime.train import refuse_what_the_runtime_does_not_run

    def read_inputs():
        if not plan_paths:
            raise GbmwError("--plans: give at least one plan YAML")
        if steps < 1 or warmup < 1:
            raise GbmwError(f"--steps {steps} / --warmup {warmup}: need at least 1 each (warm-up creates Adam's "
                            "states)")
        if min_seconds < 0:
            raise GbmwError(f"--min-seconds {min_seconds}: must be 0 or more")
        if profile_alongside and one_at_a_time:
            raise GbmwError("--profile-alongside profiles once alongside all plans; it cannot run --one-at-a-time")
        if profile_alongside and Path(profile_alongside).exists():
            raise GbmwError(f"--profile-alongside {profile_alongside}: exists; gbmw never overwrites a file — "
                            "choose a new name")
        job = load_job(job_reference)
        architecture = job.model.require_architecture("gbmw validate")
        plans = [(path, Plan.load(path)) for path in plan_paths]
        world = int(os.environ.get("WORLD_SIZE", "1"))
        for path, plan in plans:
            plan.check_against(job.model, job.cluster.num_devices, job.precision)
            refuse_what_the_runtime_does_not_run(plan, path)
            if plan.num_devices != world:
                raise PlanError(f"{path}: a plan for num_devices={plan.num_devices}, but {world} process(es) were "
                                f"launched; validate the plans of one device count per launch")
        return job, architecture, plans

    (job, architecture, plans), context = start_after_checking(read_inputs)
    results = []
    completed = False
    try:
        profiler = None
        if profile_alongside:
            import torch

            from .model_profiler import ModelProfiler, tp_pair_for_profiling

            profiler = ModelProfiler(architecture, job.precision, torch.device(context.device), (2, 8),
                                     tp_pair_for_profiling())
            say(f"profiling alongside: {profiler.describe()}")
        batches = [[entry] for entry in plans] if one_at_a_time else [plans]
        for batch in batches:
            names = ", ".join(Path(path).name for path, _ in batch)
            say(f"validate: {names} ({warmup} warm-up steps, 1 memory step, then at least {steps} timed steps"
                f"{' interleaved' if len(batch) > 1 else ''} for at least {min_seconds:g} s)")
            runs = [PlanRun(plan, architecture, context.device) for _, plan in batch]
            fast_rounds = measure_plans(runs, steps, warmup, min_seconds, say, [profiler] if profiler else None)
            if profiler is not None:
                job = _with_profile(job, profiler, profile_alongside, context.rank, say, fast_rounds)
            for (path, plan), run in zip(batch, runs):
                predicted_s, predicted_held, extra, predicted_peak = predicted_terms(job, plan)
                results.append(PlanValidation(Path(path).stem, predicted_s, fast_mean_s(run.times, fast_rounds),
                                              predicted_held, run.held_per_stage, extra, statistics.median(run.times),
                                              predicted_peak, run.device_peak_per_stage))
            del runs
        completed = True
    finally:
        finish_distributed(completed)
    return results


def _with_profile(job, profiler, output: str, rank: int, say: Callable[[str], None], rounds: list[int]):
    """The job with its model replaced by the profile measured alongside, over the fast `rounds` (written by
    rank 0 to `output`)."""
    from gbmw.specs.files import write_new_file

    from .model_profiler import model_spec_yaml

    spec = profiler.spec(f"run alongside gbmw validate's timed steps, means over the same {len(rounds)} fast rounds",
                         chosen=rounds)
    if rank == 0:
        write_new_file(output, model_spec_yaml(spec))
        say(f"wrote {output}: the profile measured alongside; predictions below use it")
    return job.model_copy(update={"model": spec})


def print_validation(results: list[PlanValidation], console: Any = None) -> dict[str, dict[str, float]]:
    """The table and the error summary; returns the summary."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(highlight=False)
    table = Table(title="predicted vs measured (error = (predicted − measured) / measured)")
    for column in ("plan", "predicted s/iter", "measured s/iter (fast rounds)", "time error", "median s/iter", "stage",
                   "predicted held MiB", "measured held MiB", "memory error", "backward extra MiB (not held)"):
        table.add_column(column, justify="left" if column in ("plan",) else "right")
    mib = 2**20
    for result in results:
        for stage, (predicted, measured, error, extra) in enumerate(zip(
                result.predicted_held_bytes, result.measured_held_bytes, result.memory_errors,
                result.backward_extra_bytes)):
            head = (result.plan, f"{result.predicted_s:.4f}", f"{result.measured_s:.4f}", f"{result.time_error:+.1%}",
                    f"{result.measured_median_s:.4f}") if stage == 0 else ("", "", "", "", "")
            table.add_row(*head, str(stage), f"{predicted / mib:.3f}", f"{measured / mib:.3f}", f"{error:+.2%}",
                          f"{extra / mib:.3f}")
    console.print(table)
    summary = {"time": summarise([result.time_error for result in results]),
               "memory": summarise([error for result in results for error in result.memory_errors])}
    measured_on_device = [result for result in results if result.device_peak_bytes]
    if measured_on_device:
        peaks = Table(title="peak memory per stage: estimate vs torch.cuda.max_memory_allocated (one step, plan alone)")
        for column in ("plan", "stage", "estimated peak MiB", "max_memory_allocated MiB", "error"):
            peaks.add_column(column, justify="left" if column == "plan" else "right")
        for result in measured_on_device:
            for stage, (predicted, measured, error) in enumerate(zip(
                    result.predicted_peak_bytes, result.device_peak_bytes, result.device_peak_errors)):
                peaks.add_row(result.plan if stage == 0 else "", str(stage), f"{predicted / mib:.1f}",
                              f"{measured / mib:.1f}", f"{error:+.1%}")
        console.print(peaks)
        summary["device peak"] = summarise([error for result in measured_on_device
                                            for error in result.device_peak_errors])
    for what, numbers in summary.items():
        console.print(f"{what} error: mean {numbers['mean']:.1%}, median {numbers['median']:.1%}, "
                      f"max {numbers['max']:.1%}")
    return summary
