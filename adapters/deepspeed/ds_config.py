"""Plan → ds_config: the layout read off a plan, the `zero_optimization` and
`activation_checkpointing` sections, the PipelineModule partition method, and the plan fields a
ds_config fixes (round trips). The mapping is documented in gbmw.adapters.deepspeed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gbmw.errors import GbmwError, PlanError
from gbmw.plan import Plan
from gbmw.space.stock_partitions import least_spread_partition, uniform_first_partition
from gbmw.space.strategy import DATA_PARALLEL_AXES
from gbmw.space.targets import AXIS_OF_ZERO_STAGE, ZERO_STAGE_OF_AXIS, get_target
from gbmw.specs.jobs import JobSpec
from gbmw.specs.model_spec import ModelSpec

from .user_config import check_batch_consistency, resolve_batch

DEEPSPEED_TARGETS = ("deepspeed", "megatron-deepspeed")


@dataclass(frozen=True)
class _Layout:
    """The one parallel layout a DeepSpeed plan has (the target's check guarantees it is one)."""

    tp: int
    pp: int
    dp: int
    data_parallel_axis: str | None
    ckpt: bool


def _layout(plan: Plan, model: ModelSpec) -> _Layout:
    first = plan.strategies[0]
    axes = [axis for axis, _ in first.dims if axis in DATA_PARALLEL_AXES]
    blocks = [s for s, layer in zip(plan.strategies, model.layers) if layer.is_block]
    return _Layout(
        tp=first.tp,
        pp=plan.pp,
        dp=plan.num_devices // (first.tp * plan.pp * first.sequence_parallel_degree),
        data_parallel_axis=axes[0] if axes else None,
        ckpt=any(strategy.ckpt for strategy in blocks),
    )


# ----------------------------------------------------------------------------------------------
# Plan → ds_config
# ----------------------------------------------------------------------------------------------


def plan_to_ds_config(plan: Plan, job: JobSpec, target: str = "deepspeed") -> dict[str, Any]:
    """The DeepSpeed config for `plan`: a new plain JSON-able dict holding only `OWNED_KEYS`.

    Raises PlanError with the target's reasons when `target` ("deepspeed", or
    "megatron-deepspeed" which adds Megatron TP) cannot run the plan, or when the plan is not for
    this job. For pp > 1, pass `pipeline_partition_method(plan, model)` to the PipelineModule.
    """
    if target not in DEEPSPEED_TARGETS:
        raise PlanError(f"target {target!r}: a DeepSpeed config serves {list(DEEPSPEED_TARGETS)}")
    _check_plan_is_for(plan, job)
    # no TE FP8 linears, fp32 grads, no TP communication overlap
    get_target(target).check_precision(plan.precision, plan.gradient_reduce_dtype, plan.tp_comm_overlap,
                                       plan.adam_moments_dtype)
    get_target(target).check(plan, job.model)
    layout = _layout(plan, job.model)
    stage = ZERO_STAGE_OF_AXIS[layout.data_parallel_axis] if layout.data_parallel_axis else 0
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch // layout.dp,
        "gradient_accumulation_steps": plan.num_micro_batches,
        "zero_optimization": _zero_section(stage, job.model, layout.tp),
        "bf16": {"enabled": job.precision == "bf16"},
        "fp16": {"enabled": job.precision == "fp16"},
    }
    if layout.ckpt:
        config["activation_checkpointing"] = _activation_checkpointing_section()
    if plan.pp > 1:
        config["pipeline"] = {"activation_checkpoint_interval": 1 if layout.ckpt else 0}
    return config


def _check_plan_is_for(plan: Plan, job: JobSpec) -> None:
    if plan.model != job.model.name:
        raise PlanError(f"the plan is for model {plan.model!r} but job {job.name} trains {job.model.name!r}")
    if plan.precision != job.precision:
        raise PlanError(
            f"the plan was made for {plan.precision} but job {job.name} trains in {job.precision}; plan again"
        )
    plan.check_against(job.model, job.cluster.num_devices)


def _zero_section(stage: int, model: ModelSpec, tp: int) -> dict[str, Any]:
    """`zero_optimization` (DeepSpeedZeroConfig).

    stage >= 1: `overlap_comm` true — the estimate overlaps backward gradient communication with
    compute (DeepSpeed's default is true only for stage 3); `contiguous_gradients` true (its
    default, stated); `reduce_bucket_size` = hidden² elements, HF Transformers' rule for "auto"
    (DeepSpeed's default 5e8 elements is a 2 GB fp32 bucket the estimate does not count).
    stage 3 adds HF's `stage3_prefetch_bucket_size` = 0.9·hidden² and
    `stage3_param_persistence_threshold` = 10·hidden (norms and biases stay unsharded), and
    `stage3_max_live_parameters` = the largest layer's parameters on one device: the estimate
    holds one gathered layer at a time (cost.py), DeepSpeed's default 1e9 lets several stay.
    """
    section: dict[str, Any] = {"stage": stage}
    if stage == 0:
        return section
    hidden = model.hidden_size
    section.update(overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=hidden * hidden)
    if stage == 3:
        local = [layer.parameter_count - layer.tp_split_parameter_count + math.ceil(layer.tp_split_parameter_count / tp)
                 for layer in model.layers]
        section.update(
            stage3_prefetch_bucket_size=int(0.9 * hidden * hidden),
            stage3_param_persistence_threshold=10 * hidden,
            stage3_max_live_parameters=max(local),
        )
    return section


def _activation_checkpointing_section() -> dict[str, Any]:
    """`activation_checkpointing` (DeepSpeedActivationCheckpointingConfig), as the estimate models
    CKPT: each block stashes its whole input on every TP rank (`partition_activations` false), on
    the device (`cpu_checkpointing` false), with no preallocated checkpoint buffer
    (`contiguous_memory_optimization` false, so `number_checkpoints` is not needed). The section
    configures `deepspeed.checkpointing`; the model (or PipelineModule) chooses what to recompute."""
    return {"partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False}


# ----------------------------------------------------------------------------------------------
# Pipeline partition
# ----------------------------------------------------------------------------------------------


# DeepSpeed's partition methods are gbmw.space.stock_partitions' rules (the planner needs them without torch);
# tests/test_deepspeed_adapter.py checks them against DeepSpeed's own functions.
deepspeed_partition_uniform = uniform_first_partition
deepspeed_partition_balanced = least_spread_partition


def deepspeed_partitions(model: ModelSpec, pp: int, target: str = "deepspeed") -> dict[str, list[int]]:
    """The partition each PipelineModule method of `target` gives `model` over `pp` stages (gbmw.space.targets):
    `uniform` and `parameters` for DeepSpeed; `type:transformer` for Megatron-DeepSpeed, whose GPTModelPipe
    balances the count of ParallelTransformerLayerPipe layers — Megatron's even split of blocks."""
    return {method: list(partition) for method, partition in get_target(target).partitions(model, pp).items()}


def pipeline_partition_method(plan: Plan, model: ModelSpec, target: str | None = None) -> str:
    """The PipelineModule `partition_method` that reproduces `plan.partition`: "uniform" or
    "parameters" for DeepSpeed, "type:transformer" for Megatron-DeepSpeed (its GPTModelPipe
    hard-codes it). `target` defaults to the plan's when that is a DeepSpeed target, else
    "deepspeed". PlanError if no method gives the plan's partition."""
    if target is None:
        target = plan.target if plan.target in DEEPSPEED_TARGETS else "deepspeed"
    if target not in DEEPSPEED_TARGETS:
        raise PlanError(f"target {target!r}: pipeline partition methods exist for {list(DEEPSPEED_TARGETS)}")
    method = get_target(target).partition_method(model, plan.partition)
    if method is not None:
        return method
    methods = deepspeed_partitions(model, plan.pp, target)
    offered = "; ".join(f"{method}: {partition}" for method, partition in methods.items())
    raise PlanError(
        f"partition {list(plan.partition)} is what no {target} PipelineModule partition_method gives ({offered}); "
        f"plan again with --target {target} or run it with --target runtime"
    )


# ----------------------------------------------------------------------------------------------
# ds_config → plan fields (round trips)
# ----------------------------------------------------------------------------------------------


def ds_config_to_plan_fields(config: dict[str, Any], world_size: int, tp: int = 1, pp: int = 1) -> dict[str, Any]:
    """The Plan fields a ds_config fixes, for `world_size` devices with TP `tp` and PP `pp`:
    global_batch, micro_batch (all DP replicas), num_micro_batches, data_parallel_axis (dp, z1dp,
    z2dp, sdp; None when DP = 1), zero_stage, ckpt and precision. Missing batch keys are completed
    as DeepSpeed completes them."""
    if tp < 1 or pp < 1 or world_size % (tp * pp):
        raise GbmwError(f"world_size({world_size}) % (tp({tp}) * pp({pp})) != 0")
    data_parallel = world_size // (tp * pp)
    check_batch_consistency(config, world_size, tp * pp)
    train, micro, accum = resolve_batch(config, data_parallel)
    zero = config.get("zero_optimization", {})
    if isinstance(zero, bool):  # DeepSpeed's deprecated form: true means stage 1
        zero = {"stage": int(zero)}
    stage = int(zero.get("stage", 0)) if isinstance(zero, dict) else 0
    if stage not in AXIS_OF_ZERO_STAGE:
        raise GbmwError(f"zero_optimization.stage: value {stage!r} — DeepSpeed's stages are 0, 1, 2 and 3")
    bf16 = config.get("bf16", config.get("bfloat16", {}))
    interval = config.get("pipeline", {}).get("activation_checkpoint_interval", 0) if pp > 1 else 0
    return {
        "global_batch": train,
        "micro_batch": micro * data_parallel,
        "num_micro_batches": accum,
        "data_parallel_axis": AXIS_OF_ZERO_STAGE[stage] if data_parallel > 1 else None,
        "zero_stage": stage,
        "ckpt": "activation_checkpointing" in config or bool(interval),
        "precision": "bf16" if bf16.get("enabled") else "fp16" if config.get("fp16", {}).get("enabled") else "fp32",
    }


def plan_layout(plan: Plan, model: ModelSpec) -> tuple[int, int, int]:
    """(model-parallel width, pp, dp) of a plan DeepSpeed can run — the arguments `validate_with_deepspeed` needs.
    The width is TP times the sequence-parallel (Ulysses) degree: the ranks of a stage that share samples, which
    DeepSpeed's batch arithmetic (train_batch_size = micro × accumulation × dp) leaves out of dp."""
    layout = _layout(plan, model)
    return layout.tp * plan.strategies[0].sequence_parallel_degree, layout.pp, layout.dp
