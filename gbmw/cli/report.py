"""Tables for the terminal (rich) and JSON for machines."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from gbmw.cli.trust import trust_line
from gbmw.plan import Estimate, Plan
from gbmw.space.strategy import Strategy
from gbmw.specs.jobs import JobSpec
from gbmw.specs.schema import format_bytes

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
    model = job.model
    active = f", {model.active_parameter_count / 1e9:.2f}B active" if model.is_mixture_of_experts else ""
    console.print(
        f"[bold]{job.name}[/bold]: {model.name} ({model.parameter_count / 1e9:.2f}B parameters{active}, "
        f"{model.num_layers} layers) on {job.cluster.name} ({plan.num_devices} × {job.cluster.device.name}), "
        f"{job.precision}{', bf16 gradients' if plan.gradient_reduce_dtype == 'bf16' else ''}"
        f"{', TP communication overlap' if plan.tp_comm_overlap else ''}, {job.optimizer}"
        f"{' (bf16 moments)' if plan.adam_moments_dtype == 'bf16' else ''}"
    )
    experts = _experts_line(job, plan)
    if experts:
        console.print(experts)
    console.print(
        f"plan: {made_by}; global batch {plan.global_batch} = {plan.num_micro_batches} micro-batches × "
        f"{plan.micro_batch}; pp {plan.pp}, partition {list(plan.partition)}"
        + (f", interleaved 1F1B with {plan.virtual_stages} chunks per device" if plan.virtual_stages > 1 else "")
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
            format_bytes(estimate.stage_model_state_bytes[index]), format_bytes(estimate.stage_activation_bytes[index]),
            f"[{style}]{format_bytes(peak)}[/{style}]" if style else format_bytes(peak), f"{share:.0%}",
        )
    console.print(table)
    verdict = "[green]fits[/green]" if estimate.fits else "[red]does NOT fit[/red]"
    console.print(f"memory: {verdict} in {format_bytes(estimate.memory_budget_bytes)} per device")
    near = near_budget_note(estimate)
    if near:
        console.print(near)
    console.print(
        f"iteration {estimate.iteration_time_s:.3f} s · {estimate.samples_per_s:.2f} samples/s · "
        f"{estimate.model_tflops_per_device:.1f} model TFLOP/s per device (MFU {estimate.mfu:.1%})"
    )
    console.print(trust_line(plan, job), highlight=False)


LARGEST_PEAK_UNDER_ESTIMATE = 0.025
"""The most the estimator's peak memory has been under what the runtime allocates (below)."""
NEAR_BUDGET_SHARE = 0.95
"""A fitting stage above this share of the budget is flagged: the estimator's peak memory has been up to 2.5 % under
what the runtime allocates (docs/cost-model.md, benchmarks/memory_at_scale.py; one H100, docs/gpu-measurements.md:
0.7 to 2.4 % over)."""


def near_budget_note(estimate: Estimate) -> str | None:
    """One line when a plan that fits has a stage above NEAR_BUDGET_SHARE of the memory budget, else None."""
    shares = [peak / estimate.memory_budget_bytes for peak in estimate.stage_peak_memory_bytes]
    fullest = max(range(len(shares)), key=shares.__getitem__)
    if not estimate.fits or shares[fullest] <= NEAR_BUDGET_SHARE:
        return None
    return (f"[yellow]memory: stage {fullest} is at {shares[fullest]:.1%} of the budget — peak-memory estimates have "
            f"been up to {LARGEST_PEAK_UNDER_ESTIMATE:.1%} under what runs, so it may not fit; --memory below the "
            "device's leaves a margin[/yellow]")


def _experts_line(job: JobSpec, plan: Plan) -> str | None:
    """What a mixture-of-experts estimate assumes of the routing (gbmw.cost.expert_parallel), in one line."""
    moe_layers = [(layer, strategy) for layer, strategy in zip(job.model.layers, plan.strategies) if layer.num_experts]
    if not moe_layers:
        return None
    layer = moe_layers[0][0]
    degrees = sorted({strategy.ep for _, strategy in moe_layers})
    moe = getattr(job.model.architecture, "moe", None)
    routing = (f"capacity factor {moe.capacity_factor:g} (padded)" if moe is not None and moe.capacity_factor else
               f"dropless, ASSUMED load imbalance {layer.expert_load_factor:.2f} (the busiest EP rank's routed tokens "
               "over the mean; set moe.load_imbalance in the model)")
    return (f"experts: {len(moe_layers)} MoE blocks × {layer.num_experts} experts, top-{layer.experts_per_token}, "
            f"EP {' / '.join(map(str, degrees))}; {routing}")


def estimate_to_json(job: JobSpec, plan: Plan, estimate: Estimate) -> dict[str, Any]:
    return {
        "job": job.name,
        **{key: list(value) if isinstance(value, tuple) else value for key, value in asdict(estimate).items()},
        "plan": plan.to_dict(),
    }


# ----------------------------------------------------------------------------------------------
# Plans and comparisons
# ----------------------------------------------------------------------------------------------


def print_plan(job: JobSpec, plan: Plan) -> None:
    print_estimate(job, plan, plan.estimate)
    provenance = plan.provenance
    if "search_s" in provenance:
        _console().print(
            f"search ({provenance.get('search_space')}, target {plan.target}, {plan.schedule}): "
            f"{provenance['settings_searched']} of {provenance['settings_total']} settings, "
            f"{provenance['partitions_searched']} partitions, {provenance['search_s']:.2f} s"
        )


def plan_to_json(job: JobSpec, plan: Plan) -> dict[str, Any]:
    data = plan.to_dict()
    data["search_s"] = plan.provenance.get("search_s")
    data["job"] = job.name
    return data


def print_comparison(rows, job: JobSpec) -> None:
    table = Table(title="samples/s (global batch); OOM: no plan fits")
    table.add_column("strategy")
    for cell in rows[0].cells:
        table.add_column(f"{cell.budget_bytes / GIB:.0f} GiB", justify="right")
    previous_kind = None
    for row in rows:
        if previous_kind is not None and row.kind != previous_kind:
            table.add_section()
        previous_kind = row.kind
        values = []
        for cell in row.cells:
            if cell.refusal is not None:
                values.append("refused")
            elif cell.plan is None:
                values.append("OOM")
            else:
                values.append(f"{cell.plan.estimate.samples_per_s:.2f} ({cell.plan.global_batch})")
        table.add_row(row.label, *values)
    console = _console()
    console.print(table)
    refused: dict[str, list[str]] = {}  # why a target cannot run the job's settings: the rows it refuses
    for row in rows:
        if row.cells and row.cells[0].refusal is not None:
            refused.setdefault(row.cells[0].refusal, []).append(row.name)
    for refusal, names in refused.items():
        console.print(f"refused ({', '.join(names)}): {refusal}", highlight=False)
    for row in rows:  # how far the best plan of each target can be trusted, at the first budget
        plan = row.cells[0].plan
        if row.kind == "target" and plan is not None:
            console.print(f"{row.name}: {trust_line(plan, job)}", highlight=False)


def comparison_to_json(rows) -> list[dict[str, Any]]:
    result = []
    for row in rows:
        for cell in row.cells:
            entry = {"kind": row.kind, "name": row.name, "label": row.label, "memory_budget_bytes": cell.budget_bytes}
            if cell.refusal is not None:
                entry["refused"] = cell.refusal
            elif cell.plan is None:
                entry["oom"] = True
            else:
                entry.update(oom=False, samples_per_s=cell.plan.estimate.samples_per_s,
                             global_batch=cell.plan.global_batch, pp=cell.plan.pp, mfu=cell.plan.estimate.mfu)
            result.append(entry)
    return result


def draw_plan(job: JobSpec, plan: Plan, path: str) -> None:
    """Per-stage memory (model states + activations vs the budget) and time bars, and the strategy
    of every layer as a coloured strip; written to a new PNG file (never overwritten)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from gbmw.specs.files import write_new_file_bytes

    estimate = plan.estimate
    stages = range(plan.pp)
    figure = plt.figure(figsize=(12, 6.5), constrained_layout=True)
    grid = figure.add_gridspec(2, 2, height_ratios=[3, 2])
    memory_axis, time_axis = figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])
    strip_axis = figure.add_subplot(grid[1, :])

    states = [value / GIB for value in estimate.stage_model_state_bytes]
    activations = [value / GIB for value in estimate.stage_activation_bytes]
    memory_axis.bar(stages, states, label="model states", color="#4c72b0")
    memory_axis.bar(stages, activations, bottom=states, label="activations", color="#dd8452")
    memory_axis.axhline(estimate.memory_budget_bytes / GIB, color="black", linestyle="--", label="budget")
    memory_axis.set(xlabel="pipeline stage", ylabel="peak memory per device (GiB)", title="Memory per stage",
                    xticks=list(stages))
    memory_axis.legend(loc="lower right")

    time_axis.bar(stages, [value * 1e3 for value in estimate.stage_time_s], color="#55a868")
    time_axis.set(xlabel="pipeline stage", ylabel="ms per micro-batch", title="Time per stage", xticks=list(stages))

    names = list(dict.fromkeys(strategy.name for strategy in plan.strategies))
    colours = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    for index, strategy in enumerate(plan.strategies):
        strip_axis.add_patch(plt.Rectangle((index, 0), 1, 1, color=colours(names.index(strategy.name) % 20)))
    for first, _ in plan.stage_bounds[1:]:
        strip_axis.axvline(first, color="black", linewidth=2)
    strip_axis.set(xlim=(0, len(plan.strategies)), ylim=(0, 1), yticks=[], xlabel="layer",
                   title="Strategy of every layer (black lines: stage boundaries)")
    strip_axis.legend(handles=[Patch(color=colours(i % 20), label=name) for i, name in enumerate(names)],
                      loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=min(len(names), 6), frameon=False)
    figure.suptitle(
        f"{job.model.name} on {plan.num_devices} × {job.cluster.device.name}: {estimate.samples_per_s:.2f} samples/s, "
        f"batch {plan.global_batch} = {plan.num_micro_batches} × {plan.micro_batch}, pp {plan.pp}"
    )
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    write_new_file_bytes(path, buffer.getvalue())


def handtuned_rows(comparison) -> list[dict[str, Any]]:
    """One dict per row: label, samples/s, speed-up over the hand-tuned config, MFU, batch, pp, per-stage GiB."""
    base = comparison.rows[0][1]
    base_speed = base.estimate.samples_per_s if base is not None and base.estimate.fits else None
    rows = []
    for label, plan, why in comparison.rows:
        if plan is None:
            rows.append({"label": label, "fits": False, "why": why})
            continue
        estimate = plan.estimate
        rows.append({
            "label": label, "fits": estimate.fits, "samples_per_s": estimate.samples_per_s,
            "speedup": estimate.samples_per_s / base_speed if base_speed else None, "mfu": estimate.mfu,
            "global_batch": plan.global_batch, "micro_batches": plan.num_micro_batches, "pp": plan.pp,
            "strategies": ", ".join(f"{s.name} ×{c}" for _, c, s in _merged_runs(plan)),
            "stage_peak_gib": [round(m / GIB, 1) for m in estimate.stage_peak_memory_bytes],
        })
    return rows


def _merged_runs(plan: Plan):
    runs = []
    for first, count, strategy in plan.runs():
        if runs and runs[-1][2] == strategy:
            runs[-1] = (runs[-1][0], runs[-1][1] + count, strategy)
        else:
            runs.append((first, count, strategy))
    return runs


def print_handtuned(comparison) -> None:
    job, handtuned = comparison.job, comparison.handtuned
    console = _console()
    console.print(f"[bold]{job.name}[/bold] vs hand-tuned [bold]{handtuned.name}[/bold]: {handtuned.description}")
    console.print(f"source: {handtuned.source}")
    table = Table()
    for column in ("configuration", "samples/s", "vs hand-tuned", "MFU", "batch", "pp", "per-stage peak GiB",
                   "strategies"):
        table.add_column(column, justify="left" if column in ("configuration", "strategies") else "right")
    for row in handtuned_rows(comparison):
        if "samples_per_s" not in row:
            table.add_row(row["label"], "—", "", "", "", "", "", row["why"][:80])
            continue
        table.add_row(
            row["label"], f"{row['samples_per_s']:.2f}" + ("" if row["fits"] else " (OOM)"),
            f"{row['speedup']:.2f}×" if row["speedup"] else "", f"{row['mfu']:.1%}", str(row["global_batch"]),
            str(row["pp"]), " ".join(str(m) for m in row["stage_peak_gib"]), row["strategies"],
        )
    console.print(table)


def print_tune(result) -> None:
    console = _console()
    job, plan = result.job, result.plan
    console.print(f"[bold]{job.name}[/bold]: {job.model.name} on {job.cluster.num_devices} × {job.cluster.device.name}, "
                  f"{job.precision}, global batch {plan.global_batch}, target {plan.target}")
    if result.current is not None:
        current = result.current
        verdict = "fits" if current.estimate.fits else "does NOT fit"
        console.print(f"current: {current.provenance.get('config')} — {current.estimate.samples_per_s:.2f} samples/s, "
                      f"MFU {current.estimate.mfu:.1%}, peak {max(current.estimate.stage_peak_memory_bytes) / GIB:.1f} GiB "
                      f"({verdict} in {current.estimate.memory_budget_bytes / GIB:.1f} GiB)")
    else:
        console.print(f"current: cannot be costed — {result.current_problem}")
    runs = ", ".join(f"{s.name} ×{c}" for _, c, s in _merged_runs(plan))
    console.print(f"gbmw:    pp {plan.pp} partition {list(plan.partition)}, {runs}, micro-batch {plan.micro_batch} × "
                  f"{plan.num_micro_batches} — {plan.estimate.samples_per_s:.2f} samples/s, MFU {plan.estimate.mfu:.1%}, "
                  f"peak {max(plan.estimate.stage_peak_memory_bytes) / GIB:.1f} GiB")
    if result.speedup is not None:
        console.print(f"estimated speed-up: {result.speedup:.2f}× (same estimator, same global batch)")
    if result.changes:
        console.print("ds_config changes:")
        for line in result.changes:
            console.print(f"  {line}")
    if result.trainer_arguments:
        console.print("HF Trainer: the config's batch and precision are now the plan's, which HF checks against "
                      "TrainingArguments; pass " + " ".join(result.trainer_arguments))
    if result.megatron_args:
        console.print("Megatron arguments: " + " ".join(result.megatron_args))
    if result.launch:
        console.print(f"launch: {result.launch}")
    for path in result.written:
        console.print(f"wrote {path}")
