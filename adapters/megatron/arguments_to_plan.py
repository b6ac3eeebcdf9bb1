"""Megatron arguments → Plan: a parser mirroring the flags gbmw writes, the flags refused because a
plan cannot describe them, and the plan the arguments run."""

from __future__ import annotations

import argparse
from typing import Sequence

from gbmw.errors import GbmwError
from gbmw.plan import Plan
from gbmw.space.stock_partitions import accounted_blocks_per_stage, megatron_stage_partition
from gbmw.space.strategy import Strategy
from gbmw.space.targets import AXIS_OF_ZERO_STAGE, get_target
from gbmw.specs.architectures import GPTArchitecture
from gbmw.specs.jobs import JobSpec

from .arguments import MEGATRON_FP8_RECIPE, _architecture_values, _flag
from .layout import gpt_architecture, megatron_blocks_per_stage, plan_target

#: Flags that change the parallel layout or memory in ways a gbmw Plan does not describe; reading
#: them back would silently drop their meaning, so `megatron_args_to_plan` refuses them.
UNMODELLED_FLAGS = {
    "--num-virtual-stages-per-pipeline-rank": "interleaved (virtual) pipeline stages",
    "--pipeline-model-parallel-layout": "a custom pipeline layout",
    "--use-torch-fsdp2": "FSDP2 sharding",
    "--use-megatron-fsdp": "Megatron FSDP sharding",
    "--checkpoint-activations": "the legacy recomputation flag (write --recompute-granularity full "
                                "--recompute-method uniform --recompute-num-layers 1)",
    "--distribute-saved-activations": "recomputed activations split across TP ranks",
}
DEEPSPEED_REFUSED_FLAGS = {
    "--decoder-first-pipeline-num-layers": "uneven pipeline stages (DeepSpeed's pipeline engine splits evenly here)",
    "--decoder-last-pipeline-num-layers": "uneven pipeline stages (DeepSpeed's pipeline engine splits evenly here)",
    "--use-distributed-optimizer": "Megatron's distributed optimizer (Megatron-DeepSpeed shards through --zero-stage)",
    "--account-for-embedding-in-pipeline-split": "the embedding counted as a pipeline layer (megatron-core's)",
    "--account-for-loss-in-pipeline-split": "the loss counted as a pipeline layer (megatron-core's)",
}


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
    for dest in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "kv_channels", "seq_length",
                 "max_position_embeddings"):
        add(_flag(dest), type=int)
    for dest in ("swiglu", "disable_bias_linear", "untie_embeddings_and_output_weights", "bf16", "fp16"):
        add(_flag(dest), action="store_true")
    if target == "megatron-core":  # TransformerConfig.fp8 / fp8_recipe (megatron/core/transformer/transformer_config.py)
        add("--fp8-format", dest="fp8", choices=["e4m3", "hybrid"])
        add("--fp8-recipe", choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"], default="delayed")
        add("--grad-reduce-in-bf16", action="store_true")
        add("--tp-comm-overlap", action="store_true")
        add("--use-precision-aware-optimizer", action="store_true")  # megatron/training/arguments.py
        for dest in ("exp_avg_dtype", "exp_avg_sq_dtype"):
            add(_flag(dest), choices=["fp32", "fp16", "bf16", "fp8"], default="fp32")
        add("--main-grads-dtype", choices=["fp32", "bf16"], default="fp32")
        add("--main-params-dtype", choices=["fp32", "fp16"], default="fp32")
    add("--attention-dropout", type=float)
    add("--hidden-dropout", type=float)
    add("--recompute-granularity", choices=["full", "selective"])
    add("--recompute-method", choices=["uniform", "block"])
    add("--recompute-num-layers", type=int)
    add("--recompute-activations", action="store_true")  # Megatron's shorthand for --recompute-granularity selective
    add("--sequence-parallel", action="store_true")
    if target == "megatron-deepspeed":
        add("--num-key-value-heads", type=int)
        add("--normalization", choices=["layernorm", "rmsnorm"])
        add("--use-rotary-position-embeddings", action="store_true")
        add("--rotary-position-embeddings-theta", type=int)
        add("--use-flash-attn-v2", action="store_true")
        add("--no-pipeline-parallel", action="store_true")
        add("--deepspeed-activation-checkpointing", action="store_true")
        add("--deepspeed", action="store_true")
        add("--deepspeed_config")
        add("--zero-stage", type=int, default=0)
        add("--moe-expert-parallel-size", dest="expert_parallel", type=int, default=1)
        add("--enable-expert-tensor-parallelism", action="store_true")
        add("--ds-sequence-parallel-size", dest="sequence_degree", type=int, default=1)
    else:
        add("--group-query-attention", action="store_true")
        add("--num-query-groups", type=int)
        add("--normalization", choices=["LayerNorm", "RMSNorm"])
        add("--position-embedding-type", choices=["learned_absolute", "rope", "mrope", "relative", "none"])
        add("--rotary-base", type=int)
        add("--add-qkv-bias", action="store_true")
        add("--decoder-first-pipeline-num-layers", type=int)
        add("--decoder-last-pipeline-num-layers", type=int)
        add("--use-distributed-optimizer", action="store_true")
        add("--num-layers-per-virtual-pipeline-stage", type=int)
        add("--account-for-embedding-in-pipeline-split", action="store_true")
        add("--account-for-loss-in-pipeline-split", action="store_true")
        add("--qk-layernorm", action="store_true")
        add("--multi-latent-attention", action="store_true")
        for dest in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            add(_flag(dest), type=int)
        add("--expert-model-parallel-size", dest="expert_parallel", type=int, default=1)
        add("--expert-tensor-parallel-size", dest="expert_tensor_parallel", type=int)
        add("--context-parallel-size", dest="sequence_degree", type=int, default=1)
        add("--cp-comm-type", choices=["p2p"])
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


def _recompute(namespace: argparse.Namespace) -> str:
    """The recomputation level the flags ask for: `none`, `full` or `selective`."""
    granularity, method = namespace.recompute_granularity, namespace.recompute_method
    count = namespace.recompute_num_layers
    if namespace.recompute_activations:  # Megatron's validate_args turns it into selective granularity
        if granularity not in (None, "selective"):
            raise GbmwError(f"--recompute-activations (selective) with --recompute-granularity {granularity}: give one")
        granularity = "selective"
    if granularity is None:
        if method is not None or count is not None:
            raise GbmwError("--recompute-method/--recompute-num-layers without --recompute-granularity full")
        return "none"
    if granularity == "selective":
        if method is not None:
            raise GbmwError(f"--recompute-granularity selective with --recompute-method {method}: Megatron recomputes "
                            "the attention core of every block; drop --recompute-method")
        return "selective"
    if method != "uniform" or count != 1:
        raise GbmwError(
            f"--recompute-granularity {granularity} --recompute-method {method} --recompute-num-layers {count}: "
            "a gbmw plan recomputes whole blocks one at a time (full, uniform, 1), their attention cores "
            "(selective) or none"
        )
    return "full"


def _expert_tensor_parallel(namespace: argparse.Namespace, arch: GPTArchitecture, target: str, tp: int) -> int:
    """The experts' TP degree the flags give: megatron-core's --expert-tensor-parallel-size (default the TP degree);
    Megatron-DeepSpeed's TP with --enable-expert-tensor-parallelism, refused without it at TP > 1 (its experts then
    run whole in a layout gbmw does not cost: gbmw.space.targets.Target.expert_tensor_parallel)."""
    if target == "megatron-deepspeed":
        if arch.moe is not None and tp > 1 and not namespace.enable_expert_tensor_parallelism:
            raise GbmwError(f"--tensor-model-parallel-size {tp} without --enable-expert-tensor-parallelism: "
                            "Megatron-DeepSpeed then runs the experts whole, its EP groups inside one TP rank's "
                            "data-parallel ranks — a layout gbmw does not cost; add --enable-expert-tensor-parallelism")
        return tp
    given = namespace.expert_tensor_parallel
    if given is not None and (given < 1 or tp % given):
        raise GbmwError(f"--expert-tensor-parallel-size {given}: it must divide --tensor-model-parallel-size {tp}")
    return tp if given is None else given


def _accounted(namespace: argparse.Namespace, first: int | None, last: int | None) -> bool:
    """Whether the flags count the embedding and the loss as pipeline layers (megatron-core's
    --account-for-embedding-in-pipeline-split with --account-for-loss-in-pipeline-split; gbmw reads them together)."""
    embedding = getattr(namespace, "account_for_embedding_in_pipeline_split", False)
    loss = getattr(namespace, "account_for_loss_in_pipeline_split", False)
    if embedding != loss:
        given, missing = ("embedding", "loss") if embedding else ("loss", "embedding")
        raise GbmwError(f"--account-for-{given}-in-pipeline-split without --account-for-{missing}-in-pipeline-split: "
                        "a gbmw plan counts both as pipeline layers or neither; add the other flag or drop this one")
    if embedding and (first is not None or last is not None):
        raise GbmwError("--account-for-embedding/loss-in-pipeline-split with --decoder-first/last-pipeline-num-layers: "
                        "megatron-core refuses the two together; give one")
    return embedding


def megatron_args_to_plan(args: Sequence[str], job: JobSpec, target: str = "megatron-core") -> Plan:
    """The Plan that Megatron arguments (as `plan_to_megatron_args` writes them) run for `job`.

    The inverse of `plan_to_megatron_args` wherever `target` can express the plan: TP innermost,
    then the data-parallel axis (ZeRO level from --use-distributed-optimizer or --zero-stage),
    +sp on every layer with --sequence-parallel (at TP > 1), +ckpt (full) or +sel (selective) on every
    Transformer block when recomputation is on. Flags it does not know are ignored
    unless they change the layout (UNMODELLED_FLAGS), which is refused.
    """
    checked_target = plan_target(target)
    namespace = _parse(args, target)
    arch = gpt_architecture(job)
    _check_architecture(namespace, arch, target, job)
    precision = "bf16" if namespace.bf16 else "fp16" if namespace.fp16 else "fp32"
    if namespace.bf16 and namespace.fp16:
        raise GbmwError("Megatron arguments give both --bf16 and --fp16")
    fp8_recipe = "delayed"
    if getattr(namespace, "fp8", None) is not None:
        recipes = {megatron: gbmw for gbmw, megatron in MEGATRON_FP8_RECIPE.items()}
        if (namespace.fp8, precision) != ("hybrid", "bf16") or namespace.fp8_recipe not in recipes:
            raise GbmwError(f"Megatron arguments: --fp8-format {namespace.fp8} --fp8-recipe {namespace.fp8_recipe} "
                            f"with {precision}: gbmw costs FP8 as --bf16 --fp8-format hybrid --fp8-recipe "
                            f"{' or '.join(recipes)} only")
        precision, fp8_recipe = "fp8", recipes[namespace.fp8_recipe]
    if precision != job.precision:
        raise GbmwError(f"Megatron arguments train in {precision} but job {job.name} trains in {job.precision}")
    if fp8_recipe != job.fp8_recipe:
        raise GbmwError(f"Megatron arguments scale FP8 by --fp8-recipe {namespace.fp8_recipe} but job {job.name} "
                        f"has fp8_recipe {job.fp8_recipe}")
    gradient_reduce_dtype = "bf16" if getattr(namespace, "grad_reduce_in_bf16", False) else "fp32"
    if gradient_reduce_dtype != job.gradient_reduce_dtype:
        raise GbmwError(f"Megatron arguments reduce gradients in {gradient_reduce_dtype} (--grad-reduce-in-bf16 "
                        f"{'given' if gradient_reduce_dtype == 'bf16' else 'not given'}) but job {job.name} has "
                        f"gradient_reduce_dtype {job.gradient_reduce_dtype}")
    tp_comm_overlap = bool(getattr(namespace, "tp_comm_overlap", False))
    if tp_comm_overlap and not namespace.sequence_parallel:
        raise GbmwError("Megatron arguments: --tp-comm-overlap without --sequence-parallel (Megatron asserts "
                        "sequence parallelism with it); add --sequence-parallel or drop --tp-comm-overlap")
    if tp_comm_overlap != job.tp_comm_overlap and (tp_comm_overlap or namespace.sequence_parallel):
        raise GbmwError(f"Megatron arguments {'give' if tp_comm_overlap else 'do not give'} --tp-comm-overlap but "
                        f"job {job.name} has tp_comm_overlap {str(job.tp_comm_overlap).lower()}")
    adam_moments_dtype = _adam_moments_dtype(namespace)
    if adam_moments_dtype != job.adam_moments_dtype:
        raise GbmwError(f"Megatron arguments keep Adam's moments in {adam_moments_dtype} but job {job.name} has "
                        f"adam_moments_dtype {job.adam_moments_dtype}")

    devices = job.cluster.num_devices
    tp, pp = namespace.tensor_model_parallel_size, namespace.pipeline_model_parallel_size
    if tp < 1 or pp < 1 or devices % (tp * pp):
        raise GbmwError(f"devices({devices}) % (tensor({tp}) * pipeline({pp}) = {tp * pp}) != 0")
    sequence_degree = namespace.sequence_degree
    if sequence_degree < 1 or devices % (tp * pp * sequence_degree):
        raise GbmwError(f"devices({devices}) % (tensor({tp}) * pipeline({pp}) * sequence({sequence_degree})) != 0")
    dp = devices // (tp * pp * sequence_degree)
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
    virtual_stages, accounted = 1, _accounted(namespace, first, last)
    per_chunk = getattr(namespace, "num_layers_per_virtual_pipeline_stage", None)
    layers = arch.num_layers + 2 * accounted  # the embedding and the loss counted as layers
    if per_chunk is not None:
        blocks_per_stage = layers // pp if pp and layers % pp == 0 else None
        if per_chunk < 1 or blocks_per_stage is None or blocks_per_stage % per_chunk or first is not None:
            raise GbmwError(f"--num-layers-per-virtual-pipeline-stage {per_chunk}: each of the {pp} stages' "
                            f"{layers}/{pp} layers must split into chunks of that many (even stages"
                            + (", the embedding and the loss counted as layers)" if accounted else ")"))
        virtual_stages = blocks_per_stage // per_chunk
    sequence_axis = "ulysses" if target == "megatron-deepspeed" else "cp"
    dims = ((("tp", tp),) if tp > 1 else ()) + (((sequence_axis, sequence_degree),) if sequence_degree > 1 else ()) + (
        ((data_axis, dp),) if dp > 1 else ())
    recompute = _recompute(namespace)
    plain = Strategy(dims, sp=namespace.sequence_parallel and tp > 1)  # Megatron turns SP off at TP 1
    expert_parallel = namespace.expert_parallel
    expert_tp = _expert_tensor_parallel(namespace, arch, target, tp)
    # EP splits the ranks holding other tokens (data-parallel, and context-parallel ones first: megatron-core's expert
    # grid), or under an expert TP of its own the stage's ranks over that TP
    expert_ranks, what = (sequence_degree * dp, "the data-parallel size" if sequence_degree == 1 else
                          f"{sequence_axis}({sequence_degree}) * data({dp})") if expert_tp == tp else (
        tp * sequence_degree * dp // expert_tp,
        f"tensor({tp}) * {sequence_axis}({sequence_degree}) * data({dp}) / expert tensor({expert_tp})"
        if sequence_degree > 1 else f"tensor({tp}) * data({dp}) / expert tensor({expert_tp})")
    if expert_parallel > 1 and (arch.moe is None or expert_ranks % expert_parallel):
        flag = "--moe-expert-parallel-size" if target == "megatron-deepspeed" else "--expert-model-parallel-size"
        raise GbmwError(f"{flag} {expert_parallel}: " + (f"model {job.model.name} has no experts" if arch.moe is None
                                                          else f"it must divide {what} = {expert_ranks}"))
    block = plain.with_recompute(recompute)
    if expert_tp != tp and expert_parallel == 1:
        raise GbmwError(f"--expert-tensor-parallel-size {expert_tp} with --expert-model-parallel-size 1: a gbmw plan "
                        "gives the experts a TP degree of their own only where EP splits them")
    strategies = tuple((block.with_expert_parallel(expert_parallel, expert_tp) if layer.num_experts else block)
                       if layer.is_block else plain for layer in job.model.layers)
    counts = accounted_blocks_per_stage(arch.num_layers, pp) if accounted else megatron_blocks_per_stage(
        arch.num_layers, pp, first, last)
    if counts is None:
        raise GbmwError(f"--account-for-embedding/loss-in-pipeline-split: --num-layers {arch.num_layers} + 2 must be a "
                        f"multiple of --pipeline-model-parallel-size {pp} with at least two layers per stage")
    partition = tuple(megatron_stage_partition(job.model, counts))
    plan = Plan(
        model=job.model.name,
        cluster=job.cluster.name,
        num_devices=devices,
        precision=precision,
        fp8_recipe=fp8_recipe,
        gradient_reduce_dtype=gradient_reduce_dtype,
        tp_comm_overlap=job.tp_comm_overlap,
        adam_moments_dtype=adam_moments_dtype,
        global_batch=namespace.global_batch_size,
        micro_batch=micro_batch,
        num_micro_batches=namespace.global_batch_size // micro_batch,
        pp=pp,
        partition=partition,
        strategies=strategies,
        target=checked_target,
        virtual_stages=virtual_stages,
        provenance={"made_by": "megatron_args_to_plan", "target": target},
    )
    plan.check_against(job.model, devices)
    get_target(checked_target).check(plan, job.model)
    return plan


def _adam_moments_dtype(namespace: argparse.Namespace) -> str:
    """The dtype of Adam's moments the arguments ask (megatron-core's precision-aware optimizer), refusing what
    Megatron refuses (the dtypes without the optimizer, the optimizer without the distributed one) and what gbmw does
    not price (fp16 or fp8 moments, the two moments in different dtypes, main gradients or weights other than fp32)."""
    for dest in ("main_grads_dtype", "main_params_dtype"):
        if getattr(namespace, dest, "fp32") != "fp32":
            raise GbmwError(f"Megatron arguments: {_flag(dest)} {getattr(namespace, dest)}: gbmw prices the "
                            "precision-aware optimizer with fp32 main gradients and weights (gradient_reduce_dtype "
                            "bf16 is --grad-reduce-in-bf16); drop it")
    dtypes = {getattr(namespace, "exp_avg_dtype", "fp32"), getattr(namespace, "exp_avg_sq_dtype", "fp32")}
    if not getattr(namespace, "use_precision_aware_optimizer", False):
        if dtypes != {"fp32"}:
            raise GbmwError("Megatron arguments: --exp-avg-dtype/--exp-avg-sq-dtype other than fp32 need "
                            "--use-precision-aware-optimizer (Megatron asserts it); add it or drop them")
        return "fp32"
    if not namespace.use_distributed_optimizer:
        raise GbmwError("Megatron arguments: --use-precision-aware-optimizer without --use-distributed-optimizer "
                        "(Megatron refuses it); add --use-distributed-optimizer")
    if len(dtypes) != 1 or not dtypes <= {"fp32", "bf16"}:
        raise GbmwError(f"Megatron arguments: --exp-avg-dtype {namespace.exp_avg_dtype} --exp-avg-sq-dtype "
                        f"{namespace.exp_avg_sq_dtype}: gbmw prices both moments in fp32 or both in bf16")
    return dtypes.pop()
