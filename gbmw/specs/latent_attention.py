"""The multi-head latent attention sub-block of a Transformer block (DeepSeek-V2, arXiv 2405.04434 Sec. 2.1;
gbmw.specs.latent_attention_spec.MultiLatentAttention): its parameters, FLOPs, activations and memory traffic per sample, for
gbmw.specs.transformer_layers.block_layer, as megatron-core runs it (megatron/core/transformer/
multi_latent_attention.py `MLASelfAttention`; megatron/core/models/gpt/gpt_layer_specs.py, the MLA layer spec).

Names: s tokens, h hidden, a heads, query/key heads of n (no positions) + r (rotary) = `shape.head_dim`, value heads
of v, query latent q_r (`q_lora_rank`; 0: none), key/value latent k_r (`kv_lora_rank`), d bytes per activation.

Layout under TP (megatron-core): the input norm is a norm of its own (not fused into a linear); the down-projections
q_a (h → q_r) and kv_a (h → k_r + r) are duplicated linears, whole on every TP rank — under sequence parallelism they
run on the rank's share of the tokens; the up-projections q_b (q_r → a·(n + r)), or q_proj (h → a·(n + r)) without a
query latent, and kv_b (k_r → a·(n + v)) are column-parallel by heads, each fused with its latent's RMSNorm (a
LayerNormLinear, `qk_layernorm`); o_proj (a·v → h) is row-parallel. So the down-projections' weights and FLOPs are
not divided by TP (`Matmul.tp_split` "none", `LayerSpec.tp_replicated_forward_flops_per_sample`).

TP's collectives: forward all-reduces o_proj's output (s·h), backward the up-projections' input gradients (s·(q_r or
h) + s·k_r); with sequence parallelism each pass all-gathers the up-projections' inputs and reduce-scatters the output.
Both come to (h + (q_r or h) + k_r)·s·d per forward and backward pair; the LayerSpec carries half of it per pass (its
field is one all-reduce per pass). The rotary key part's own all-gather under +sp (s·r) is left out.

Stashed for backward — what each op keeps (the attention core as `block_layer` costs it):
- the input norm's fp32 statistic per token, and its output, kept by the down-projections (and q_proj) — under FP8
  each of the two linears reading it keeps its own 1-byte copy instead (the norm writes bf16);
- each latent (q_r and k_r wide) and its norm's statistic, kept by its LayerNormLinear for the norm's backward, and the
  norm's output, kept by the up-projection (1 byte under FP8: the norm writes FP8);
- Q and K (a·(n + r) each) and V (a·v) as megatron's fused MLA RoPE writes them (`apply_rope_fusion`, on by default in
  Megatron-LM), kept by the attention core; the rotary key part lives in K (no other copy is kept);
- the attention scores (standard) or the log-sum-exp per row (flash), and the core output (a·v), kept by o_proj;
- o_proj's dropout mask.
The latents, the norm's output and the mask are whole on every TP rank (divided by +sp); Q, K, V, the scores and
the core output are split by heads. Memory traffic: the norms and the residual (`sub_block_traffic`), the latents'
norms (read and write), the core reading Q, K, V and writing its output; the rotary embedding's pass is not counted
(as for standard attention). FP8: every projection is a Transformer Engine linear; the inputs the down-projections
and q_proj read and o_proj's are cast (the latents' norms write FP8), and every projection's output gradient.
"""

from __future__ import annotations

from gbmw.specs.block_shape import BlockShape, norm_parameter_count
from gbmw.specs.causal_attention import causal_computed_share
from gbmw.specs.model_spec import Matmul


def latent_attention_widths(shape: BlockShape) -> tuple[int, int, int]:
    """(query width, key + value width, the largest weight matrix) of a latent attention: what sequence splitting
    moves per token, and backward's largest weight gradient."""
    heads, qk, v = shape.heads, shape.head_dim, shape.v_head_dim
    nope = qk - shape.qk_rope_head_dim
    query_in = shape.q_lora_rank or shape.hidden
    weights = (query_in * heads * qk, shape.kv_lora_rank * heads * (nope + v), heads * v * shape.hidden,
               shape.hidden * (shape.kv_lora_rank + shape.qk_rope_head_dim), shape.hidden * shape.q_lora_rank)
    return heads * qk, heads * (qk + v), max(weights)


def latent_attention(shape: BlockShape, d: int, dropout: bool, flash: bool, raw_scores: bool,
                     sub_block_traffic: float) -> dict[str, float]:
    """One block's multi-head latent self-attention for one sample (the module docstring), in the keys of
    gbmw.specs.transformer_layers.block_layer's sub-blocks."""
    s, h, heads = shape.tokens, shape.hidden, shape.heads
    keys = shape.attended_tokens
    qk, rope, v = shape.head_dim, shape.qk_rope_head_dim, shape.v_head_dim
    nope = qk - rope
    q_rank, kv_rank = shape.q_lora_rank, shape.kv_lora_rank
    mask = 1 if dropout else 0
    norm_statistics = (2 if shape.norm == "layer" else 1) * 4
    fp8 = 1 if shape.fp8_linears else 0
    linear_input = 1 if fp8 else d
    cast = d + 2

    query_in = q_rank or h  # what the query up-projection (or q_proj) reads
    down = h * q_rank + h * (kv_rank + rope)  # q_a, kv_a: whole on every TP rank
    up = query_in * heads * qk + kv_rank * heads * (nope + v)  # q_b (or q_proj), kv_b: split by heads
    out = heads * v * h
    weights = down + up + out
    norms = norm_parameter_count(shape, h) + norm_parameter_count(shape, q_rank) + norm_parameter_count(shape, kv_rank)
    core_flops = 2 * s * keys * heads * (qk + v)  # scores Q·Kᵀ over n + r, scores × V over v
    flops = 2 * s * weights + core_flops

    if flash:
        score_bytes = heads * s * 4  # fp32 log-sum-exp per row
    else:
        score_bytes = heads * s * keys * (d + (mask + d if dropout else 0) + (d if raw_scores else 0))
    projection_input = (d + fp8) if flash else linear_input
    split = s * heads * (2 * qk + v) * d + score_bytes + s * heads * v * projection_input
    latents = q_rank + kv_rank
    latent_norms = (1 if q_rank else 0) + 1
    replicated = (s * h * (2 if fp8 else d) + s * norm_statistics  # the input norm's output (FP8: two copies)
                  + s * latents * (d + linear_input) + s * latent_norms * norm_statistics
                  + s * h * mask)
    score_traffic = 0 if flash else heads * s * keys * ((6 * d + 1) if dropout else 4 * d)
    core_traffic = s * heads * (2 * qk + 2 * v) * d + score_traffic
    query_matmuls = ((Matmul(rows_per_sample=s, out_features=q_rank, in_features=h, tp_split="none"),
                      Matmul(rows_per_sample=s, out_features=heads * qk, in_features=q_rank, tp_split="out"))
                     if q_rank else
                     (Matmul(rows_per_sample=s, out_features=heads * qk, in_features=h, tp_split="out"),))
    return dict(
        params=weights + norms,
        tp_split=up + out,
        flops=flops,
        replicated_flops=2 * s * down,
        split=split,
        replicated=replicated,
        allreduce=s * (h + query_in + kv_rank) * d / 2,
        traffic=sub_block_traffic + 2 * s * latents * d,
        split_traffic=core_traffic,
        flash_flops=core_flops if flash else 0,
        flash_skipped_flops=(core_flops * (1 - causal_computed_share(s, keys)) if flash and shape.causal else 0),
        core_bytes=score_bytes,
        core_flops=core_flops,
        core_traffic=score_traffic,
        fp8_flops=fp8 * 2 * s * weights,
        fp8_params=fp8 * weights,
        fp8_replicated_params=fp8 * down,
        # forward: the inputs of the down-projections (and q_proj) and of o_proj; backward: every output gradient
        fp8_forward_cast=fp8 * cast * s * (2 * h + heads * v),
        fp8_backward_cast=fp8 * cast * s * (q_rank + heads * qk + kv_rank + rope + heads * (nope + v) + h),
        fp8_norm_cast=fp8 * s * latents,  # the up-projections' inputs, the latents' norms' outputs
        matmuls=query_matmuls + (
            Matmul(rows_per_sample=s, out_features=kv_rank + rope, in_features=h, tp_split="none"),
            Matmul(rows_per_sample=s, out_features=heads * (nope + v), in_features=kv_rank, tp_split="out"),
            Matmul(rows_per_sample=s, out_features=h, in_features=heads * v, tp_split="in"),
        ),
    )
