"""Where a sequence axis (gbmw.space.strategy: `cp`, `ulysses`) can split a layer: the rules every target and the
search apply, one place."""

from __future__ import annotations

from gbmw.space.strategy import Strategy
from gbmw.specs.model_spec import LayerSpec, ModelSpec


def sequence_split_problem(strategy: Strategy, layer: LayerSpec, model: ModelSpec, target=None) -> str | None:
    """Why `strategy`'s sequence axis cannot split `layer` of `model` (None: it can). Ulysses gives each rank whole
    heads, so TP × u divides the query and key/value heads (Jacobs et al. 2023, Sec. 3); megatron-core's CP cuts the
    sequence into 2·c chunks for its load-balanced causal split (megatron.core.utils.get_batch_on_this_cp_rank) and
    runs through fused (flash) attention — gbmw's runtime's ring attention is blockwise flash attention
    (gbmw.adapters.runtime.context_parallel), the same 2·c chunks, without attention dropout; neither splits a layer
    that reads a second sequence (T5's cross-attention)."""
    axis, degree, tp = strategy.sequence_axis, strategy.sequence_parallel_degree, strategy.tp
    pieces = 2 * degree if axis == "cp" else degree
    architecture = model.architecture
    attention_dropout = getattr(architecture, "attention_dropout", None)
    if axis == "cp" and target is not None and not target.context_parallel_dropout and (
            getattr(architecture, "dropout", False) if attention_dropout is None else attention_dropout):
        return (f"{target.name}'s ring attention (cp) runs without attention dropout, and model "
                f"{model.architecture.name} has `dropout: true`")
    if model.sequence_length % pieces:
        return (f"{axis}{degree} splits each sample's {model.sequence_length} tokens into {pieces} equal parts; give a "
                f"sequence length divisible by {pieces}")
    if layer.side_input_bytes_per_sample:
        return f"{axis} does not split a layer that reads a second sequence (cross-attention)"
    if not layer.attention_heads:
        return None
    if axis == "ulysses":
        for what, heads in (("attention heads", layer.attention_heads), ("key/value heads", layer.kv_heads)):
            if heads and heads % (tp * degree):
                return (f"Ulysses gives each of tp({tp}) × ulysses({degree}) ranks whole heads, but the layer has "
                        f"{heads} {what}")
    flash = layer.forward_flash_attention_flops_per_sample > 0 or (target is not None and target.fused_attention)
    if axis == "cp" and not flash:
        return "context parallelism runs through fused (flash) attention; give the job flash_attention: true"
    return None
