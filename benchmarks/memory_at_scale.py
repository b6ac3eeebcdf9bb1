"""The estimator's peak memory against what gbmw's runtime really allocates, at full scale, on a CPU.

    .venv/bin/python benchmarks/memory_at_scale.py          # every full-size plan, one rank per stage
    .venv/bin/python benchmarks/memory_at_scale.py --only moe   # the mixture-of-experts plans alone (--only dense)
    .venv/bin/python benchmarks/memory_at_scale.py --only long  # Ulysses plans for 32k- and 128k-token samples

For each plan, one rank of every pipeline stage builds the runtime's real train step under torch's fake tensors
and fake process group, and torch's MemTracker tracks its peak (gbmw.adapters.profile.fake_memory;
tests/test_fake_memory.py shows the fake trace's peak equals the real step's on gloo processes). Plans:
- gbmw's plan for GPT-3 15B on 32 A100-80GB (`gpt3-15b_a100-80g-x32`);
- gbmw's plan for GPT-3 65B on 64 H100-80GB (`gpt3-65b_h100-80g-x64`);
- a mixed per-layer plan for GPT-3 15B on 32 devices (two stages; TP, ZeRO-1/2/3 and checkpointing mixed);
- gbmw's plan for LLaMA-7B on 8 A100-80GB (`llama-7b_a100-80g-x8`: RMSNorm, SwiGLU, rotary) and a mixed
  per-layer plan for it (TP, ZeRO-1/2/3 and checkpointing mixed on one stage), and that plan with sequence
  parallelism (+sp) in every block, and that with selective recomputation (+sel) in the blocks without +ckpt;
- mixture of experts: gbmw's plan for Mixtral-8x7B on 64 H100-80GB (`mixtral-8x7b_h100-80g-x64`: expert parallelism
  with plain DP in the MoE blocks), a mixed per-layer plan for it (EP degrees 2–8 beside TP, ZeRO and
  checkpointing), that plan with ZeRO-1/2/3 in the MoE blocks beside EP (experts sharded over their
  expert-data-parallel group), one with +sp in its MoE blocks and one with the experts at a TP degree of their own
  (+etpN: whole beside TP 2 and 4, ETP 2 inside TP 4; `--plans +etpN` traces it alone). Their MoE layers route by the
  balanced assignment (every expert n·k/E copies), the estimator's
  stated assumption (`moe.load_imbalance` = 1; gbmw.adapters.profile.fake_memory says what that leaves unchecked);
- long sequences (`--only long`): gbmw's plans of the `gbmw+ulysses` variant (`gbmw plan JOB --variant gbmw+ulysses`)
  for Llama 3.1 8B at 32768-token samples (`llama3.1-8b-32k_h100-80g-x64`) and at 131072-token samples
  (`llama3.1-8b-128k_h100-80g-x64`), a mixed per-layer plan at 32k (Ulysses 2–8 beside TP, ZeRO-1/2/3 and
  checkpointing, two stages), the `gbmw+cp` plan at 128k (ring context parallelism), and a mixed per-layer plan for
  Mixtral-8x7B at 32k tokens (`mixtral-8x7b-32k_h100-80g-x64`: EP 4–8 beside cp 4–8 and ulysses 4–8, TP, ZeRO-1/2/3,
  recomputation; `--plans "EP beside"` traces it alone). Fake tensors allocate nothing, so a 128k trace takes about
  as long as a 32k one (the runtime's ring attends in tiles of at most 2^26 scores: more tiles, more traced ops).
Prints estimated and tracked peak per rank and the error; the target (issue 12) is |error| ≤ 3 %.

Last runs (2026-11-27, seventh session, one command per case set, after the runtime stopped keeping each in-flight
micro-batch's sent output; docs/cost-model.md): dense 2.3 % largest (PASS: the mixed GPT-3 15B plan's second stage);
mixture of experts 2.6 % (PASS: gbmw's Mixtral plan +1.3 %, the mixed plan −1.0 % to +2.6 %, with ZeRO beside EP
−1.9 % to +1.4 %, with +sp in the MoE blocks −1.5 % to +1.9 %, the +etpN plan −1.6 % to +1.5 % — −28.7 % before
whole experts beside TP were priced as grouped and keeping their 16-bit copies); long sequences 2.3 % (PASS). Eighth
session (2026-12-02, `--only long`): the Llama plans unchanged, the new Mixtral 32k plan −1.1, −5.9, −1.7, −0.7 %
(its cp-4 stage −23.1 % before the ring's score tiles); ninth (2026-12-02, `--only long --plans "mixed per-layer"`,
after a ZeRO-3 recomputation's whole weights and buffers were priced): Llama 32k mixed −1.4 / +0.8 %, Mixtral 32k
−1.1, −1.3, −1.4, −0.7 % (PASS). What is still not priced: a stage's received input at the previous stage's layout;
docs/cost-model.md has the figures.

    .venv/bin/python benchmarks/memory_at_scale.py --only long --plans Mixtral --attribute 12

also prints, for each traced stage, the 12 largest groups of storages alive at its peak by the source lines that
made them (gbmw.adapters.profile.peak_attribution; about twice as slow): where an estimate's missing bytes live.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from gbmw.adapters.profile.fake_memory import track_rank, with_traced_micro_batches  # noqa: E402
from gbmw.adapters.profile.peak_attribution import PeakAttributingTracker  # noqa: E402
from gbmw.cost.estimate import estimate_plan  # noqa: E402
from gbmw.plan import plan_from_strategy_names  # noqa: E402
from gbmw.search.planner import Planner  # noqa: E402
from gbmw.specs.jobs import load_job  # noqa: E402

GIB = 2**30
TARGET = 0.03


def mixed_plan(job):
    """GPT-3 15B on 32 devices in two stages of 16, each layer's strategy chosen by hand to mix every kind."""
    names = (["tp8-z1dp2"] + ["tp4-sdp4"] * 8 + ["tp4-sdp4+ckpt"] * 8 + ["tp8-z2dp2"] * 8
             + ["tp8-dp2+ckpt"] * 12 + ["tp2-sdp8"] * 12 + ["tp8-z1dp2"])
    return plan_from_strategy_names(job.model, 32, names, [25, 25], 1024, 64, cluster=job.cluster.name)


def llama_mixed_plan(job):
    """LLaMA-7B on 8 devices in one stage, each layer's strategy chosen by hand to mix every kind."""
    names = (["tp4-z1dp2"] + ["tp2-sdp4"] * 8 + ["tp4-sdp2+ckpt"] * 8 + ["tp8+ckpt"] * 8 + ["tp4-z2dp2"] * 8
             + ["tp8"])
    return plan_from_strategy_names(job.model, 8, names, [34], 64, 16, cluster=job.cluster.name)


def llama_sequence_parallel_plan(job):
    """`llama_mixed_plan` with sequence parallelism (+sp, Korthikanti et al. Sec. 4.2.2) in every block."""
    names = (["tp4-z1dp2"] + ["tp2-sdp4+sp"] * 8 + ["tp4-sdp2+sp+ckpt"] * 8 + ["tp8+sp+ckpt"] * 8
             + ["tp4-z2dp2+sp"] * 8 + ["tp8"])
    return plan_from_strategy_names(job.model, 8, names, [34], 64, 16, cluster=job.cluster.name)


def llama_selective_plan(job):
    """`llama_sequence_parallel_plan` with selective recomputation (+sel, the attention core recomputed in backward)
    in every block that does not recompute fully."""
    names = [strategy.name + ("+sel" if 0 < index < job.model.num_layers - 1 and not strategy.ckpt else "")
             for index, strategy in enumerate(llama_sequence_parallel_plan(job).strategies)]
    return plan_from_strategy_names(job.model, 8, names, [34], 64, 16, cluster=job.cluster.name)


def mixtral_mixed_plan(job):
    """Mixtral-8x7B on 64 devices in eight stages of 8, each MoE block's strategy chosen by hand to mix EP degrees
    (8, 4, 2) with plain DP, TP and checkpointing, dense ends sharded (ZeRO-1/3)."""
    names = (["z1dp8"] + ["dp8+ep8"] * 6 + ["tp2-dp4+ep4"] * 6 + ["dp8+ep8+ckpt"] * 8 + ["tp2-dp4+ep2"] * 4
             + ["tp4-dp2+ep2"] * 4 + ["dp8+ep4"] * 4 + ["sdp8"])
    return plan_from_strategy_names(job.model, 64, names, [5, 4, 4, 4, 4, 4, 4, 5], 256, 32, cluster=job.cluster.name)


def mixtral_sharded_plan(job):
    """`mixtral_mixed_plan` with ZeRO in place of plain DP: EP composed with sdp, z2dp and z1dp, the experts' states
    sharded over their expert-data-parallel group (gbmw.adapters.runtime.expert_data_parallel; none left at ep = dp).
    Its first run (stages 0–2 only, under load) found the estimate above the trace by +2.4 % (sdp8+ep2), +3.6 %
    (sdp8+ep2) and +4.6 % (tp2-sdp4+ep2) — about one fp32 copy of a block's local experts per stage — where stage 1
    with dp8+ep2 in its blocks instead was −0.03 %: the estimator over-prices the experts' own FSDP2 unit (not yet
    found where)."""
    names = (["z1dp8"] + ["sdp8+ep2"] * 6 + ["tp2-sdp4+ep2"] * 6 + ["z2dp8+ep4+ckpt"] * 8 + ["z1dp8+ep2"] * 4
             + ["tp4-z1dp2+ep2"] * 4 + ["sdp8+ep8"] * 4 + ["sdp8"])
    return plan_from_strategy_names(job.model, 64, names, [5, 4, 4, 4, 4, 4, 4, 5], 256, 32, cluster=job.cluster.name)


def mixtral_sequence_parallel_plan(job):
    """Mixtral-8x7B on 64 devices in eight stages of 8 with +sp in its MoE blocks beside EP degrees 4 and 2, TP 2–8
    and checkpointing (gbmw.adapters.runtime.expert_sequence_parallel: each TP rank routes its sequence slice, the TP
    group's received copies gathered for the experts' shards)."""
    names = (["z1dp8"] + ["tp2-dp4+ep4+sp"] * 8 + ["tp4-dp2+ep2+sp"] * 8 + ["tp2-dp4+ep2+sp+ckpt"] * 8
             + ["tp8+sp"] * 8 + ["sdp8"])
    return plan_from_strategy_names(job.model, 64, names, [5, 4, 4, 4, 4, 4, 4, 5], 256, 32, cluster=job.cluster.name)


def mixtral_expert_tensor_parallel_plan(job):
    """Mixtral-8x7B on 64 devices in eight stages of 8 with the experts at a TP degree of their own (+etpN, megatron-
    core's ETP · EP · EDP grid): whole experts (+etp1) beside TP 2 and 4 with plain DP, ZeRO-1/2/3 and
    checkpointing, and ETP 2 inside TP 4 (gbmw.adapters.runtime.experts: at ETP 1 no gather, the rank's own copies
    through its whole experts, grouped)."""
    names = (["z1dp8"] + ["tp2-dp4+ep8+etp1+sp"] * 8 + ["tp4-z1dp2+ep4+etp1+sp"] * 4 + ["tp2-sdp4+ep4+etp1+sp"] * 4
             + ["tp2-z2dp4+ep2+etp1+sp+ckpt"] * 8 + ["tp4-dp2+ep2+etp2+sp"] * 4 + ["tp4-dp2+ep4+etp2+sp+ckpt"] * 4
             + ["sdp8"])
    return plan_from_strategy_names(job.model, 64, names, [5, 4, 4, 4, 4, 4, 4, 5], 256, 32, cluster=job.cluster.name)


def llama31_ulysses_mixed_plan(job):
    """Llama 3.1 8B on 64 devices in two stages of 32, each layer's strategy chosen by hand to mix Ulysses degrees
    (2, 4, 8) with TP (tp × ulysses divides the 8 key/value heads), ZeRO-1/2/3 and checkpointing."""
    names = (["tp2-ulysses2-z1dp8"] + ["ulysses8-z1dp4"] * 8 + ["tp2-ulysses4-sdp4+ckpt"] * 8
             + ["tp4-ulysses2-z2dp4"] * 8 + ["ulysses4-sdp8+ckpt"] * 8 + ["tp2-ulysses4-z1dp4"])
    return plan_from_strategy_names(job.model, 64, names, [17, 17], job.global_batch, job.global_batch // 8,
                                    cluster=job.cluster.name)


def mixtral_long_mixed_plan(job):
    """Mixtral-8x7B at 32k-token samples on 64 devices in four stages of 16, its MoE blocks' experts split beside a
    sequence axis (EP over the cp or ulysses ranks, then the data-parallel ones: megatron-core's expert grid) — EP 4
    and 8 with cp 4–8 and ulysses 4–8, TP 2, ZeRO-1/2/3 and checkpointing mixed; 16 micro-batches of 4 samples."""
    names = (["tp2-cp8"] + ["tp2-cp8+ep8+ckpt"] * 8 + ["cp4-sdp4+ep8+ckpt"] * 8 + ["tp2-ulysses4-z2dp2+ep4+ckpt"] * 8
             + ["ulysses8-z1dp2+ep8+ckpt"] * 8 + ["tp2-cp8"])
    return plan_from_strategy_names(job.model, 64, names, [9, 8, 8, 9], job.global_batch, job.global_batch // 4,
                                    cluster=job.cluster.name)


def dense_cases():
    gpt15, gpt65 = load_job("gpt3-15b_a100-80g-x32"), load_job("gpt3-65b_h100-80g-x64")
    llama = load_job("llama-7b_a100-80g-x8")
    return [("gbmw's plan, GPT-3 15B, 32 × A100", gpt15, Planner(gpt15).run()),
            ("gbmw's plan, GPT-3 65B, 64 × H100", gpt65, Planner(gpt65).run()),
            ("mixed per-layer plan, GPT-3 15B, 32 devices", gpt15, mixed_plan(gpt15)),
            ("gbmw's plan, LLaMA-7B, 8 × A100", llama, Planner(llama).run()),
            ("mixed per-layer plan, LLaMA-7B, 8 devices", llama, llama_mixed_plan(llama)),
            ("the same with +sp in every block, LLaMA-7B", llama, llama_sequence_parallel_plan(llama)),
            ("the same with +sel where not +ckpt, LLaMA-7B", llama, llama_selective_plan(llama))]


def moe_cases():
    mixtral = load_job("mixtral-8x7b_h100-80g-x64")
    return [("gbmw's plan, Mixtral-8x7B, 64 × H100", mixtral, Planner(mixtral).run()),
            ("mixed per-layer MoE plan, Mixtral-8x7B, 64 devices", mixtral, mixtral_mixed_plan(mixtral)),
            ("the same with ZeRO-1/2/3 beside EP, Mixtral-8x7B", mixtral, mixtral_sharded_plan(mixtral)),
            ("a per-layer MoE plan with +sp in the MoE blocks, Mixtral-8x7B", mixtral,
             mixtral_sequence_parallel_plan(mixtral)),
            ("the experts at their own TP degree (+etpN), Mixtral-8x7B", mixtral,
             mixtral_expert_tensor_parallel_plan(mixtral))]


def long_cases():
    long32k, long128k = load_job("llama3.1-8b-32k_h100-80g-x64"), load_job("llama3.1-8b-128k_h100-80g-x64")
    mixtral32k = load_job("mixtral-8x7b-32k_h100-80g-x64")
    return [("gbmw+ulysses plan, Llama 3.1 8B 32k, 64 × H100", long32k, Planner(long32k, variant="gbmw+ulysses").run()),
            ("mixed per-layer Ulysses plan, Llama 3.1 8B 32k", long32k, llama31_ulysses_mixed_plan(long32k)),
            ("gbmw+ulysses plan, Llama 3.1 8B 128k, 64 × H100", long128k,
             Planner(long128k, variant="gbmw+ulysses").run()),
            ("gbmw+cp plan (ring context parallelism), Llama 3.1 8B 128k", long128k,
             Planner(long128k, variant="gbmw+cp").run()),
            ("mixed per-layer plan, EP beside cp and ulysses, Mixtral-8x7B 32k", mixtral32k,
             mixtral_long_mixed_plan(mixtral32k))]


CASES = {"dense": dense_cases, "moe": moe_cases, "long": long_cases}


def print_attribution(console: Console, title: str, predicted: float, tracked: float, tracker, count: int) -> None:
    """The `count` largest groups of storages alive at a traced peak (gbmw.adapters.profile.peak_attribution)."""
    table = Table(title=f"{title}: estimated {predicted / GIB:.2f} GiB, traced {tracked / GIB:.2f} GiB at "
                        f"{tracker.peak_operator} ({'backward' if tracker.peak_in_backward else 'forward'})")
    for column in ("GiB", "category", "made by", "operator", "first shape", "dtype"):
        table.add_column(column, justify="right" if column == "GiB" else "left")
    for group in tracker.peak_groups[:count]:
        table.add_row(f"{group.bytes / GIB:.3f}", group.category, group.lines, group.operator.removeprefix("aten."),
                      str(group.shape), group.dtype)
    console.print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(CASES), help="trace only the dense, the mixture-of-experts or the long-sequence plans")
    parser.add_argument("--plans", metavar="WORD", help="trace only the plans whose label holds WORD (e.g. +etpN)")
    parser.add_argument("--attribute", metavar="N", type=int, default=0,
                        help="also print the N largest groups of storages alive at each stage's peak, by the source "
                             "lines that made them")
    args = parser.parse_args()
    cases = [case for kind, make in CASES.items() if args.only in (None, kind) for case in make()
             if args.plans is None or args.plans in case[0]]
    console = Console(highlight=False, width=140)
    table = Table(title="peak memory per rank: estimate vs the runtime's step traced under fake tensors")
    for column in ("plan", "rank", "stage", "estimated GiB", "tracked GiB", "error", "trace s"):
        table.add_column(column, justify="left" if column == "plan" else "right")
    errors = []
    for label, job, plan in cases:
        estimate = estimate_plan(job, with_traced_micro_batches(plan))  # 1F1B: the same peak as the plan's m
        for stage in range(plan.pp):
            started = time.perf_counter()
            tracker = PeakAttributingTracker() if args.attribute else None
            tracked = track_rank(job, plan, stage * plan.devices_per_stage, tracker=tracker)
            predicted = estimate.stage_peak_memory_bytes[stage]
            if tracker is not None:
                print_attribution(console, f"{label or 'the same plan'}, stage {stage}", predicted, tracked.peak_bytes,
                                  tracker, args.attribute)
            error = (predicted - tracked.peak_bytes) / tracked.peak_bytes
            errors.append(error)
            table.add_row(label, str(tracked.rank), str(stage), f"{predicted / GIB:.2f}", f"{tracked.peak_bytes / GIB:.2f}",
                          f"{error:+.1%}", f"{time.perf_counter() - started:.0f}")
            label = ""
    console.print(table)
    worst = max(abs(error) for error in errors)
    console.print(f"largest |error| {worst:.1%} (target ≤ {TARGET:.0%}: {'PASS' if worst <= TARGET else 'FAIL'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
