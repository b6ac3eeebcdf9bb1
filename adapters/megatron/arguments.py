"""Plan → Megatron-LM / Megatron-DeepSpeed arguments: the model flags of an architecture and the
flags of a plan's layout (the table in gbmw.adapters.megatron)."""

from __future__ import annotations

from typing import Any

from gbmw.errors import GbmwError, PlanError
from gbmw.plan import Plan
from gbmw.space.runtime_support import dense_layout_refusal
from gbmw.specs.architectures import GPTArchitecture
from gbmw.specs.jobs import JobSpec

from .layout import gpt_architecture, megatron_layout


MEGATRON_FP8_RECIPE = {"delayed": "delayed", "current": "tensorwise"}
"""gbmw's fp8_recipe → megatron-core's `--fp8-recipe` (megatron/core/enums.py Fp8Recipe: `tensorwise` is
Transformer Engine's Float8CurrentScaling, megatron/core/fp8_utils.py `get_fp8_recipe`)."""


def _architecture_values(arch: GPTArchitecture, target: str) -> dict[str, Any]:
    """{argparse dest: value} of the model flags for `arch` under `target` (None: flag absent)."""
    deepspeed = target == "megatron-deepspeed"
    kv_heads = arch.num_kv_heads if arch.num_kv_heads not in (None, arch.num_heads) else None
    values: dict[str, Any] = {
        "num_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "ffn_hidden_size": arch.ffn_hidden_size or 4 * arch.hidden_size,
        "num_attention_heads": arch.num_heads,
        "kv_channels": arch.head_dim if arch.head_dim not in (None, arch.hidden_size // arch.num_heads) else None,
        "seq_length": arch.seq_length,
        # A learned position table has the model's rows, whatever the training length (GPT-2: n_positions)
        "max_position_embeddings": (arch.max_position_embeddings or arch.seq_length)
        if arch.position_embedding == "learned" else arch.seq_length,
        "swiglu": arch.gated_mlp,
        "disable_bias_linear": not arch.bias,
        "untie_embeddings_and_output_weights": not arch.tie_embeddings,
        "attention_dropout": None if arch.dropout else 0.0,
        "hidden_dropout": None if arch.dropout else 0.0,
    }
    if deepspeed and arch.qkv_bias and not arch.bias:
        raise GbmwError("Megatron-DeepSpeed has no flag for biases on q/k/v alone (Qwen2's layout: "
                        "`--add-qkv-bias` is Megatron-LM's); tune for --target megatron-core or deepspeed")
    unexpressed = [what for what, bad in (
        ("a LayerNorm without its shift (norm_bias: false; Megatron's LayerNorm has one)",
         arch.norm == "layer" and not arch.norm_bias),
        ("q/k norms over the whole Q and K width (qk_norm: full; Megatron's --qk-layernorm norms each head)",
         arch.qk_norm == "full"),
        ("q/k norms (qk_norm: head; Megatron-DeepSpeed has no --qk-layernorm)", deepspeed and arch.qk_norm == "head"),
        ("multi-head latent attention (latent_attention; Megatron-DeepSpeed has no MLA, megatron-core's "
         "--multi-latent-attention runs it)", deepspeed and arch.latent_attention is not None),
    ) if bad]
    layout = dense_layout_refusal(arch)
    if layout is not None:
        unexpressed.append(f"{layout} (BLOOM, OPT and Falcon's layouts, and Gemma's GeGLU and scaled embeddings, "
                           "have no Megatron flags)")
    if unexpressed:
        raise GbmwError(f"model {arch.name}: {target}'s arguments cannot express {'; '.join(unexpressed)} — plan it "
                        "for --target deepspeed or runtime, or write a model recipe YAML for the nearest layout")
    rope_base = int(arch.rope_theta) if arch.position_embedding == "rotary" and arch.rope_theta != 10000 else None
    if deepspeed:
        values["num_key_value_heads"] = kv_heads
        values["normalization"] = "rmsnorm" if arch.norm == "rms" else None
        values["use_rotary_position_embeddings"] = arch.position_embedding == "rotary"
        values["rotary_position_embeddings_theta"] = rope_base
        values["use_flash_attn_v2"] = arch.attention == "flash"
    else:
        values["group_query_attention"] = kv_heads is not None
        values["num_query_groups"] = kv_heads
        values["normalization"] = "RMSNorm" if arch.norm == "rms" else None
        values["position_embedding_type"] = "rope" if arch.position_embedding == "rotary" else None
        values["rotary_base"] = rope_base
        values["add_qkv_bias"] = bool(arch.qkv_bias) and not arch.bias
        # MLA's latent norms are --qk-layernorm's in megatron-core's MLA layer spec (the up-projections become
        # LayerNormLinears); without it they would be identities
        values["qk_layernorm"] = arch.qk_norm == "head" or arch.latent_attention is not None
        values.update(_latent_attention_values(arch))
    return values


def _latent_attention_values(arch: GPTArchitecture) -> dict[str, Any]:
    """{argparse dest: value} of megatron-core's multi-head latent attention flags (megatron/training/arguments.py
    `_add_mla_args`; `--multi-latent-attention` from TransformerConfig.multi_latent_attention); {} without MLA. Every
    width is written out: Megatron's defaults (--kv-lora-rank 32, …) are not DeepSeek's. YaRN's rotary settings
    (--rope-type, --rotary-scaling-factor, --mscale…) change no cost and are left to the user. Without MLA: the flag
    off."""
    latent = arch.latent_attention
    if latent is None:
        return {"multi_latent_attention": False}  # read back: the flag on a model without MLA is a mismatch
    return {"multi_latent_attention": True, "q_lora_rank": latent.q_lora_rank, "kv_lora_rank": latent.kv_lora_rank,
            "qk_head_dim": latent.qk_nope_head_dim, "qk_pos_emb_head_dim": latent.qk_rope_head_dim,
            "v_head_dim": latent.v_head_dim}


def _expert_values(arch: GPTArchitecture, target: str, layout) -> dict[str, Any]:
    """{argparse dest: value} of a mixture-of-experts model's flags (gbmw.specs.architectures.MixtureOfExperts) and
    its expert parallelism; {} for a dense model. megatron-core: the experts' TP is the plan's (the layer's, or
    `+etpN`'s), tokens are dispatched by all-to-all (what gbmw.cost.expert_parallel prices) with grouped GEMMs.
    Megatron-DeepSpeed runs DeepSpeed-MoE layers: no shared experts, expert width = --ffn-hidden-size, every k-th
    block an MoE block, and the experts at the layer's TP (`--enable-expert-tensor-parallelism`, off by default:
    without it the experts run whole in another layout, gbmw.space.targets.Target.expert_tensor_parallel)."""
    moe = arch.moe
    if moe is None:
        return {}
    moe_blocks = [0 if index in moe.dense_blocks else 1 for index in range(arch.num_layers)]
    if target == "megatron-deepspeed":
        interval = next((k for k in range(1, arch.num_layers + 1)
                         if moe_blocks == [int((index + 1) % k == 0) for index in range(arch.num_layers)]), None)
        problems = [what for what, bad in (
            ("shared experts", moe.shared_experts > 0),
            ("a routing bias per expert (expert_score_bias)", moe.expert_score_bias),
            ("dense blocks other than every k-th (its --expert-interval)", interval is None),
            (f"an expert width ({moe.expert_ffn_hidden_size}) other than the dense FFN's "
             f"({arch.ffn_hidden_size or 4 * arch.hidden_size}) with dense blocks",
             interval != 1 and moe.expert_ffn_hidden_size != (arch.ffn_hidden_size or 4 * arch.hidden_size)),
        ) if bad]
        if problems:
            raise GbmwError(f"model {arch.name}: Megatron-DeepSpeed's MoE (DeepSpeed-MoE layers) cannot express "
                            f"{'; '.join(problems)} — use --target megatron-core")
        return {**({"ffn_hidden_size": moe.expert_ffn_hidden_size} if interval == 1 else {}),
                "num_experts": moe.num_experts, "topk": moe.top_k, "expert_interval": interval,
                "moe_expert_parallel_size": layout.expert_parallel,
                "enable_expert_tensor_parallelism": layout.tensor_parallel > 1,
                "disable_moe_token_dropping": moe.capacity_factor is None,
                "moe_train_capacity_factor": moe.capacity_factor}
    pattern = None if all(moe_blocks) else "[" + ",".join(map(str, moe_blocks)) + "]"
    return {"num_experts": moe.num_experts, "moe_router_topk": moe.top_k,
            "moe_ffn_hidden_size": moe.expert_ffn_hidden_size, "moe_layer_freq": pattern,
            "moe_shared_expert_intermediate_size": moe.shared_experts * moe.shared_ffn_hidden_size or None,
            "moe_shared_expert_gate": moe.shared_expert_gate,
            # DeepSeek-V3's routing bias per expert; megatron-core takes it with sigmoid scores only
            "moe_router_enable_expert_bias": moe.expert_score_bias,
            "moe_router_score_function": "sigmoid" if moe.expert_score_bias else None,
            "expert_model_parallel_size": layout.expert_parallel,
            "expert_tensor_parallel_size": layout.expert_tensor_parallel,
            "moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True,
            "moe_expert_capacity_factor": moe.capacity_factor,
            "moe_pad_expert_input_to_capacity": moe.capacity_factor is not None}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _architecture_args(arch: GPTArchitecture, target: str, layout) -> list[str]:
    args: list[str] = []
    for dest, value in {**_architecture_values(arch, target), **_expert_values(arch, target, layout)}.items():
        if value is None or value is False:
            continue
        args += [_flag(dest)] if value is True else [_flag(dest), _number(value)]
    return args


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


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
    if layout.context_parallel > 1:  # megatron-core's ring through Transformer Engine (gbmw.cost.context_parallel)
        args += ["--context-parallel-size", str(layout.context_parallel), "--cp-comm-type", "p2p"]
    if layout.ulysses > 1:
        args += ["--ds-sequence-parallel-size", str(layout.ulysses)]
    if deepspeed and layout.pipeline_parallel == 1:
        args.append("--no-pipeline-parallel")  # a 1-stage PipelineModule would refuse ZeRO-2/3
    if layout.first_stage_blocks is not None:
        args += ["--decoder-first-pipeline-num-layers", str(layout.first_stage_blocks),
                 "--decoder-last-pipeline-num-layers", str(layout.last_stage_blocks)]
    if plan.virtual_stages > 1:  # gbmw.space.targets has checked: megatron-core, v equal chunks per stage
        if layout.first_stage_blocks is not None:
            raise PlanError(f"virtual_stages {plan.virtual_stages} with uneven first/last stages: gbmw emits "
                            "interleaved pipelines for the even split and the accounted one only")
        if layout.accounted:  # the embedding and the loss each take a block's place in the first and last chunks
            args += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
        per_chunk = (arch.num_layers + 2 * layout.accounted) // (layout.pipeline_parallel * plan.virtual_stages)
        args += ["--num-layers-per-virtual-pipeline-stage", str(per_chunk)]
    args += [
        "--micro-batch-size", str(layout.micro_batch_size),
        "--global-batch-size", str(layout.global_batch_size),
    ]
    args += _architecture_args(arch, target, layout)
    if plan.precision in ("bf16", "fp16"):
        args.append(f"--{plan.precision}")
    elif plan.precision == "fp8":  # Transformer Engine's FP8 linears on bf16 parameters (gbmw.specs.transformer_layers)
        args += ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", MEGATRON_FP8_RECIPE[plan.fp8_recipe]]
    if plan.gradient_reduce_dtype == "bf16":  # bf16 main gradients (megatron-core only: layout.check_precision)
        args.append("--grad-reduce-in-bf16")
    if layout.sequence_parallel:
        args.append("--sequence-parallel")
        if plan.tp_comm_overlap:  # Transformer Engine's userbuffers (megatron-core only: layout.check_precision);
            args.append("--tp-comm-overlap")  # Megatron asserts sequence parallelism with it
    if layout.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        if deepspeed:
            args.append("--deepspeed-activation-checkpointing")
    elif layout.recompute == "selective":  # the attention core; Megatron allows no --recompute-method with it
        args += ["--recompute-granularity", "selective"]
    if deepspeed:
        args += ["--deepspeed", "--deepspeed_config", deepspeed_config, "--zero-stage", str(layout.zero_stage)]
    elif layout.data_axis == "z1dp" or plan.adam_moments_dtype == "bf16":  # Megatron's precision-aware optimizer
        args.append("--use-distributed-optimizer")  # runs under its distributed optimizer only (layout refuses dp)
    if plan.adam_moments_dtype == "bf16":  # megatron-core only: layout.check_precision
        args += ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    return args
