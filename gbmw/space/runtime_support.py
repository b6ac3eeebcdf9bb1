"""What gbmw's own runtime can train, decided without torch: `gbmw plan` says it when planning for
`--target runtime` (the default), and `gbmw train` refuses with the same sentence.

The runtime (gbmw.adapters.runtime.model) builds GPT-style decoders — GPT-2/3 (LayerNorm, learned positions,
GELU MLP, biases) and LLaMA-style (RMSNorm, SwiGLU, rotary positions, grouped-query attention, no biases,
tied or untied head), mixture-of-experts ones among them (dropless top-k routing, shared experts, expert parallelism
+epN with any data-parallel flavour — dp, z1dp, z2dp, sdp, the experts sharded over their expert-data-parallel group;
not a capacity factor; +sp as megatron-core runs it, gbmw.adapters.runtime.expert_sequence_parallel; the experts at a
TP degree of their own, +etpN, gbmw.space.expert_tensor_parallel), not with multi-head latent
attention, attention sinks or a router bias, nor BLOOM's, OPT's, Falcon's or Gemma's layouts (`dense_layout_refusal`)
— and
BERT encoders. It trains in fp32, tf32 or bf16 (fp16 would need loss
scaling). T5's
encoder-decoder, ViT's and Swin's image models are planned and emitted for DeepSpeed and Megatron, but the
runtime has no modules for them yet.

Of the sequence axes it runs Ulysses (`ulysses`, gbmw.adapters.runtime.ulysses) and ring context parallelism (`cp`,
gbmw.adapters.runtime.context_parallel) with any data-parallel flavour, TP and +epN, neither with +sp
(`runtime_strategy_refusal` says so in one line), and cp without attention dropout
(gbmw.space.sequence_split.sequence_split_problem).
"""

from __future__ import annotations

from typing import Any

RUNTIME_FAMILIES = ("gpt", "bert")
RUNTIME_PRECISIONS = ("fp32", "tf32", "bf16")
TRAINED_PRECISIONS = f"{', '.join(RUNTIME_PRECISIONS[:-1])} or {RUNTIME_PRECISIONS[-1]}"  # as a sentence says it


def runtime_refusal(architecture: Any, precision: str | None = None) -> str | None:
    """Why gbmw's runtime cannot train this model (one sentence, naming the field), or None when it can.
    `architecture` None is a model read from a layer list (costs only, no modules to build)."""
    if architecture is None:
        return ("the model is a layer list (costs only, no `family`), so gbmw's runtime has no modules to build; "
                "plan from the model's recipe")
    where = f"model {architecture.name}"
    if architecture.family not in RUNTIME_FAMILIES:
        return (f"{where}: `family: {architecture.family}` is planned but not trained by gbmw's runtime (it trains "
                f"{' and '.join(f'`family: {family}`' for family in RUNTIME_FAMILIES)} models); plan it for --target "
                "deepspeed, megatron-deepspeed or megatron-core and run it with that framework")
    qkv_bias = getattr(architecture, "qkv_bias", None)
    if qkv_bias is not None and qkv_bias != getattr(architecture, "bias", True):
        return (f"{where}: `qkv_bias: {str(qkv_bias).lower()}` with `bias: {str(architecture.bias).lower()}`: gbmw's "
                "runtime gives the Q, K and V projections biases exactly when every linear has them; plan it for "
                "--target megatron-core (--add-qkv-bias) and run it there")
    window = getattr(architecture, "sliding_window", None)
    if window is not None and window < architecture.seq_length:
        return (f"{where}: `sliding_window: {window}` is shorter than seq_length {architecture.seq_length}: gbmw's "
                "runtime attends over the whole causal prefix; train at seq_length ≤ the window (--seq-length "
                f"{window}) or with a framework that runs sliding windows")
    if getattr(architecture, "latent_attention", None) is not None:
        return (f"{where}: `latent_attention` (multi-head latent attention, DeepSeek-V2/V3): gbmw's runtime builds "
                "standard and grouped-query attention only; plan it for --target megatron-core "
                "(--multi-latent-attention) and run it there")
    if getattr(architecture, "attention_sinks", False):
        return (f"{where}: `attention_sinks: true` (a learned softmax logit per head, GPT-OSS): gbmw's runtime's "
                "attention has no sinks; plan it for --target megatron-core and run it with GPT-OSS's own code")
    moe = getattr(architecture, "moe", None)
    if moe is not None and moe.router_bias:
        return (f"{where}: `moe.router_bias: true`: gbmw's runtime's router has no bias; plan it for --target "
                "megatron-core (its router has one with --add-bias-linear) and run it there")
    if getattr(architecture, "qk_norm", "none") != "none":
        return (f"{where}: `qk_norm: {architecture.qk_norm}` (norms on the queries and keys): gbmw's runtime builds no "
                "q/k norms yet; plan it for --target megatron-core (--qk-layernorm, for per-head norms) and run it there")
    if getattr(architecture, "norm", "rms") == "layer" and not getattr(architecture, "norm_bias", True):
        return (f"{where}: `norm_bias: false` (LayerNorm without its shift): gbmw's runtime's LayerNorm has one; plan "
                "it for --target deepspeed and run the model's own code there")
    moe = getattr(architecture, "moe", None)
    if moe is not None and moe.capacity_factor is not None:
        return (f"{where}: `moe.capacity_factor: {moe.capacity_factor}`: gbmw's runtime routes dropless (every token "
                "copy reaches its experts) and drops no tokens; leave capacity_factor out (null) to train it here, or "
                "plan it for --target megatron-core (--moe-expert-capacity-factor)")
    layout = dense_layout_refusal(architecture)
    if layout is not None:
        return (f"{where}: {layout}: gbmw's runtime builds attention then MLP, each after its own norm, on learned or "
                "rotary positions, with GELU or SwiGLU MLPs and embeddings neither normed nor scaled; plan it for "
                "--target deepspeed and run the model's own code there")
    if precision == "fp8":
        return (f"{where}: precision fp8: gbmw's runtime trains in {TRAINED_PRECISIONS}, not with "
                "Transformer Engine's FP8 linears; plan it for --target megatron-core, or with precision bf16")
    if precision is not None and precision not in RUNTIME_PRECISIONS:
        return (f"{where}: precision {precision}: gbmw's runtime trains in {TRAINED_PRECISIONS} "
                "(fp16 would need loss scaling); plan the job with precision bf16, tf32 or fp32")
    if getattr(architecture, "rope_scaling", None) is not None:
        return (f"{where}: `rope_scaling: {architecture.rope_scaling}`: gbmw's runtime trains plain rotary embeddings, "
                "so it would train another model; drop rope_scaling to train with plain rotary (the plan's costs are "
                "the same), or run the plan with a framework that scales rotary frequencies")
    return None


def dense_layout_refusal(architecture: Any) -> str | None:
    """The first dense-decoder option of BLOOM, OPT, Falcon or Gemma (gbmw.specs.architectures.GPTArchitecture) that
    neither gbmw's runtime nor Megatron builds, named as the recipe field says it (None: none)."""
    for field, value, unlike in (("position_embedding", "alibi", None), ("embedding_norm", True, False),
                                 ("position_offset", None, 0), ("mlp_activation", "relu", None),
                                 ("parallel_attention_norms", None, 0), ("gated_activation", None, "silu"),
                                 ("scaled_embeddings", True, False)):
        given = getattr(architecture, field, unlike)
        if (value is not None and given == value) or (unlike is not None and given != unlike):
            return f"`{field}: {str(given).lower() if isinstance(given, bool) else given}`"
    attention_dropout = getattr(architecture, "attention_dropout", None)
    if attention_dropout is not None and attention_dropout != getattr(architecture, "dropout", True):
        return f"`attention_dropout: {str(attention_dropout).lower()}` beside `dropout: {str(architecture.dropout).lower()}`"
    return None


def runtime_strategy_refusal(strategy) -> str | None:
    """Why gbmw's runtime cannot run a layer's strategy's sequence axis (one sentence), or None when it can: `gbmw
    train` refuses such a plan before starting, and the engine refuses the layer with the same words."""
    axis, name = strategy.sequence_axis, strategy.name
    what = {"cp": "context parallelism (cp)", "ulysses": "Ulysses"}.get(axis)
    if axis is not None and strategy.expert_tp is not None:
        return (f"strategy {name}: gbmw's runtime runs {what} without +sp, which +etp{strategy.expert_tp} needs; leave "
                f"+etp{strategy.expert_tp} out (the experts at the layer's TP) or plan for megatron-core "
                "(--target megatron-core)")
    if axis is not None and strategy.sp:
        return (f"strategy {name}: gbmw's runtime runs {what} without +sp (its tokens are already split over the "
                f"{axis} group); leave +sp out")
    return None


def runtime_warning(job, target: str) -> str | None:
    """The line `gbmw plan` prints when the plan is for gbmw's runtime and the runtime cannot train the job's model
    (None otherwise): the sentence `gbmw train` would refuse with."""
    if target != "runtime":
        return None
    refusal = runtime_refusal(job.model.architecture, job.precision)
    return None if refusal is None else f"warning: `gbmw train` cannot run this plan: {refusal}"
