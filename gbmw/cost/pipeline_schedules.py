"""Pipeline schedules: how long an iteration takes from its stages' times (the paper's Eq. (9), Appendix C), and how
many micro-batches' activations a stage keeps at its peak.

Schedules (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
SC21, Sec. 2.2):
* `gpipe` — every forward, then every backward: a stage keeps all m micro-batches.
* `1f1b` — 1F1B-flush (PipeDream-Flush): stage i of P keeps min(P − i, m).
* `1f1b` with v > 1 virtual stages (interleaved 1F1B): each device runs v model chunks of 1/v of its layers,
  so the bubble shrinks to (P − 1)/v chunk-times and every micro-batch crosses v times as many stage
  boundaries. Megatron's warm-up runs (P − i − 1)·2 + (v − 1)·P chunk forwards on stage i before its first
  backward (megatron.core.pipeline_parallel.schedules), so it keeps that many chunks plus the one in flight:
  ((P − i − 1)·2 + (v − 1)·P + 1) / v micro-batches' worth of the stage's activations — on stage 0,
  P·(1 + (P − 1)/(P·v)), Korthikanti et al. (2022) Sec. 4.2.3.

Iteration time, for stage times C_i (one micro-batch, gradient synchronisation included) and C_i' (without):
    (m − 1) · max_i C_i'  +  Σ_i C_i' / v  +  (1 − 1/v) · max_i C_i'  +  max_i (C_i − C_i')  +  max_i U_i
The first three terms are Eq. (9)'s fill, steady state and drain (for v = 1: (m − 1)·max C' + Σ C'). Each stage
synchronises its gradients on its own devices, so the stages' synchronisations run at the same time and the
slowest one counts, not their sum — the last term of Eq. (9), Σ_i C_i, adds them up; the optimizer step U_i
(memory-bound, gbmw.cost.model_states) likewise runs on every stage at once. Taking the slowest synchronisation in
full is conservative: stage i finishes its last backward before stage 0 does, so part of its synchronisation
hides behind stage 0's remaining backward.
"""

from __future__ import annotations

from typing import Protocol, Sequence


class StageTimes(Protocol):
    time_s: float
    time_no_grad_sync_s: float
    optimizer_time_s: float


def in_flight_micro_batches(schedule: str, stage_index: int, pp: int, num_micro_batches: int,
                            virtual_stages: int = 1) -> float:
    """Micro-batches' worth of the stage's stashed activations a stage keeps at its peak (see the module)."""
    if schedule == "gpipe":
        return num_micro_batches
    if virtual_stages == 1:
        return min(pp - stage_index, num_micro_batches)
    chunks = (pp - stage_index - 1) * 2 + (virtual_stages - 1) * pp + 1
    return min(chunks, num_micro_batches * virtual_stages) / virtual_stages


def pipeline_time_s(stages: Sequence[StageTimes], num_micro_batches: int, virtual_stages: int = 1) -> float:
    """The iteration time from the stages' times (the module's formula; Eq. (9) with concurrent gradient
    synchronisation and optimizer steps, and the interleaved schedule's shorter bubble)."""
    no_sync = [stage.time_no_grad_sync_s for stage in stages]
    slowest = max(no_sync)
    fill_and_drain = sum(no_sync) / virtual_stages + (1 - 1 / virtual_stages) * slowest
    synchronisation = max(stage.time_s - stage.time_no_grad_sync_s for stage in stages)
    optimizer = max(stage.optimizer_time_s for stage in stages)
    return (num_micro_batches - 1) * slowest + fill_and_drain + synchronisation + optimizer
