"""gbmw's estimates of the paper's Table 3 against the throughput the paper measured: rank agreement and OOM agreement.

    .venv/bin/python benchmarks/paper_table3.py              # 8 models x 4 budgets x 11 strategies (~1-2 min)

For each model and memory budget of Table 3 (8 x TITAN RTX, fp32, Adam; benchmarks/paper_table3.yaml) every row —
the four pure parallelisms, DeepSpeed 3D and the Galvatron variants — is searched in its own space by gbmw's
planner at its best batch on the paper's batch grid (multiples of 8: PAPER_BATCH_STEP), on the bundled rtx-titan-x8
cluster, as the paper ran them (the torch-Pipe rows as its scripts did: benchmarks/paper_pipeline_runs.py): without gradient accumulation when there is no pipeline (the table's pp = 1 rows report the largest batch
that fits as their best, e.g. PyTorch DDP on BERT-Huge-32 at 16 GB: batch 8, where accumulating micro-batches
would only have been faster). Per column (a model at a budget) it prints the Spearman rank correlation between
gbmw's estimated samples/s and the paper's measured samples/s over the rows both call fitting, and over all cells
whether gbmw and the paper agree on OOM. Two diagnostics follow: the mean Spearman with each row left out (which
rows the rank order disagrees on), and each model's activation memory per sample (gbmw's, stashed by every layer
without TP or recomputation) beside the paper's Table 2 measurement.

The models are costed as the paper's testbed ran them, not as gbmw's runtime would (which calls fused SDPA and
keeps no s×s scores): standard attention that stashes the softmax output, the dropout mask and output, and the
raw scores QKᵀ as well (`attention: standard-with-raw-scores`, gbmw.specs.transformer_layers.block_layer). That last
tensor is what the paper's Table 2 shows: per layer its activation sizes grow by gbmw's accounting plus exactly one
score tensor per attention (the diagnostic line prints the totals). Table 2's "MB" are MiB (2^20 bytes), as torch
reports memory; read as 10^6 bytes, ViT-Huge's per-layer growth would not match any whole set of tensors.
Targets (issue 12): mean per-column Spearman ≥ 0.9 with every row searched at the batch the paper measured it at
(the last lines; estimated and measured time of the same workload, as benchmarks/published_runs.py compares), OOM
agreement ≥ 90 % over the batch sweep. The Spearman at gbmw's own best batch is printed too: there the rows may
take batches up to MAX_GLOBAL_BATCH that the paper never measured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from functools import partial
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gbmw.plan import Plan
from gbmw.search.nothing_fits import NothingFitsError
from gbmw.search.planner import Planner
from gbmw.space.spaces import search_space
from gbmw.specs.bundled import resolve_recipe
from gbmw.specs.cluster_spec import load_cluster
from gbmw.specs.jobs import JobSpec
from gbmw.specs.model_spec import ModelSpec
from gbmw.specs.models import build_model, load_model
from gbmw.specs.schema import parse_bytes
from paper_pipeline_runs import (GPIPE_ROW, SEARCHED_PIPE_ROWS, as_script_ran, script_gpipe_best,
                                 searched_micro_batch_count)

DATA = Path(__file__).with_name("paper_table3.yaml")
PAPER_BATCH_STEP = 8
"""The batches the paper's sweep tried: 302 of Table 3's 305 measured batches are multiples of 8 (the other three,
Swin-Huge Galvatron variants at 292–436, are multiples of 4), and every row's smallest is 8 — an OOM cell is one where
batch 8 did not fit (BERT-Huge-32's GPipe: OOM at 8 GiB, batch 8 at 12 GiB)."""
ROW_VARIANTS = {
    "PyTorch DDP (DP)": "ddp", "Megatron (TP)": "megatron-tp", "PyTorch GPipe (PP)": "gpipe",
    "FSDP/ZeRO-3 (SDP)": "fsdp", "DeepSpeed 3D": "deepspeed-3d", "Galvatron (DP+TP)": "dp+tp",
    "Galvatron (DP+PP)": "dp+pp", "Galvatron": "galvatron", "Galvatron-Base": "base",
    "Galvatron (1F1B+Bi-obj)": "1f1b+bi-obj", "Galvatron-BMW": "bmw",
}
SPEARMAN_TARGET, OOM_TARGET = 0.9, 0.9
DEEPSPEED_3D_ROW = "DeepSpeed 3D"
DEEPSPEED_3D_COUNTS = (4, 2, 1)
"""Micro-batches per iteration the paper's DeepSpeed 3D runs (2-way DP × 2-way TP × 2-way PP) may have used: the
count is not published, its batches grow with the budget (ViT-Huge-32: 40, 80, 128, 168 at 8–20 GiB; BERT-Huge-32: 8,
8, 16, 16), as they do when the count is fixed and the micro-batch grows — with free gradient accumulation DeepSpeed's
pipeline reaches any batch at 8 GiB (gbmw's sweep: 1536) — and every one of them is a multiple of 2 · 4, so a fixed
count of 4, 2 or 1 fits them all. The benchmark searches the row at each and keeps the most accumulation the paper's
own batches do not refute (`unrefuted_count`); the others are printed beside it."""
MAX_GLOBAL_BATCH = 1536  # above every batch of the table (the largest is 1232)
CUDA_CONTEXT_BYTES = 781 * 2**20
"""What of each budget the model cannot use: the paper's budgets count the process's whole device memory — its
artifact's memory model (anonymous-cs-system/Galvatron @2a09c265, utils/cost_model.py `MemoryCostModel`, its default
`pytorch_context_mem=1024` MB, which `<model>/search_layerwise_hp.py` keeps) charges a PyTorch context against every
budget it searches (8, 12, 16, 20 × 1024 MB). gbmw charges the context as measured: 781 MB in use right after PyTorch's
CUDA initialisation (pytorch/pytorch issue #34323, the figure the rtx-titan-x8 recipe cites). With the artifact's
1024 MB instead: OOM agreement 95.5 %, Spearman at the best batch 0.903 (2026-12-02)."""


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing the mean of their ranks (Spearman's convention)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the average ranks."""
    return float(np.corrcoef(average_ranks(np.asarray(a)), average_ranks(np.asarray(b)))[0, 1])


def testbed_model(model_name: str) -> ModelSpec:
    """The model as the paper's testbed ran it: standard attention that also stashes the raw scores."""
    model = load_model(resolve_recipe(model_name.lower(), "models"), "fp32")
    return build_model(model.architecture.model_copy(update={"attention": "standard-with-raw-scores"}), "fp32")


def job_for(model_name: str, budget: str) -> JobSpec:
    model = testbed_model(model_name)
    cluster = load_cluster(resolve_recipe("rtx-titan-x8", "clusters"))
    budget_bytes = parse_bytes(budget, "budget") - CUDA_CONTEXT_BYTES
    return JobSpec(name=f"{model_name}@{budget}", model=model, cluster=cluster, precision="fp32", optimizer="adam",
                   max_global_batch=MAX_GLOBAL_BATCH, memory_budget_bytes=budget_bytes)


def estimated_plan(job: JobSpec, variant: str, batch: int | None = None, count_rule=None,
                   batch_step: int = 1) -> Plan | None:
    """gbmw's best plan for the row at its best batch among the multiples of `batch_step`, or at `batch` (None: nothing
    fits); `count_rule`: the micro-batch count per pipeline degree (Planner.micro_batch_count_rule)."""
    try:
        return Planner(job, variant, batch, batch is None, accumulate=False, explain_failure=False,
                       attention_as_declared=True, micro_batch_count_rule=count_rule, batch_multiple=batch_step).run()
    except NothingFitsError:
        return None


def count_rule(job: JobSpec, model_name: str, label: str, deepspeed_3d_count: int = DEEPSPEED_3D_COUNTS[0]):
    """The micro-batch count a row ran with (Planner.micro_batch_count_rule), where the paper fixed one: the searched
    count of the Galvatron rows its torch Pipe ran, DeepSpeed 3D's fixed count; None: the counts gbmw searches."""
    if label in SEARCHED_PIPE_ROWS:
        return partial(searched_micro_batch_count, model_name, job.cluster.num_devices)
    if label == DEEPSPEED_3D_ROW:
        return lambda _batch, _pp: deepspeed_3d_count
    return None


def count_not_searched(label: str, variant: str) -> bool:
    """The row runs a count it does not choose — one micro-batch (no pipeline), or its script's — so, as in the paper's
    sweep, only memory bounds its batch: its best batches are the yardstick of gbmw's memory against the paper's."""
    return (label in SEARCHED_PIPE_ROWS or label == GPIPE_ROW
            or search_space(variant).pipeline_degrees(load_cluster(resolve_recipe("rtx-titan-x8", "clusters")),
                                                      None) == [1])


def best_as_the_paper_ran(job: JobSpec, model_name: str, label: str, variant: str,
                          deepspeed_3d_count: int = DEEPSPEED_3D_COUNTS[0]) -> tuple[float, int] | None:
    """(gbmw's samples/s, global batch) of the row's best plan over the batch sweep (None: nothing fits), the rows the
    paper ran with torch's Pipe as its scripts ran them (benchmarks/paper_pipeline_runs.py): the GPipe row without
    recomputation at the script's micro-batch count, the Galvatron rows with one count per batch and pipeline degree."""
    if label == GPIPE_ROW:
        return script_gpipe_best(job, model_name, PAPER_BATCH_STEP)
    plan = estimated_plan(job, variant, None, count_rule(job, model_name, label, deepspeed_3d_count), PAPER_BATCH_STEP)
    return None if plan is None else (plan.estimate.samples_per_s, plan.global_batch)


def batches_above(data: dict, best: dict, labels) -> tuple[int, int, float]:
    """Over the cells of `labels` that both the paper and gbmw fit ({(budget, model, row): (samples/s, batch) or
    None}): in how many gbmw's best batch is above the paper's, of how many, and the geometric mean of the ratio."""
    ratios = [best[budget, model, label][1] / rows[label][column][1]
              for budget, rows in data["budgets"].items() for column, model in enumerate(data["models"])
              for label in labels if rows[label][column] is not None and best[budget, model, label] is not None]
    return sum(ratio > 1 for ratio in ratios), len(ratios), statistics.geometric_mean(ratios)


def unrefuted_count(data: dict, by_count: dict[int, dict]) -> int:
    """DeepSpeed 3D's micro-batch count: the most accumulation at which gbmw's best batch is not above the paper's in
    every cell. At a fixed count the largest micro-batch that fits is the fastest, so with the count the paper ran and
    memory as gbmw estimates it, the paper's sweep (multiples of 8 until out of memory) would have found a larger batch
    wherever gbmw's best is larger: above in every cell, the count contradicts the table. (1F1B's first stage holds
    min(pp, m) micro-batches of B / (dp · m) samples: at pp = 2, counts 1 and 2 hold the same, count 4 half.) Where
    every count is refuted, the least accumulation, whose batches come nearest the paper's."""
    for count in DEEPSPEED_3D_COUNTS:
        above, cells, _ = batches_above(data, by_count[count], [DEEPSPEED_3D_ROW])
        if above < cells:
            return count
    return DEEPSPEED_3D_COUNTS[-1]


def leave_one_row_out(pairs: dict, left_out: str) -> float:
    """The mean per-column Spearman over the columns that keep at least 3 rows without `left_out`."""
    correlations = []
    for rows in pairs.values():
        kept = [(estimated, measured) for label, estimated, measured in rows if label != left_out]
        if len(kept) >= 3:
            correlations.append(spearman([e for e, _ in kept], [m for _, m in kept]))
    return statistics.mean(correlations)


def activation_sizes(models: list[str], paper_mb: list[float]) -> list[tuple[str, float, float]]:
    """(model, gbmw's stashed activations of one sample in MiB, the paper's Table 2 figure in MiB)."""
    sizes = []
    for model_name, paper in zip(models, paper_mb):
        model = testbed_model(model_name)
        sizes.append((model_name, sum(layer.stashed_activation_bytes_per_sample for layer in model.layers) / 2**20,
                      paper))
    return sizes


def at_paper_batch(data: dict, progress: Progress,
                   deepspeed_3d_count: int) -> tuple[float, dict[str, list[float]], list[str], list[float]]:
    """Every row searched at the batch the paper measured it at: (the mean per-column Spearman over the rows that
    fit, {row: estimated / measured samples/s per cell}, the cells where nothing fits at that batch, and the PyTorch
    GPipe row's ratios at gbmw's own micro-batch count with recomputation). Unlike the best-batch comparison, this
    compares time for the same workload, as benchmarks/published_runs.py does; the rows the paper ran with torch's
    Pipe run its scripts' micro-batch counts (benchmarks/paper_pipeline_runs.py): the GPipe row's plan costed without
    recomputation, the Galvatron rows searched with one count per pipeline degree."""
    correlations, ratios, too_big, gpipe_as_searched = [], {label: [] for label in ROW_VARIANTS}, [], []
    task = progress.add_task("at the paper's batches", total=len(data["budgets"]) * len(data["models"]))
    for budget, rows in data["budgets"].items():
        for column, model in enumerate(data["models"]):
            job, estimated, measured = job_for(model, budget), [], []
            for label, variant in ROW_VARIANTS.items():
                published = rows[label][column]
                if published is None:
                    continue
                plan = estimated_plan(job, variant, published[1], count_rule(job, model, label, deepspeed_3d_count))
                if plan is None:
                    too_big.append(f"{model} {budget} {label} at batch {published[1]}")
                    continue
                estimate = plan.estimate.samples_per_s
                if label == GPIPE_ROW:
                    gpipe_as_searched.append(estimate / published[0])
                    estimate, _ = as_script_ran(job, plan, model)
                estimated.append(estimate)
                measured.append(published[0])
                ratios[label].append(estimate / published[0])
            if len(measured) >= 3:
                correlations.append(spearman(estimated, measured))
            progress.advance(task)
    return statistics.mean(correlations), ratios, too_big, gpipe_as_searched


def summarise(data: dict, cells: dict) -> tuple[list[str], list[float], dict, int, list[str]]:
    """From {(budget, model, row): estimated samples/s or None}: per budget the table's cells, the per-column Spearman
    values, {column: [(row, estimated, measured)]}, the cells that agree on OOM, and the disagreements."""
    lines, correlations, pairs, agreements, disagreements = [], [], {}, 0, []
    for budget, rows in data["budgets"].items():
        line = [budget]
        for column, model in enumerate(data["models"]):
            measured, estimated = [], []
            for label in ROW_VARIANTS:
                published, estimate = rows[label][column], cells[budget, model, label]
                if (published is None) == (estimate is None):
                    agreements += 1
                else:
                    disagreements.append(f"{model} {budget} {label}: paper "
                                         f"{'OOM' if published is None else published[0]}, gbmw "
                                         f"{'OOM' if estimate is None else f'{estimate:.2f}'}")
                if published is not None and estimate is not None:
                    measured.append(published[0])
                    estimated.append(estimate)
                    pairs.setdefault((budget, model), []).append((label, estimate, published[0]))
            if len(measured) >= 3:
                correlations.append(spearman(estimated, measured))
                line.append(f"{correlations[-1]:.2f} ({len(measured)})")
            else:
                line.append(f"– ({len(measured)})")
        lines.append(line)
    return lines, correlations, pairs, agreements, disagreements


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    data = yaml.safe_load(DATA.read_text())
    models, budgets = data["models"], data["budgets"]
    console = Console(highlight=False, width=160)
    table = Table(title="Table 3: Spearman(estimated, measured samples/s) per column, and OOM agreement")
    table.add_column("budget")
    for model in models:
        table.add_column(model, justify="right")
    best, by_count = {}, {count: {} for count in DEEPSPEED_3D_COUNTS}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("searching", total=len(budgets) * len(models) * (len(ROW_VARIANTS) + 2))
        for budget in budgets:
            for model in models:
                job = job_for(model, budget)
                for label, variant in ROW_VARIANTS.items():
                    if label != DEEPSPEED_3D_ROW:
                        best[budget, model, label] = best_as_the_paper_ran(job, model, label, variant)
                        progress.advance(task)
                for count in DEEPSPEED_3D_COUNTS:
                    by_count[count][budget, model, DEEPSPEED_3D_ROW] = best_as_the_paper_ran(
                        job, model, DEEPSPEED_3D_ROW, ROW_VARIANTS[DEEPSPEED_3D_ROW], count)
                    progress.advance(task)
    count = unrefuted_count(data, by_count)
    best.update(by_count[count])
    estimates = {key: None if value is None else value[0] for key, value in best.items()}
    lines, correlations, pairs, agreements, disagreements = summarise(data, estimates)
    cells = len(estimates)
    for line in lines:
        table.add_row(*line)
    console.print(table)
    mean = statistics.mean(correlations)
    agreement = agreements / cells
    console.print(f"at gbmw's best batch: mean per-column Spearman {mean:.3f} over {len(correlations)} columns (rows "
                  "may run batches the paper did not; the target is checked at the paper's batch below); "
                  f"OOM agreement {agreement:.1%} of {cells} cells (target ≥ {OOM_TARGET:.0%})")
    yardstick = [label for label, variant in ROW_VARIANTS.items() if count_not_searched(label, variant)]
    above, compared, ratio = batches_above(data, best, yardstick)
    console.print(f"{DEEPSPEED_3D_ROW} searched at {count} micro-batch{'es' * (count > 1)} per iteration "
                  "(`unrefuted_count`: the most accumulation at which gbmw's best batch is not above the paper's in "
                  "every cell); its best batch against the paper's, above in / geometric mean: " + ", ".join(
                      "at {}: {} of {}, {:.2f}×".format(other, *batches_above(data, by_count[other], [DEEPSPEED_3D_ROW]))
                      for other in DEEPSPEED_3D_COUNTS)
                  + f"; the rows whose count is not searched ({', '.join(yardstick)}): {above} of {compared}, "
                  f"{ratio:.2f}×")
    for other in DEEPSPEED_3D_COUNTS:
        if other == count:
            continue
        varied = dict(estimates)
        varied.update({key: None if value is None else value[0] for key, value in by_count[other].items()})
        _, varied_correlations, _, varied_agreements, _ = summarise(data, varied)
        console.print(f"  with {DEEPSPEED_3D_ROW} at {other} micro-batch{'es' * (other > 1)} per iteration (not "
                      f"{count}): "
                      f"mean per-column Spearman {statistics.mean(varied_correlations):.3f}, OOM agreement "
                      f"{varied_agreements / cells:.1%}")
    console.print(f"OOM disagreements ({len(disagreements)}):")
    for line in disagreements:
        console.print(f"  {line}")
    console.print("mean per-column Spearman without one row: " + ", ".join(
        f"{label} {leave_one_row_out(pairs, label):.3f}" for label in ROW_VARIANTS))
    console.print("activation memory per sample, gbmw vs the paper's Table 2: " + ", ".join(
        f"{model} {gbmw_mb:.0f} vs {paper_mb:.0f} MiB ({gbmw_mb / paper_mb - 1:+.1%})"
        for model, gbmw_mb, paper_mb in activation_sizes(models, data["activation_mb_per_sample"])))
    with Progress(console=console, transient=True) as progress:
        same_batch_mean, ratios, too_big, gpipe_as_searched = at_paper_batch(data, progress, count)
    console.print(f"at the paper's own batch per cell: mean per-column Spearman {same_batch_mean:.3f} (target ≥ "
                  f"{SPEARMAN_TARGET}); estimated / "
                  "measured samples/s per row (geometric mean, min–max): " + ", ".join(
                      f"{label} {statistics.geometric_mean(values):.2f} ({min(values):.2f}–{max(values):.2f})"
                      for label, values in ratios.items() if values))
    console.print(f"{GPIPE_ROW} at gbmw's own micro-batch count, recomputing every block (not as the paper's script "
                  f"ran it): {statistics.geometric_mean(gpipe_as_searched):.2f} "
                  f"({min(gpipe_as_searched):.2f}–{max(gpipe_as_searched):.2f})")
    console.print(f"nothing fits at the paper's batch ({len(too_big)}): " + "; ".join(too_big))
    return 0 if same_batch_mean >= SPEARMAN_TARGET and agreement >= OOM_TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
