"""Tables for the terminal (rich) and JSON for machines."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from gbmw.plan import Estimate, Plan
from gbmw.spec import JobSpec
from gbmw.space import Strategy

GIB = 2**30


def _console() -> Console:
    """A console that keeps tables readable when the output is a pipe or a file (120 columns)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=120)
    return console


def print_space(devices: int, space: dict[int, list[Strategy]], pruned: bool) -> None:
    table = Table(title=f"Strategy candidates for {devices} devices" + (" (Takeaway #3 applied)" if pruned else ""))
    table.add_column("pp", justify="right")
    table.add_column("devices per stage", justify="right")
    table.add_column("candidates", justify="right")
    table.add_column("strategies (each also with +ckpt)")
    for pp, strategies in space.items():
        names = [s.name for s in strategies if not s.ckpt]
        table.add_row(str(pp), str(devices // pp), str(len(strategies)), ", ".join(names))
    console = _console()
    console.print(table)
    console.print(f"total: {sum(len(s) for s in space.values())}")


def print_estimate(job: JobSpec, plan: Plan, estimate: Estimate) -> None:
    console = _console()
    made_by = plan.provenance.get("config") or plan.provenance.get("made_by") or plan.target
    console.print(
        f"[bold]{job.name}[/bold]: {job.model.name} ({job.model.parameter_count / 1e9:.2f}B parameters, "
        f"{job.model.num_layers} layers) on {job.cluster.name} ({plan.num_devices} × {job.cluster.device.name}), "
        f"{job.precision}, {job.optimizer}"
    )
    console.print(
        f"plan: {made_by}; global batch {plan.global_batch} = {plan.num_micro_batches} micro-batches × "
        f"{plan.micro_batch}; pp {plan.pp}, partition {list(plan.partition)}"
    )
    table = Table()
    for column, justify in (("stage", "right"), ("layers", "left"), ("strategies (× consecutive layers)", "left"),
                            ("time/micro-batch", "right"), ("model states", "right"), ("activations", "right"),
                            ("peak memory", "right"), ("of budget", "right")):
        table.add_column(column, justify=justify)
    for index, (first, end) in enumerate(plan.stage_bounds):
        runs = [f"{strategy.name} ×{count}" for start, count, strategy in plan.runs() if first <= start < end]
        peak = estimate.stage_peak_memory_bytes[index]
        share = peak / estimate.memory_budget_bytes
        style = "red" if share > 1 else ""
        table.add_row(
            str(index), f"{first}–{end - 1}", "\n".join(runs), f"{estimate.stage_time_s[index] * 1e3:.1f} ms",
            f"{estimate.stage_model_state_bytes[index] / GIB:.2f} GiB", f"{estimate.stage_activation_bytes[index] / GIB:.2f} GiB",
            f"[{style}]{peak / GIB:.2f} GiB[/{style}]" if style else f"{peak / GIB:.2f} GiB", f"{share:.0%}",
        )
    console.print(table)
    verdict = "[green]fits[/green]" if estimate.fits else "[red]does NOT fit[/red]"
    console.print(f"memory: {verdict} in {estimate.memory_budget_bytes / GIB:.2f} GiB per device")
    console.print(
        f"iteration {estimate.iteration_time_s:.3f} s · {estimate.samples_per_s:.2f} samples/s · "
        f"{estimate.model_tflops_per_device:.1f} model TFLOP/s per device (MFU {estimate.mfu:.1%})"
    )


def estimate_to_json(job: JobSpec, plan: Plan, estimate: Estimate) -> dict[str, Any]:
    return {
        "job": job.name,
        **{key: list(value) if isinstance(value, tuple) else value for key, value in asdict(estimate).items()},
        "plan": plan.to_dict(),
    }
