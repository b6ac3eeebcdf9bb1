"""Plan → megatron-core's own ModelParallelConfig and TransformerConfig, validated by their
__post_init__ and checked against the plan's partition.

`import megatron.core…` below is an absolute import: it resolves to the megatron-core library,
never to this package (gbmw.adapters.megatron); gbmw's own modules are imported with a leading dot."""

from __future__ import annotations

import re
import warnings
from typing import Any

from gbmw.errors import GbmwError
from gbmw.plan import Plan
from gbmw.specs.jobs import JobSpec

from .arguments import MEGATRON_FP8_RECIPE
from .layout import gpt_architecture, megatron_layout

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
            from megatron.core.transformer import MLATransformerConfig, TransformerConfig
            from megatron.core.transformer.transformer_block import get_num_layers_to_build
    except ImportError as error:
        raise GbmwError(
            f"megatron-core configs need the runtime extra (pip install 'gbmw[runtime]'): {error}"
        ) from None
    return torch, ModelParallelConfig, (TransformerConfig, MLATransformerConfig), get_num_layers_to_build


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

    Fields (megatron-core 0.16): tensor/pipeline_model_parallel_size, sequence_parallel for +sp layouts,
    params_dtype = pipeline_dtype from the precision with bf16/fp16 (fp8: bf16 parameters with fp8="hybrid",
    fp8_recipe "delayed" or "tensorwise" by the plan's), use_cpu_initialization=True and
    gradient_accumulation_fusion=False (no CUDA extension needed), the GPT widths, recompute_granularity
    "full" / recompute_method "uniform" / recompute_num_layers 1 for +ckpt blocks, recompute_granularity
    "selective" for +sel blocks, an MLATransformerConfig with the latent widths and qk_layernorm for multi-head latent
    attention, and
    num_layers_in_first/last_pipeline_stage for uneven stages (what Megatron-LM's
    core_transformer_config_from_args sets from --decoder-first/last-pipeline-num-layers),
    virtual_pipeline_model_parallel_size for interleaving and account_for_embedding/loss_in_pipeline_split on
    the split that counts them as layers. Their
    __post_init__ validates; the per-stage block counts megatron-core would build
    (get_num_layers_to_build) are then checked against the plan's partition.
    """
    layout = megatron_layout(plan, job, "megatron-core")
    arch = gpt_architecture(job)
    torch, ModelParallelConfig, (TransformerConfig, MLATransformerConfig), get_num_layers_to_build = _megatron_core()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}[plan.precision]
    parallel = dict(
        tensor_model_parallel_size=layout.tensor_parallel,
        pipeline_model_parallel_size=layout.pipeline_parallel,
        sequence_parallel=layout.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=plan.precision in ("bf16", "fp8"),
        fp16=plan.precision == "fp16",
        use_cpu_initialization=True,
        gradient_accumulation_fusion=False,
        virtual_pipeline_model_parallel_size=plan.virtual_stages if plan.virtual_stages > 1 else None,
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
        add_qkv_bias=bool(arch.qkv_bias) and not arch.bias,
        kv_channels=arch.head_dim,
        normalization="RMSNorm" if arch.norm == "rms" else "LayerNorm",
        num_layers_in_first_pipeline_stage=layout.first_stage_blocks,
        num_layers_in_last_pipeline_stage=layout.last_stage_blocks,
        account_for_embedding_in_pipeline_split=layout.accounted,
        account_for_loss_in_pipeline_split=layout.accounted,
        # precision fp8: Transformer Engine's FP8 linears, E4M3 forward and E5M2 gradients, the plan's scaling
        **(dict(fp8="hybrid", fp8_recipe=MEGATRON_FP8_RECIPE[plan.fp8_recipe]) if plan.precision == "fp8" else {}),
    )
    latent = arch.latent_attention
    if latent is not None:  # what Megatron-LM's core_transformer_config_from_args builds for --multi-latent-attention
        transformer.update(q_lora_rank=latent.q_lora_rank, kv_lora_rank=latent.kv_lora_rank,
                           qk_head_dim=latent.qk_nope_head_dim, qk_pos_emb_head_dim=latent.qk_rope_head_dim,
                           v_head_dim=latent.v_head_dim, qk_layernorm=True)
    if arch.gated_mlp:
        transformer.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
    if not arch.dropout:
        transformer.update(hidden_dropout=0.0, attention_dropout=0.0)
    if layout.recompute == "full":
        transformer.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif layout.recompute == "selective":  # megatron-core's default recompute_modules: ["core_attn"]
        transformer.update(recompute_granularity="selective")
    parallel_config = _construct(ModelParallelConfig, parallel)
    transformer_config = _construct(TransformerConfig if latent is None else MLATransformerConfig, transformer)
    try:
        chunks = range(plan.virtual_stages) if plan.virtual_stages > 1 else [None]
        built = [sum(get_num_layers_to_build(transformer_config, vp_stage=chunk, pp_rank=stage) for chunk in chunks)
                 for stage in range(layout.pipeline_parallel)]
    except AssertionError as error:
        raise GbmwError(f"megatron-core cannot split the blocks of this plan: {error}") from None
    if tuple(built) != layout.blocks_per_stage:
        raise GbmwError(
            f"megatron-core would build {built} blocks per stage, the plan has {list(layout.blocks_per_stage)}"
        )
    return parallel_config, transformer_config
