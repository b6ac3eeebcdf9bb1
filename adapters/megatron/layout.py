"""What a plan and its job tell Megatron: the Megatron targets, the GPT architecture, the uniform
layout read off a plan, and megatron-core's count of blocks per pipeline stage."""

from __future__ import annotations

from dataclasses import dataclass

from gbmw.errors import GbmwError, PlanError
from gbmw.plan import Plan
from gbmw.space.launch_settings import adam_moments_layout_problem
from gbmw.space.stock_partitions import blocks_per_stage, interleaved_split, megatron_partition
from gbmw.space.strategy import DATA_PARALLEL_AXES
from gbmw.space.targets import ZERO_STAGE_OF_AXIS, get_target
from gbmw.specs.architectures import GPTArchitecture
from gbmw.specs.jobs import JobSpec

TARGETS = ("megatron-core", "megatron-lm", "megatron-deepspeed")


def plan_target(target: str) -> str:
    """The gbmw.space.targets target a Megatron front end is checked as (`megatron-lm` runs megatron-core)."""
    if target not in TARGETS:
        raise GbmwError(f"Megatron target {target!r} is unknown; targets are {list(TARGETS)}")
    return get_target(target).name


# ----------------------------------------------------------------------------------------------
# The model: Megatron is told the architecture, not per-layer costs
# ----------------------------------------------------------------------------------------------


def gpt_architecture(job: JobSpec) -> GPTArchitecture:
    """The GPT architecture the job's model was built from (widths, heads, sequence length…); Megatron's
    `pretrain_gpt.py` trains GPT-family models only."""
    architecture = job.model.require_architecture("Megatron's arguments (num_layers, hidden_size, num_heads, …)")
    if architecture.family != "gpt":
        raise GbmwError(
            f"model {job.model.name} is a {architecture.family} model; Megatron's pretrain_gpt.py trains GPT-family "
            "models — use --target runtime"
        )
    window = architecture.sliding_window
    if window is not None and architecture.seq_length > window:
        raise GbmwError(f"model {job.model.name}: sliding-window attention ({window} tokens) at a sequence of "
                        f"{architecture.seq_length}: gbmw's Megatron arguments set no window, so Megatron would train "
                        f"full attention; train at most {window} tokens (--seq-length) or use --target runtime")
    if architecture.attention_sinks:
        raise GbmwError(f"model {job.model.name}: attention sinks (a learned softmax logit per head, GPT-OSS): gbmw's "
                        "Megatron arguments do not set megatron-core's --softmax-type learnable yet, so Megatron would "
                        "train without them; use the model's own training code")
    blocks = sum(layer.is_block for layer in job.model.layers)
    if architecture.num_layers != blocks:
        raise GbmwError(
            f"model {job.model.name}: its architecture has num_layers {architecture.num_layers} but the model has "
            f"{blocks} Transformer blocks"
        )
    return architecture


# ----------------------------------------------------------------------------------------------
# The layout: what a uniform plan tells Megatron
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MegatronLayout:
    """A plan as Megatron reads it: one TP × DP layout per stage, per-rank batch arithmetic."""

    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    """N / (TP × PP): the data-parallel degree Megatron derives from the world size."""
    data_axis: str | None
    """dp, z1dp, z2dp or sdp; None when data_parallel == 1."""
    recompute: str
    """How every Transformer block recomputes: `none`, `full` (uniform, one layer per unit) or `selective` (the
    attention core)."""
    sequence_parallel: bool
    """TP runs sequence-parallel (`--sequence-parallel`); only with tensor_parallel > 1."""
    context_parallel: int
    """Each sample's tokens split over a ring of this many ranks (`--context-parallel-size`; 1 without)."""
    ulysses: int
    """Each sample's tokens split over this many ranks, heads exchanged by all-to-all
    (`--ds-sequence-parallel-size`; 1 without)."""
    expert_parallel: int
    """The experts of every mixture-of-experts block split over this many data-parallel ranks
    (`--expert-model-parallel-size`; 1 for a dense model)."""
    expert_tensor_parallel: int
    """The experts' TP degree (`--expert-tensor-parallel-size`): the layers' TP unless the plan's MoE blocks give
    their own (`+etpN`, megatron-core only)."""
    micro_batch_size: int
    """Samples per micro-batch per data-parallel rank: Plan.micro_batch / DP."""
    global_batch_size: int
    num_micro_batches: int
    blocks_per_stage: tuple[int, ...]
    even: bool
    """The partition is Megatron's even split of Transformer blocks."""
    accounted: bool = False
    """An interleaved pipeline on the split that counts the embedding and the loss as layers
    (`--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`; gbmw.space.stock_partitions)."""

    @property
    def zero_stage(self) -> int:
        return ZERO_STAGE_OF_AXIS[self.data_axis] if self.data_axis else 0

    @property
    def first_stage_blocks(self) -> int | None:
        """`--decoder-first-pipeline-num-layers` (None for the even and the accounted split)."""
        return None if self.even or self.accounted else self.blocks_per_stage[0]

    @property
    def last_stage_blocks(self) -> int | None:
        return None if self.even or self.accounted else self.blocks_per_stage[-1]


def megatron_layout(plan: Plan, job: JobSpec, target: str) -> MegatronLayout:
    """Read the Megatron layout off `plan`, refusing (gbmw.space.targets) what `target` cannot run."""
    model = job.model
    if len(plan.strategies) != model.num_layers or plan.num_devices != job.cluster.num_devices:
        raise PlanError(
            f"plan for {plan.model} on {plan.num_devices} devices ({len(plan.strategies)} layers) does not fit job "
            f"{job.name}: {model.name} has {model.num_layers} layers on {job.cluster.num_devices} devices"
        )
    # Megatron-DeepSpeed: no TE FP8, no TP communication overlap
    get_target(target).check_precision(plan.precision, plan.gradient_reduce_dtype, plan.tp_comm_overlap,
                                       plan.adam_moments_dtype)
    get_target(target).check(plan, model)
    layout_problem = adam_moments_layout_problem(plan.strategies, plan.adam_moments_dtype)
    if layout_problem:
        raise PlanError(f"{target} cannot run this plan: {layout_problem}")
    strategy = plan.strategies[0]  # one layout for every layer, checked above
    data_axes = [axis for axis, _ in strategy.dims if axis in DATA_PARALLEL_AXES]
    blocks = tuple(blocks_per_stage(model, plan.partition))
    try:
        even = list(plan.partition) == megatron_partition(model, plan.pp)
    except GbmwError:
        even = False
    data_parallel = strategy.data_parallel
    return MegatronLayout(
        tensor_parallel=strategy.tp,
        pipeline_parallel=plan.pp,
        data_parallel=data_parallel,
        data_axis=data_axes[0] if data_axes else None,
        recompute=next((s.recompute for s, layer in zip(plan.strategies, model.layers) if layer.is_block), "none"),
        sequence_parallel=strategy.sp,
        context_parallel=strategy.degree("cp"),
        ulysses=strategy.degree("ulysses"),
        expert_parallel=max(s.ep for s in plan.strategies),
        expert_tensor_parallel=next((s.expert_tensor_parallel for s in plan.strategies if s.ep > 1), strategy.tp),
        micro_batch_size=plan.micro_batch // data_parallel,
        global_batch_size=plan.global_batch,
        num_micro_batches=plan.num_micro_batches,
        blocks_per_stage=blocks,
        even=even,
        accounted=plan.virtual_stages > 1 and interleaved_split(blocks, plan.virtual_stages) == "accounted",
    )


def megatron_blocks_per_stage(num_blocks: int, pp: int, first: int | None = None, last: int | None = None) -> list[int]:
    """Transformer blocks on each pipeline stage, as megatron-core's `get_num_layers_to_build`
    (transformer_block.py) counts them: `first`/`last` on the end stages, the rest split evenly."""
    if pp == 1:
        if first is not None or last is not None:
            raise GbmwError("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1")
        return [num_blocks]
    middle_blocks, middle_stages = num_blocks, pp
    for name, count in (("first", first), ("last", last)):
        if count is not None:
            if count < 1:
                raise GbmwError(f"--decoder-{name}-pipeline-num-layers {count}: every stage needs at least one block")
            middle_blocks, middle_stages = middle_blocks - count, middle_stages - 1
    if middle_stages == 0:
        if middle_blocks != 0:
            raise GbmwError(
                f"--decoder-first-pipeline-num-layers {first} + --decoder-last-pipeline-num-layers {last} = "
                f"{first + last} != --num-layers {num_blocks}"
            )
        return [first, last]
    if middle_blocks < middle_stages or middle_blocks % middle_stages:
        raise GbmwError(
            f"{middle_blocks} blocks left for {middle_stages} middle stages of pp={pp}: not an equal share "
            f"(--num-layers {num_blocks}, first {first}, last {last})"
        )
    share = middle_blocks // middle_stages
    counts = [share] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts
