"""The paper's torch-Pipe pipelines as its training scripts ran them: few micro-batches, GPipe without recomputation.

The Galvatron artifact released with the paper's first version (github.com/anonymous-cs-system/Galvatron, commit
2a09c265, `<model>/train_hp_layerwise.py`) runs a global strategy with pp_deg > 1 — the PyTorch GPipe baseline is
pp_deg 8, tp 1 — as `Pipe(model, chunks=get_chunks(args), checkpoint='never')` (torch.distributed.pipeline.sync):

* no activation recomputation (`checkpoint='never'`, where torch's default is 'except_last'); Table 3 agrees: the
  GPipe batches grow by about one stashed sample per stage per GiB (ViT-Huge-32: 56, 104, 144, 192 at 8–20 GiB,
  +40 to +48 per 4 GiB, where 4 GiB holds 50.7 samples of 646.5 MiB / 8 stages — Table 2's activation per sample);
* a hand-written micro-batch count per model, from the local batch b = global batch / (world size / TP) — with one
  process driving all 8 stages, the global batch — not the bubble-minimising count gbmw's search picks:
  - vit/train_hp_layerwise.py `get_chunks`: 1 if b == 8 else 2;
  - swin/train_hp_layerwise.py: 1 if b ≤ 8, 2 if b < 32, 3 if b ≤ 96, else 4;
  - bert/train_hp_layerwise.py: 1 if b == 2, 2 if b == 4, else ceil(b / 8 + 2) (pp 8, tp 1);
  - t5/train_hp_layerwise.py: 1 if b == 2, 3 if pp == 8, else 2.
  The artifact's search prices pipelines with the same rules (`optimal_chunk_func` in `<model>/search_layerwise_hp.py`,
  `pipe_with_microbatch` in utils/cost_model.py). torch's Pipe cuts the batch with torch.chunk: micro-batches of
  ceil(B / m) samples, the last one smaller; the full-size ones set the pipeline's pace, so a plan is costed at
  ceil(B / m) samples per micro-batch and its samples/s is B over that iteration time.

The Galvatron (DP+PP) and Galvatron rows ran the same Pipe with plans the artifact's search chose knowing these
counts: gbmw searches them at the paper's batch with one micro-batch count per pipeline degree
(`searched_micro_batch_count`, gbmw.search.planner.Planner.micro_batch_count_rule), the rule's count for the local
batch of the stage's whole data-parallel group, B / (8 / pp) — the per-layer strategies of a Galvatron plan may split
it fewer ways, and a plan needs a count that divides B, so the count is the divisor of B nearest the rule's.
"""

from __future__ import annotations

import math
from dataclasses import replace

from gbmw.cost.estimate import estimate_plan
from gbmw.plan import Plan
from gbmw.search.planner import NothingFitsError, Planner
from gbmw.specs.jobs import JobSpec

GPIPE_ROW = "PyTorch GPipe (PP)"
SEARCHED_PIPE_ROWS = ("Galvatron (DP+PP)", "Galvatron")
"""Rows the artifact's search planned and its torch Pipe ran (the VLDB version's Galvatron)."""
ARTIFACT = "github.com/anonymous-cs-system/Galvatron@2a09c265"


def script_micro_batch_count(model_name: str, local_batch: int, pp: int) -> int:
    """The micro-batch count (torch Pipe's `chunks`) the artifact's get_chunks sets for a global strategy with
    pp > 1 and TP 1 (the module's rules; `local_batch`: samples per data-parallel replica)."""
    family = model_name.split("-")[0].lower()
    if family == "vit":
        return 1 if local_batch == 8 else 2
    if family == "swin":
        return 1 if local_batch <= 8 else 2 if local_batch < 32 else 3 if local_batch <= 96 else 4
    if family == "bert":
        return 1 if local_batch == 2 else 2 if local_batch == 4 else math.ceil(local_batch / 8 + 2)
    if family == "t5":
        return 1 if local_batch == 2 else 3 if pp == 8 else 2
    raise ValueError(f"{model_name}: the artifact ({ARTIFACT}) has no training script for it")


def as_script_ran(job: JobSpec, plan: Plan, model_name: str) -> tuple[float, int]:
    """(samples/s, micro-batch count) of a one-device-per-stage GPipe `plan` re-costed as the artifact ran it:
    every layer without recomputation, `script_micro_batch_count` micro-batches of ceil(B / m) samples."""
    batch = plan.global_batch
    count = min(script_micro_batch_count(model_name, batch, plan.pp), batch)
    micro_batch = math.ceil(batch / count)
    as_ran = replace(plan, global_batch=micro_batch * count, micro_batch=micro_batch, num_micro_batches=count,
                     strategies=tuple(replace(strategy, ckpt=False) for strategy in plan.strategies), estimate=None)
    estimate = estimate_plan(job, as_ran, attention_as_declared=True)
    return batch / estimate.iteration_time_s, count


def searched_micro_batch_count(model_name: str, devices: int, global_batch: int, pp: int) -> int:
    """The count a search at `global_batch` tries at pipeline degree `pp` (the module's last paragraph): the divisor
    of the batch nearest the script's count for a local batch of B / (devices / pp), the smaller one on a tie, among
    those whose micro-batch splits over that data-parallel group (0 if none does)."""
    data_parallel = devices // pp
    wanted = script_micro_batch_count(model_name, max(1, global_batch // data_parallel), pp)
    counts = [count for count in range(1, global_batch + 1)
              if global_batch % count == 0 and (global_batch // count) % data_parallel == 0]
    return min(counts, key=lambda count: (abs(count - wanted), count), default=0)  # 0: no count splits this batch


def script_gpipe_best(job: JobSpec, model_name: str, batch_step: int) -> tuple[float, int] | None:
    """(samples/s, global batch) of the PyTorch GPipe row at its best batch as the artifact ran it, the batch growing
    by `batch_step` until nothing fits (None if the first does not): one device per stage, no recomputation
    (`checkpoint='never'`), `script_micro_batch_count` micro-batches of ceil(B / m) samples, the full-size ones setting
    the pace (as `as_script_ran`)."""
    best = None
    for batch in range(batch_step, job.max_global_batch + 1, batch_step):
        count = min(script_micro_batch_count(model_name, batch, job.cluster.num_devices), batch)
        micro_batch = math.ceil(batch / count)
        planner = Planner(job, "gpipe", micro_batch * count, accumulate=False, explain_failure=False,
                          attention_as_declared=True, micro_batch_count_rule=lambda _batch, _pp: count)
        planner.spec = replace(planner.spec, recompute_always=False)
        try:
            samples_per_s = batch / planner.run().estimate.iteration_time_s
        except NothingFitsError:
            break
        if best is None or samples_per_s > best[0]:
            best = (samples_per_s, batch)
    return best
