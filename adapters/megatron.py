"""Plan → Megatron-LM / Megatron-DeepSpeed arguments and megatron-core configs, and back.

A stock Megatron job runs a *uniform 3D* plan: one layout for every layer — TP on consecutive
ranks, data parallelism outside it, pipeline stages outermost — one recomputation setting for all
Transformer blocks, and Megatron's pipeline split. `gbmw.targets` decides whether a
plan is one; this module only translates the plans it accepts. Targets:

* ``megatron-core`` (alias ``megatron-lm``): NVIDIA Megatron-LM's ``pretrain_gpt.py``, whose model is
  megatron-core's GPTModel built from a ``TransformerConfig``. Flags from
  ``megatron/training/arguments.py`` (``_add_distributed_args``, ``_add_training_args``,
  ``_add_network_size_args``, ``_add_mixed_precision_args``, ``_add_data_args``).
* ``megatron-deepspeed``: Microsoft's Megatron-DeepSpeed fork; DeepSpeed's engine holds ZeRO and the
  pipeline. Flags from its ``megatron/arguments.py`` (``--zero-stage`` in ``_add_zero_args``),
  DeepSpeed's ``add_config_arguments`` (``--deepspeed``, ``--deepspeed_config``) and the fork's
  ``examples_deepspeed`` scripts (``--no-pipeline-parallel``, ``--deepspeed-activation-checkpointing``,
  ``--normalization rmsnorm``, ``--use-rotary-position-embeddings``, ``--num-key-value-heads``).

What a plan says, and the flag that says it::

    Plan                              megatron-core / Megatron-LM            Megatron-DeepSpeed
    tp of the layout                  --tensor-model-parallel-size           same
    pp                                --pipeline-model-parallel-size         same; pp = 1: --no-pipeline-parallel
    micro_batch / DP                  --micro-batch-size                     same
    global_batch                      --global-batch-size                    same
    z1dp (ZeRO-1)                     --use-distributed-optimizer            --zero-stage 1
    dp / z2dp / sdp                   (plain DDP) / refused / refused        --zero-stage 0 / 2 / 3
    +ckpt on every block              --recompute-granularity full --recompute-method uniform
                                      --recompute-num-layers 1               same + --deepspeed-activation-checkpointing
    uneven first/last stages          --decoder-first-pipeline-num-layers    refused (even split only)
                                      --decoder-last-pipeline-num-layers
    precision                         --bf16 / --fp16 (none for fp32)        same

Megatron places the embedding on the first stage and the output layer on the last, and
``--num-layers`` counts Transformer blocks only; in a Plan the embedding and head are layers, so
stage 0 of ``partition`` holds one more layer than its blocks and the last stage one more.
"""

from __future__ import annotations

import argparse
import re
import shlex
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

from gbmw.architectures import GPTArchitecture
from gbmw.errors import GbmwError, PlanError
from gbmw.jobs import JobSpec
from gbmw.plan import Plan
from gbmw.stock_partitions import blocks_per_stage, megatron_partition, megatron_stage_partition
from gbmw.targets import AXIS_OF_ZERO_STAGE, ZERO_STAGE_OF_AXIS, get_target
from gbmw.space import Strategy

TARGETS = ("megatron-core", "megatron-lm", "megatron-deepspeed")
LAUNCHERS = ("torchrun", "deepspeed")

#: Flags that change the parallel layout or memory in ways a gbmw Plan does not describe; reading
#: them back would silently drop their meaning, so `megatron_args_to_plan` refuses them.
UNMODELLED_FLAGS = {
    "--context-parallel-size": "context parallelism",
    "--sequence-parallel": "sequence parallelism",
    "--expert-model-parallel-size": "expert parallelism",
    "--num-layers-per-virtual-pipeline-stage": "interleaved (virtual) pipeline stages",
    "--num-virtual-stages-per-pipeline-rank": "interleaved (virtual) pipeline stages",
    "--pipeline-model-parallel-layout": "a custom pipeline layout",
    "--account-for-embedding-in-pipeline-split": "the embedding counted as a pipeline layer",
    "--account-for-loss-in-pipeline-split": "the loss counted as a pipeline layer",
    "--use-torch-fsdp2": "FSDP2 sharding",
    "--use-megatron-fsdp": "Megatron FSDP sharding",
    "--recompute-activations": "selective recomputation",
    "--checkpoint-activations": "the legacy recomputation flag (write --recompute-granularity full "
                                "--recompute-method uniform --recompute-num-layers 1)",
    "--distribute-saved-activations": "recomputed activations split across TP ranks",
}
DEEPSPEED_REFUSED_FLAGS = {
    "--decoder-first-pipeline-num-layers": "uneven pipeline stages (DeepSpeed's pipeline engine splits evenly here)",
    "--decoder-last-pipeline-num-layers": "uneven pipeline stages (DeepSpeed's pipeline engine splits evenly here)",
    "--use-distributed-optimizer": "Megatron's distributed optimizer (Megatron-DeepSpeed shards through --zero-stage)",
}


def plan_target(target: str) -> str:
    """The gbmw.targets target a Megatron front end is checked as (`megatron-lm` runs megatron-core)."""
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
    blocks = sum(layer.is_block for layer in job.model.layers)
    if architecture.num_layers != blocks:
        raise GbmwError(
            f"model {job.model.name}: its architecture has num_layers {architecture.num_layers} but the model has "
            f"{blocks} Transformer blocks"
        )
    return architecture


def _architecture_values(arch: GPTArchitecture, target: str) -> dict[str, Any]:
    """{argparse dest: value} of the model flags for `arch` under `target` (None: flag absent)."""
    deepspeed = target == "megatron-deepspeed"
    kv_heads = arch.num_kv_heads if arch.num_kv_heads not in (None, arch.num_heads) else None
    values: dict[str, Any] = {
        "num_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "ffn_hidden_size": arch.ffn_hidden_size or 4 * arch.hidden_size,
        "num_attention_heads": arch.num_heads,
        "seq_length": arch.seq_length,
        "max_position_embeddings": arch.seq_length,
        "swiglu": arch.gated_mlp,
        "disable_bias_linear": not arch.bias,
        "untie_embeddings_and_output_weights": not arch.tie_embeddings,
        "attention_dropout": None if arch.dropout else 0.0,
        "hidden_dropout": None if arch.dropout else 0.0,
    }
    if deepspeed:
        values["num_key_value_heads"] = kv_heads
        values["normalization"] = "rmsnorm" if arch.norm == "rms" else None
        values["use_rotary_position_embeddings"] = arch.position_embedding == "rotary"
        values["use_flash_attn_v2"] = arch.attention == "flash"
    else:
        values["group_query_attention"] = kv_heads is not None
        values["num_query_groups"] = kv_heads
        values["normalization"] = "RMSNorm" if arch.norm == "rms" else None
        values["position_embedding_type"] = "rope" if arch.position_embedding == "rotary" else None
    return values


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _architecture_args(arch: GPTArchitecture, target: str) -> list[str]:
    args: list[str] = []
    for dest, value in _architecture_values(arch, target).items():
        if value is None or value is False:
            continue
        args += [_flag(dest)] if value is True else [_flag(dest), _number(value)]
    return args


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


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
    recompute: bool
    """Every Transformer block recomputes (full, uniform, one layer per unit)."""
    micro_batch_size: int
    """Samples per micro-batch per data-parallel rank: Plan.micro_batch / DP."""
    global_batch_size: int
    num_micro_batches: int
    blocks_per_stage: tuple[int, ...]
    even: bool
    """The partition is Megatron's even split of Transformer blocks."""

    @property
    def zero_stage(self) -> int:
        return ZERO_STAGE_OF_AXIS[self.data_axis] if self.data_axis else 0

    @property
    def first_stage_blocks(self) -> int | None:
        """`--decoder-first-pipeline-num-layers` (None for the even split)."""
        return None if self.even else self.blocks_per_stage[0]

    @property
    def last_stage_blocks(self) -> int | None:
        return None if self.even else self.blocks_per_stage[-1]


def megatron_layout(plan: Plan, job: JobSpec, target: str) -> MegatronLayout:
    """Read the Megatron layout off `plan`, refusing (gbmw.targets) what `target` cannot run."""
    model = job.model
    if len(plan.strategies) != model.num_layers or plan.num_devices != job.cluster.num_devices:
        raise PlanError(
            f"plan for {plan.model} on {plan.num_devices} devices ({len(plan.strategies)} layers) does not fit job "
            f"{job.name}: {model.name} has {model.num_layers} layers on {job.cluster.num_devices} devices"
        )
    get_target(target).check(plan, model)
    strategy = plan.strategies[0]  # one layout for every layer, checked above
    data_axes = [axis for axis, _ in strategy.dims if axis != "tp"]
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
        recompute=any(s.ckpt for s, layer in zip(plan.strategies, model.layers) if layer.is_block),
        micro_batch_size=plan.micro_batch // data_parallel,
        global_batch_size=plan.global_batch,
        num_micro_batches=plan.num_micro_batches,
        blocks_per_stage=blocks,
        even=even,
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


# ----------------------------------------------------------------------------------------------
# Plan → arguments
# ----------------------------------------------------------------------------------------------


def plan_to_megatron_args(
    plan: Plan, job: JobSpec, target: str = "megatron-core", *, deepspeed_config: str = "ds_config.json"
) -> list[str]:
    """Megatron-LM (megatron-core) or Megatron-DeepSpeed arguments that run `plan` for `job`.

    Only what the plan decides plus the architecture: data, tokenizer, optimizer and schedule
    flags are the user's. `deepspeed_config` is the path given to ``--deepspeed_config``
    (megatron-deepspeed only; write the file with gbmw.adapters.deepspeed). Raises PlanError with
    the target's reasons when `target` cannot run the plan.
    """
    plan.check_against(job.model, job.cluster.num_devices)
    layout = megatron_layout(plan, job, target)
    arch = gpt_architecture(job)
    deepspeed = target == "megatron-deepspeed"
    args = [
        "--tensor-model-parallel-size", str(layout.tensor_parallel),
        "--pipeline-model-parallel-size", str(layout.pipeline_parallel),
    ]
    if deepspeed and layout.pipeline_parallel == 1:
        args.append("--no-pipeline-parallel")  # a 1-stage PipelineModule would refuse ZeRO-2/3
    if layout.first_stage_blocks is not None:
        args += ["--decoder-first-pipeline-num-layers", str(layout.first_stage_blocks),
                 "--decoder-last-pipeline-num-layers", str(layout.last_stage_blocks)]
    args += [
        "--micro-batch-size", str(layout.micro_batch_size),
        "--global-batch-size", str(layout.global_batch_size),
    ]
    args += _architecture_args(arch, target)
    if plan.precision in ("bf16", "fp16"):
        args.append(f"--{plan.precision}")
    if layout.recompute:
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        if deepspeed:
            args.append("--deepspeed-activation-checkpointing")
    if deepspeed:
        args += ["--deepspeed", "--deepspeed_config", deepspeed_config, "--zero-stage", str(layout.zero_stage)]
    elif layout.data_axis == "z1dp":
        args.append("--use-distributed-optimizer")
    return args


# ----------------------------------------------------------------------------------------------
# Arguments → plan
# ----------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print and exit
        raise GbmwError(f"Megatron arguments: {message}")


def _parser(target: str) -> _Parser:
    """An argparse parser for the flags `plan_to_megatron_args` emits for `target` (not Megatron's own)."""
    parser = _Parser(prog=f"gbmw {target} arguments", add_help=False, allow_abbrev=False)
    add = parser.add_argument
    add("--tensor-model-parallel-size", type=int, default=1)
    add("--pipeline-model-parallel-size", type=int, default=1)
    add("--micro-batch-size", type=int)
    add("--global-batch-size", type=int)
    for dest in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "seq_length",
                 "max_position_embeddings"):
        add(_flag(dest), type=int)
    for dest in ("swiglu", "disable_bias_linear", "untie_embeddings_and_output_weights", "bf16", "fp16"):
        add(_flag(dest), action="store_true")
    add("--attention-dropout", type=float)
    add("--hidden-dropout", type=float)
    add("--recompute-granularity", choices=["full", "selective"])
    add("--recompute-method", choices=["uniform", "block"])
    add("--recompute-num-layers", type=int)
    if target == "megatron-deepspeed":
        add("--num-key-value-heads", type=int)
        add("--normalization", choices=["layernorm", "rmsnorm"])
        add("--use-rotary-position-embeddings", action="store_true")
        add("--use-flash-attn-v2", action="store_true")
        add("--no-pipeline-parallel", action="store_true")
        add("--deepspeed-activation-checkpointing", action="store_true")
        add("--deepspeed", action="store_true")
        add("--deepspeed_config")
        add("--zero-stage", type=int, default=0)
    else:
        add("--group-query-attention", action="store_true")
        add("--num-query-groups", type=int)
        add("--normalization", choices=["LayerNorm", "RMSNorm"])
        add("--position-embedding-type", choices=["learned_absolute", "rope", "mrope", "relative", "none"])
        add("--decoder-first-pipeline-num-layers", type=int)
        add("--decoder-last-pipeline-num-layers", type=int)
        add("--use-distributed-optimizer", action="store_true")
    return parser


def _parse(args: Sequence[str], target: str) -> argparse.Namespace:
    namespace, unknown = _parser(target).parse_known_args(list(args))
    refused = dict(UNMODELLED_FLAGS)
    if target == "megatron-deepspeed":
        refused.update(DEEPSPEED_REFUSED_FLAGS)
    problems = [f"{token} ({refused[token.split('=')[0]]})" for token in unknown if token.split("=")[0] in refused]
    if problems:
        raise GbmwError(f"Megatron arguments use what a gbmw plan does not describe: {'; '.join(problems)}")
    return namespace


def _check_architecture(namespace: argparse.Namespace, arch: GPTArchitecture, target: str, job: JobSpec) -> None:
    """Every model flag must describe the job's model (absent flags take Megatron's defaults)."""
    defaults = {"normalization": {"megatron-deepspeed": "layernorm"}.get(target, "LayerNorm"),
                "position_embedding_type": "learned_absolute", "attention_dropout": 0.1, "hidden_dropout": 0.1,
                "ffn_hidden_size": 4 * (namespace.hidden_size or 0)}
    mismatches = []
    for dest, expected in _architecture_values(arch, target).items():
        given = getattr(namespace, dest)
        expected = defaults.get(dest) if expected is None else expected
        given = defaults.get(dest) if given is None else given
        if given != expected:
            mismatches.append(f"{_flag(dest)} {given!r} (the model needs {expected!r})")
    if mismatches:
        raise GbmwError(f"Megatron arguments do not describe {job.model.name} of job {job.name}: "
                        + "; ".join(mismatches))


def _recompute(namespace: argparse.Namespace) -> bool:
    granularity, method = namespace.recompute_granularity, namespace.recompute_method
    count = namespace.recompute_num_layers
    if granularity is None:
        if method is not None or count is not None:
            raise GbmwError("--recompute-method/--recompute-num-layers without --recompute-granularity full")
        return False
    if granularity != "full" or method != "uniform" or count != 1:
        raise GbmwError(
            f"--recompute-granularity {granularity} --recompute-method {method} --recompute-num-layers {count}: "
            "a gbmw plan recomputes whole blocks one at a time (full, uniform, 1) or none"
        )
    return True


def megatron_args_to_plan(args: Sequence[str], job: JobSpec, target: str = "megatron-core") -> Plan:
    """The Plan that Megatron arguments (as `plan_to_megatron_args` writes them) run for `job`.

    The inverse of `plan_to_megatron_args` wherever `target` can express the plan: TP innermost,
    then the data-parallel axis (ZeRO level from --use-distributed-optimizer or --zero-stage),
    +ckpt on every Transformer block when recomputation is on. Flags it does not know are ignored
    unless they change the layout (UNMODELLED_FLAGS), which is refused.
    """
    checked_target = plan_target(target)
    namespace = _parse(args, target)
    arch = gpt_architecture(job)
    _check_architecture(namespace, arch, target, job)
    precision = "bf16" if namespace.bf16 else "fp16" if namespace.fp16 else "fp32"
    if namespace.bf16 and namespace.fp16:
        raise GbmwError("Megatron arguments give both --bf16 and --fp16")
    if precision != job.precision:
        raise GbmwError(f"Megatron arguments train in {precision} but job {job.name} trains in {job.precision}")

    devices = job.cluster.num_devices
    tp, pp = namespace.tensor_model_parallel_size, namespace.pipeline_model_parallel_size
    if tp < 1 or pp < 1 or devices % (tp * pp):
        raise GbmwError(f"devices({devices}) % (tensor({tp}) * pipeline({pp}) = {tp * pp}) != 0")
    dp = devices // (tp * pp)
    if namespace.micro_batch_size is None or namespace.global_batch_size is None:
        raise GbmwError("Megatron arguments need --micro-batch-size and --global-batch-size")
    micro_batch = namespace.micro_batch_size * dp
    if micro_batch < 1 or namespace.global_batch_size % micro_batch:
        raise GbmwError(
            f"--global-batch-size {namespace.global_batch_size} is not a multiple of --micro-batch-size "
            f"{namespace.micro_batch_size} * data-parallel size {dp} = {micro_batch}"
        )

    if target == "megatron-deepspeed":
        if not namespace.deepspeed:
            raise GbmwError("Megatron-DeepSpeed arguments without --deepspeed run no ZeRO; add --deepspeed")
        if namespace.zero_stage not in AXIS_OF_ZERO_STAGE:
            raise GbmwError(f"--zero-stage {namespace.zero_stage}: ZeRO stages are 0, 1, 2 and 3")
        if namespace.no_pipeline_parallel and pp != 1:
            raise GbmwError(f"--no-pipeline-parallel with --pipeline-model-parallel-size {pp}")
        data_axis = AXIS_OF_ZERO_STAGE[namespace.zero_stage]
        first = last = None
    else:
        data_axis = "z1dp" if namespace.use_distributed_optimizer else "dp"
        first, last = namespace.decoder_first_pipeline_num_layers, namespace.decoder_last_pipeline_num_layers
    dims = ((("tp", tp),) if tp > 1 else ()) + (((data_axis, dp),) if dp > 1 else ())
    recompute = _recompute(namespace)
    strategies = tuple(Strategy(dims, recompute and layer.is_block) for layer in job.model.layers)
    partition = tuple(megatron_stage_partition(job.model, megatron_blocks_per_stage(arch.num_layers, pp, first, last)))
    plan = Plan(
        model=job.model.name,
        cluster=job.cluster.name,
        num_devices=devices,
        precision=precision,
        global_batch=namespace.global_batch_size,
        micro_batch=micro_batch,
        num_micro_batches=namespace.global_batch_size // micro_batch,
        pp=pp,
        partition=partition,
        strategies=strategies,
        target=checked_target,
        provenance={"made_by": "megatron_args_to_plan", "target": target},
    )
    plan.check_against(job.model, devices)
    get_target(checked_target).check(plan, job.model)
    return plan


# ----------------------------------------------------------------------------------------------
# Plan → megatron-core's own config dataclasses
# ----------------------------------------------------------------------------------------------


def _megatron_core():
    """torch and megatron-core's config classes, imported only when configs are built (the planner
    never imports torch); megatron-core's import-time warnings about missing TE/Apex are muted."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            from megatron.core import ModelParallelConfig
            from megatron.core.transformer import TransformerConfig
            from megatron.core.transformer.transformer_block import get_num_layers_to_build
    except ImportError as error:
        raise GbmwError(
            f"megatron-core configs need the runtime extra (pip install 'gbmw[runtime]'): {error}"
        ) from None
    return torch, ModelParallelConfig, TransformerConfig, get_num_layers_to_build


def _construct(config_class: type, kwargs: dict[str, Any]) -> Any:
    """`config_class(**kwargs)`; megatron-core's __post_init__ validation is the check, and its
    ValueError/AssertionError becomes one GbmwError naming the fields (and values) it is about."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return config_class(**kwargs)
    except (ValueError, AssertionError, TypeError) as error:
        message = str(error).strip() or type(error).__name__
        named = [name for name in kwargs if re.search(rf"\b{name}\b", message)]
        named = named or [name for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers")
                          if name in kwargs]
        shown = ", ".join(f"{name}={kwargs[name]!r}" for name in named)
        raise GbmwError(f"megatron-core {config_class.__name__} rejects the plan: {message} [{shown}]") from None


def plan_to_megatron_core_configs(plan: Plan, job: JobSpec) -> tuple[Any, Any]:
    """megatron-core's (ModelParallelConfig, TransformerConfig) for `plan`, built on any machine.

    Fields (megatron-core 0.16): tensor/pipeline_model_parallel_size, sequence_parallel=False,
    params_dtype = pipeline_dtype from the precision with bf16/fp16, use_cpu_initialization=True and
    gradient_accumulation_fusion=False (no CUDA extension needed), the GPT widths, recompute_granularity
    "full" / recompute_method "uniform" / recompute_num_layers 1 for +ckpt blocks, and
    num_layers_in_first/last_pipeline_stage for uneven stages (what Megatron-LM's
    core_transformer_config_from_args sets from --decoder-first/last-pipeline-num-layers). Their
    __post_init__ validates; the per-stage block counts megatron-core would build
    (get_num_layers_to_build) are then checked against the plan's partition.
    """
    layout = megatron_layout(plan, job, "megatron-core")
    arch = gpt_architecture(job)
    torch, ModelParallelConfig, TransformerConfig, get_num_layers_to_build = _megatron_core()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[plan.precision]
    parallel = dict(
        tensor_model_parallel_size=layout.tensor_parallel,
        pipeline_model_parallel_size=layout.pipeline_parallel,
        sequence_parallel=False,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=plan.precision == "bf16",
        fp16=plan.precision == "fp16",
        use_cpu_initialization=True,
        gradient_accumulation_fusion=False,
    )
    kv_heads = arch.num_kv_heads if arch.num_kv_heads not in (None, arch.num_heads) else None
    transformer = dict(
        parallel,
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=kv_heads,
        ffn_hidden_size=arch.ffn_hidden_size or 4 * arch.hidden_size,
        add_bias_linear=arch.bias,
        normalization="RMSNorm" if arch.norm == "rms" else "LayerNorm",
        num_layers_in_first_pipeline_stage=layout.first_stage_blocks,
        num_layers_in_last_pipeline_stage=layout.last_stage_blocks,
    )
    if arch.gated_mlp:
        transformer.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
    if not arch.dropout:
        transformer.update(hidden_dropout=0.0, attention_dropout=0.0)
    if layout.recompute:
        transformer.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    parallel_config = _construct(ModelParallelConfig, parallel)
    transformer_config = _construct(TransformerConfig, transformer)
    try:
        built = [get_num_layers_to_build(transformer_config, pp_rank=stage)
                 for stage in range(layout.pipeline_parallel)]
    except AssertionError as error:
        raise GbmwError(f"megatron-core cannot split the blocks of this plan: {error}") from None
    if tuple(built) != layout.blocks_per_stage:
        raise GbmwError(
            f"megatron-core would build {built} blocks per stage, the plan has {list(layout.blocks_per_stage)}"
        )
    return parallel_config, transformer_config


# ----------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------


def _shell_word(text: str) -> str:
    """A shell word: shlex-quoted, except that `$VAR` references stay expandable (double quotes)."""
    if "$" in text and re.fullmatch(r"[\w$.:{}/-]+", text):
        return f'"{text}"'
    return shlex.quote(text)


def launch_line(
    plan: Plan,
    job: JobSpec,
    script: str = "pretrain_gpt.py",
    target: str = "megatron-core",
    *,
    launcher: str | None = None,
    hostfile: str = "hostfile",
    rdzv_endpoint: str = "$MASTER_ADDR:$MASTER_PORT",
    deepspeed_config: str = "ds_config.json",
    extra_args: Sequence[str] = (),
) -> str:
    """One shell command that launches `script` on the job's cluster with the plan's arguments.

    `launcher` defaults to DeepSpeed's for megatron-deepspeed and torchrun otherwise. DeepSpeed's
    launcher: ``--num_gpus`` per node, and ``--hostfile``/``--num_nodes`` across nodes; it passes
    ``--local_rank=N``, which Megatron-LM's parser (``--local-rank``) rejects, so megatron-core runs
    get ``--no_local_rank`` (Megatron-LM reads LOCAL_RANK). torchrun: ``--standalone`` on one node,
    else ``--nnodes`` with a c10d rendezvous at `rdzv_endpoint`; run the line on every node. TP > 1
    under Megatron-LM requires CUDA_DEVICE_MAX_CONNECTIONS=1 (its validate_args asserts it on
    pre-Blackwell GPUs), set in front; across nodes with DeepSpeed's launcher put it in .deepspeed_env.
    `extra_args` (data, tokenizer, optimizer…) follow the plan's arguments.
    """
    args = plan_to_megatron_args(plan, job, target, deepspeed_config=deepspeed_config) + list(extra_args)
    launcher = launcher or ("deepspeed" if target == "megatron-deepspeed" else "torchrun")
    if launcher not in LAUNCHERS:
        raise GbmwError(f"launcher {launcher!r} is unknown; launchers are {list(LAUNCHERS)}")
    nodes, per_node = job.cluster.nodes, job.cluster.devices_per_node
    words: list[str] = []
    if plan_target(target) == "megatron-core" and plan.strategies[0].tp > 1:
        words.append("CUDA_DEVICE_MAX_CONNECTIONS=1")
    if launcher == "deepspeed":
        words.append("deepspeed")
        if nodes > 1:
            words += ["--hostfile", hostfile, "--num_nodes", str(nodes)]
        words += ["--num_gpus", str(per_node)]
        if target != "megatron-deepspeed":
            words.append("--no_local_rank")
    else:
        words.append("torchrun")
        words += ["--standalone"] if nodes == 1 else ["--nnodes", str(nodes)]
        words += ["--nproc_per_node", str(per_node)]
        if nodes > 1:
            words += ["--rdzv_backend", "c10d", "--rdzv_endpoint", rdzv_endpoint]
    return " ".join(_shell_word(word) for word in [*words, script, *args])
