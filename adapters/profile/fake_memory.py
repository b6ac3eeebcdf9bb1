"""The runtime's memory at full scale without the hardware: one rank's real train step — the engine that
`gbmw train` builds, its layers, FSDP2 sharding, TP, checkpointing, pipeline schedule and Adam — built and run
under torch's fake tensors and fake process group, its peak tracked by torch's MemTracker
(`torch.distributed._tools.mem_tracker`). Nothing is allocated: every tensor is a shape with a device.

Two iterations are traced, so Adam's states exist throughout the second; the peak is the largest amount held at
once over both. Under 1F1B a stage's peak is reached once min(P − i, m) micro-batches are in flight after
the first backward has made the gradients, so min(m, P + 1) micro-batches show the peak of any m and the trace
runs that many (`traced_micro_batches`). Ranks of one stage hold the same amount (their TP slices and data-
parallel shards are equal), so one rank per stage is traced.

The fake device is the CPU: with bf16, CPU autocast decides which ops run in bf16, and its lists differ from
CUDA autocast's for some ops (not for matmuls, which both run in bf16).

Mixture-of-experts layers route by a fixed balanced assignment while traced (gbmw.adapters.runtime.experts
.balanced_routing, entered by `step_peak` with fake and real tensors alike): real routing reads its token counts
from the data, which fake tensors do not have. Every expert then receives n·k/E copies of a rank's n tokens and every
EP rank the mean, which is exactly what the estimator assumes (`moe.load_imbalance` = 1 by default, the busiest rank
receiving the mean: gbmw.cost.expert_parallel) — so the trace checks the estimate's accounting of what balanced
routing holds (dispatched and permuted copies, expert activations, router probabilities, all-to-all buffers), the
honest comparison for an estimate that states that assumption. It cannot show what imbalance costs: a busier rank
holds more received copies and expert activations (the estimator's load factor prices that; nothing here checks it),
and real routing in training is never balanced by construction.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker

from gbmw.plan import Plan
from gbmw.specs.jobs import JobSpec

from ..runtime.engine import AdamSettings, HybridEngine
from ..runtime.experts import balanced_routing
from ..runtime.groups import GroupPool
from ..runtime.model import synthetic_batch


class _BackwardFlag:
    """What MemTracker asks of its ModTracker — whether autograd is running a backward pass (to file new tensors as
    temporaries), which modules are running (for per-module peaks) — answered without ModTracker's global module
    hooks. Those hooks register a multi-gradient hook on every module's inputs and outputs that requires grad
    (torch.autograd.graph.register_multi_grad_hook), and the hook's closure holds the autograd nodes of those
    tensors while the node holds the hook: a cycle through C++ that the garbage collector cannot break. It keeps the
    graph's edges alive after backward, and through them the leaf a pipeline stage receives its input in, with that
    leaf's gradient — two boundary activations per micro-batch the runtime has long dropped (18 received inputs and 13
    gradients alive at the peak of stage 3 of the mixed Mixtral plan of benchmarks/memory_at_scale.py, where the
    schedule holds 8)."""

    parents: frozenset = frozenset()

    @property
    def is_bw(self) -> bool:
        return torch._C._current_graph_task_id() != -1  # what ModTracker.is_bw reads

    def register_user_hooks(self, *hooks) -> None:
        pass

    def clear_user_hooks(self) -> None:
        pass

    def __enter__(self) -> "_BackwardFlag":
        return self

    def __exit__(self, *args) -> None:
        pass


class StepPeakTracker(MemTracker):
    """MemTracker's device-wide tracking (every storage created and freed, by category) without its per-module
    bookkeeping, which assumes each module runs forward once per iteration (with gradient accumulation and a
    pipeline every layer runs once per micro-batch: MemTracker refuses the second call), and whose module hooks
    keep tensors alive that the step has freed (`_BackwardFlag`). The peak comes from the storage tracking alone."""

    def __init__(self) -> None:
        super().__init__()
        self._mod_tracker = _BackwardFlag()


@dataclass(frozen=True)
class TrackedPeak:
    rank: int
    stage: int
    peak_bytes: int
    """The most memory the rank's device held at once during an iteration."""
    by_category: dict[str, int]
    """MemTracker's categories at that peak (parameters, optimizer states, and the rest as it sees them)."""


def traced_micro_batches(plan: Plan) -> int:
    """Micro-batches that reach the peak of the plan's 1F1B schedule: min(m, pp + 1) (see the module docstring)."""
    return min(plan.num_micro_batches, plan.pp + 1)


def with_traced_micro_batches(plan: Plan) -> Plan:
    """The plan with as many micro-batches as the trace needs (the same micro-batch size, a smaller global batch)."""
    count = traced_micro_batches(plan)
    return dataclasses.replace(plan, global_batch=plan.micro_batch * count, num_micro_batches=count, estimate=None)


def step_peak(plan: Plan, architecture, pool: GroupPool, adam: AdamSettings, seed: int = 0,
              fake: bool = True, tracker: StepPeakTracker | None = None) -> TrackedPeak:
    """Build this rank's engine for `plan` and trace two iterations (see the module docstring) under fake tensors,
    or with real tensors when `fake` is False (on an initialised process group: what the fake trace is checked
    against). MoE layers route by the balanced assignment in both (the module docstring). `tracker`: a fresh
    StepPeakTracker of the caller's (gbmw.adapters.profile.peak_attribution's, say), read after the call."""
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() if fake else contextlib.nullcontext(), balanced_routing():
        engine = HybridEngine(plan, architecture, pool, "cpu", seed=seed, adam=adam)
        tracker = StepPeakTracker() if tracker is None else tracker
        tracker.track_external(*[layer.module for layer in engine.layers], engine.optimizer)
        with tracker:
            for step in range(2):
                engine.run_train_step(synthetic_batch(architecture, plan.global_batch, step, seed))
        peak = tracker.get_tracker_snapshot("peak")
    categories = {str(getattr(key, "value", key)): int(value) for key, value in peak[torch.device("cpu")].items()}
    return TrackedPeak(pool.rank, pool.layout.stage_of(pool.rank), categories.pop("Total"), categories)


def track_rank(job: JobSpec, plan: Plan, rank: int, adam: AdamSettings = AdamSettings(max_grad_norm=1.0),
               seed: int = 0, tracker: StepPeakTracker | None = None) -> TrackedPeak:
    """The peak memory of `rank` running two iterations of `plan`'s train step with as many micro-batches as
    reach its peak, under fake tensors. Initialises torch.distributed with the fake backend as that rank and
    destroys it afterwards: call it in a process with no other process group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    architecture = job.model.require_architecture("tracking the runtime's memory")
    traced = with_traced_micro_batches(plan)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.num_devices)
    try:
        return step_peak(traced, architecture, GroupPool(traced), adam, seed,  # the pool's meshes: real tensors
                         tracker=tracker)
    finally:
        dist.destroy_process_group()
