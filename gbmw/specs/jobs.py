"""A job: a model on a cluster with a precision, an optimizer and batch settings — what `gbmw` plans.

A job file names its model and cluster (bundled recipe names, or paths relative to the job file); loading it
builds the ModelSpec and ClusterSpec and fixes the per-device memory budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from gbmw.errors import SpecError
from gbmw.specs.bundled import resolve_recipe
from gbmw.specs.cluster_spec import ClusterSpec, load_cluster
from gbmw.specs.files import read_yaml
from gbmw.specs.model_spec import Fp8Recipe, ModelSpec, Precision
from gbmw.specs.optimizer_dtypes import (AdamMomentsDtype, GradientReduceDtype, adam_moments_dtype_problem,
                                          gradient_reduce_dtype_problem)
from gbmw.specs.models import load_model
from gbmw.specs.schema import MAX_GLOBAL_BATCH, MAX_SEQUENCE, Frozen, MemorySize, parse_bytes, validate_as


LAUNCH_SETTINGS = ("precision", "fp8_recipe", "gradient_reduce_dtype", "adam_moments_dtype", "tp_comm_overlap")
"""The job's fields a plan carries as its own (gbmw.plan.Plan) and a target must be able to run."""


def check_precision_settings(precision: str, recipe: str, where: str, gradient_reduce_dtype: str = "fp32",
                             optimizer: str = "adam", adam_moments_dtype: str = "fp32") -> None:
    """Raise SpecError where an FP8 scaling recipe other than the default is asked of a precision without FP8, or
    bf16 gradients or bf16 Adam moments of a model that is not bf16 (the moments: of an optimizer that is not Adam)."""
    if recipe != "delayed" and precision != "fp8":
        raise SpecError(f"{where}: fp8_recipe {recipe} scales FP8 tensors, but the precision is {precision}; set "
                        "precision: fp8 or drop fp8_recipe")
    problem = (gradient_reduce_dtype_problem(precision, gradient_reduce_dtype)
               or adam_moments_dtype_problem(precision, optimizer, adam_moments_dtype))
    if problem:
        raise SpecError(f"{where}: {problem}")


class JobSpec(Frozen):
    """A model on a cluster with a precision, an optimizer and batch settings: what `gbmw` plans."""

    name: str
    model: ModelSpec
    cluster: ClusterSpec
    precision: Precision
    fp8_recipe: Fp8Recipe = "delayed"
    """Transformer Engine's FP8 scaling under precision fp8 (gbmw.specs.model_spec.FP8_RECIPES)."""
    gradient_reduce_dtype: GradientReduceDtype = "fp32"
    """The dtype gradients are accumulated and reduced in (gbmw.specs.optimizer_dtypes.GRADIENT_REDUCE_DTYPES)."""
    adam_moments_dtype: AdamMomentsDtype = "fp32"
    """The dtype Adam's moments are kept in (gbmw.specs.optimizer_dtypes.ADAM_MOMENTS_DTYPES)."""
    tp_comm_overlap: bool = False
    """Transformer Engine overlaps the sequence-parallel collectives with the TP GEMMs (gbmw.cost.tp_comm_overlap)."""
    optimizer: Literal["adam", "sgd"] = "adam"
    global_batch: int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH)
    """Fixed global batch (samples per iteration); None lets the planner sweep."""
    max_global_batch: int = Field(default=4096, ge=1, le=MAX_GLOBAL_BATCH)
    """Upper end of the planner's batch sweep."""
    memory_budget_bytes: int = Field(gt=0)
    """Memory the plan may use per device (the cluster's usable memory unless the job overrides it)."""
    source_path: str = ""
    """The job file it was loaded from ("" for a job built in memory)."""
    notes: tuple[str, ...] = ()
    """What loading assumed that the user should hear (an HF config's default sequence length, say)."""

    def model_post_init(self, context: object) -> None:
        check_precision_settings(self.precision, self.fp8_recipe, self.name, self.gradient_reduce_dtype, self.optimizer,
                                 self.adam_moments_dtype)

    def launch_settings(self) -> dict[str, Any]:
        """The settings a plan for this job carries, by the names of gbmw.plan.Plan's fields (LAUNCH_SETTINGS)."""
        return {name: getattr(self, name) for name in LAUNCH_SETTINGS}


class JobFile(Frozen):
    """The YAML of a job: which model and cluster (recipe names or paths relative to the job file)."""

    name: str | None = Field(default=None, min_length=1, max_length=200)
    description: str = ""
    model: str
    """A model recipe name (recipes/models/NAME.yaml), a model YAML path, or an HF config.json path."""
    cluster: str
    """A cluster recipe name (recipes/clusters/NAME.yaml) or a cluster YAML path."""
    precision: Precision
    fp8_recipe: Fp8Recipe = "delayed"
    """Under precision fp8: `delayed` (Transformer Engine's DelayedScaling) or `current` (Float8CurrentScaling,
    megatron-core's `--fp8-recipe tensorwise`)."""
    gradient_reduce_dtype: GradientReduceDtype = "fp32"
    """Under precision bf16 or fp8: `fp32` (fp32 main gradients, Megatron's default) or `bf16` (megatron-core's
    `--grad-reduce-in-bf16`: half the gradient memory and traffic; only --target megatron-core runs it)."""
    adam_moments_dtype: AdamMomentsDtype = "fp32"
    """Under precision bf16 or fp8 with Adam: `fp32` or `bf16` (megatron-core's precision-aware optimizer,
    `--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16`: 8 bytes of optimizer state per parameter instead of 12; only
    --target megatron-core runs it, under its distributed optimizer)."""
    tp_comm_overlap: bool = False
    """Transformer Engine's userbuffers overlap the sequence-parallel all-gathers and reduce-scatters with the TP
    GEMMs (megatron-core's `--tp-comm-overlap`; NeMo's `ub_tp_comm_overlap`); only --target megatron-core runs it."""
    optimizer: Literal["adam", "sgd"] = "adam"
    global_batch: int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH)
    max_global_batch: int = Field(default=4096, ge=1, le=MAX_GLOBAL_BATCH)
    memory_budget: MemorySize | None = None
    """Per-device memory the plan may use; default: the device memory less `reserved_memory`."""
    seq_length: int | None = Field(default=None, ge=1, le=MAX_SEQUENCE)
    """Tokens per training sample; default: the model file's (an HF config.json: its max_position_embeddings)."""
    flash_attention: bool | None = None
    """Attention is fused (FlashAttention: no score matrix stored); default: as the model file says (HF: no)."""


def load_job(path: str | Path, memory_budget: str | int | None = None, seq_length: int | None = None,
             flash_attention: bool | None = None) -> JobSpec:
    """Load a job file (or a bundled job recipe by name) with its model and cluster resolved.

    `memory_budget` (e.g. "16GiB"), `seq_length` and `flash_attention` override the job's.
    """
    path = resolve_recipe(str(path), "jobs")
    job = validate_as(JobFile, read_yaml(path), str(path))
    check_precision_settings(job.precision, job.fp8_recipe, str(path), job.gradient_reduce_dtype, job.optimizer,
                             job.adam_moments_dtype)
    model_path = resolve_recipe(job.model, "models", path.parent)
    cluster_path = resolve_recipe(job.cluster, "clusters", path.parent)
    cluster = load_cluster(cluster_path)
    notes: list[str] = []
    model = load_model(model_path, job.precision, seq_length or job.seq_length,
                       job.flash_attention if flash_attention is None else flash_attention, notes)
    cluster.linear_flops(job.precision)  # fails early, naming the precisions the device supports (fp8: its FP8 rate)
    cluster.sustained_flops(job.precision)  # fp8: and bf16's, for everything but the FP8 linears
    if memory_budget is not None:
        budget = parse_bytes(memory_budget, "--memory")
    elif job.memory_budget is not None:
        budget = int(job.memory_budget)
    else:
        budget = cluster.usable_memory_bytes
    if budget <= 0:
        raise SpecError(f"{path}: memory budget {budget} bytes is not positive; give e.g. --memory 16GiB")
    return JobSpec(
        name=job.name or path.stem,
        model=model,
        cluster=cluster,
        precision=job.precision,
        fp8_recipe=job.fp8_recipe,
        gradient_reduce_dtype=job.gradient_reduce_dtype,
        adam_moments_dtype=job.adam_moments_dtype,
        tp_comm_overlap=job.tp_comm_overlap,
        optimizer=job.optimizer,
        global_batch=job.global_batch,
        max_global_batch=job.max_global_batch,
        memory_budget_bytes=budget,
        source_path=str(path),
        notes=tuple(notes),
    )
