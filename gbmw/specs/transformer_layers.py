"""Analytic costs of one layer of each kind — a Transformer block, a token embedding, a language-model head,
a classifier head — from tensor shapes and dtypes (paper Sec. 5).

The activation accounting per block is Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (2022), Sec. 4.1: with 16-bit activations and 1-byte dropout masks a GPT block stashes
s·h·(34 + 5·a·s/h) bytes per sample, of which s·h·(10) stays whole under TP and the rest is divided. FLOPs
count 2 per multiply-add of every matmul, so 3× the forward FLOPs of all layers is Megatron's model-FLOPs
formula 72·B·s·L·h²·(1 + s/6h + V/12hL).

Memory traffic: the bytes the forward pass's memory-bound kernels read and write, per sample, counted as unfused
PyTorch runs them — a norm reads its input and writes its output (2·d per element), dropout also writes a
1-byte mask (2·d + 1), a residual add reads two tensors and writes one (3·d), an activation reads its input(s)
and writes its output; without flash attention the scores are written, read and written by the softmax (and
by dropout), and read by the scores × V matmul (4·d, or 6·d + 1 with dropout, per score); flash attention
reads Q, K, V and writes its output. Matmul inputs and outputs are the matmuls' own traffic (in their FLOP/s).

FP8 (`BlockShape.fp8_linears`: precision fp8; megatron-core's TE linears, megatron/core/extensions/
transformer_engine.py), read in TransformerEngine's transformer_engine/pytorch/module/: a linear stashes its input
quantised, column-wise only — 1 byte per element (linear.py `_linear_forward_impl`: `inputmat.update_usage(
rowwise_usage=False, columnwise_usage=True)`; layernorm_linear.py `_LayerNormLinear.forward` keeps the norm's FP8
`ln_out`; grouped_linear.py `_GroupedLinear.forward` per expert); where another op keeps the bf16 tensor too, both
stay (flash attention its output beside the projection's FP8 copy; the router the norm output a shared expert
quantises). A LayerNormLinear's norm writes FP8 itself (`with_quantized_norm`); every other linear input is cast by a
pass reading d bytes and writing 2 (row- and column-wise), and so is every output gradient in backward
(`_linear_backward`), counted TP-split (exact with sequence parallelism, an under-count of the row-parallel ones
without it). The weights' casts and copies: gbmw.cost.fp8. Left out: delayed scaling's amax reductions, FP8
all-gathers of sequence-parallel inputs (the TP collectives are priced in bf16).
"""

from __future__ import annotations

from gbmw.specs.block_shape import BlockShape, norm_parameter_count
from gbmw.specs.causal_attention import causal_computed_share
from gbmw.specs.latent_attention import latent_attention, latent_attention_widths
from gbmw.specs.model_spec import LayerSpec, Matmul
from gbmw.specs.moe_mlp import moe_mlp

__all__ = ["BlockShape", "block_layer", "classifier_head", "embedding_layer", "lm_head_layer"]

TOKEN_ID_BYTES = 8  # int64 token ids are the input of an embedding layer


def block_layer(name: str, kind: str, shape: BlockShape, dtype_bytes: int, dropout: bool, flash: bool,
                raw_scores: bool = False) -> LayerSpec:
    """Costs of one self-attention (+ optional cross-attention) + MLP block (Korthikanti et al. Sec. 4.1); with
    `shape.kv_lora_rank` the self-attention is multi-head latent attention (gbmw.specs.latent_attention), with
    `shape.experts` the MLP a mixture of experts (gbmw.specs.moe_mlp).

    `raw_scores`: standard attention that also stashes the raw scores QKᵀ (d bytes each) beside the softmax
    output. The paper's testbed did: its Table 2 activation sizes per sample grow per layer by gbmw's accounting
    plus exactly that tensor (ViT-Huge to 0.1 %, benchmarks/paper_table3.py) — consistent with the autograd of
    its day saving the input of the scaling multiply, which current PyTorch saves only when the scale needs a
    gradient."""
    s, h, d = shape.tokens, shape.hidden, dtype_bytes
    attention_width = shape.heads * shape.head_dim
    kv_width = shape.kv_heads * shape.head_dim
    mask = 1 if dropout else 0
    score_dropout = dropout if shape.score_dropout is None else shape.score_dropout
    norm_params = norm_parameter_count(shape, h)
    norm_statistics = (2 if shape.norm == "layer" else 1) * 4  # fp32 bytes per token kept for the norm's backward
    up_outputs = 2 if shape.gated_mlp else 1
    fp8 = 1 if shape.fp8_linears else 0
    linear_input = 1 if fp8 else d  # bytes of a stashed linear input no other op keeps
    cast = d + 2  # an FP8 cast pass reads d bytes and writes the row- and column-wise FP8 data

    def sub_block_traffic(tokens: int) -> float:
        """The norm, the dropout after the output projection, and the residual add, per sample."""
        return tokens * h * (2 * d + ((2 * d + 1) if dropout else 0) + 3 * d)

    def qk_norms(query_tokens: int, kv_input_tokens: int) -> dict[str, float]:
        """The norms on Q and K (`shape.qk_norm`): their weights (`head`: 2 × head_dim, whole on every TP rank, as
        Megatron's `--qk-layernorm` keeps them; `full`: the whole Q and K widths, split with the heads), their
        inputs stashed for the backward (Q and K before the norm, split with the heads), their fp32 statistics
        per row normalised (per head, split; `full`: per token, whole), and the traffic of reading and writing
        Q and K. Norms count no FLOPs here, as the block's own norms do not."""
        if shape.qk_norm == "none":
            return dict(params=0, tp_split=0, split=0, replicated=0, split_traffic=0)
        qk_elements = query_tokens * attention_width + kv_input_tokens * kv_width
        if shape.qk_norm == "head":
            params = norm_parameter_count(shape, 2 * shape.head_dim)
            rows = query_tokens * shape.heads + kv_input_tokens * shape.kv_heads
            return dict(params=params, tp_split=0, split=qk_elements * d + rows * norm_statistics, replicated=0,
                        split_traffic=2 * qk_elements * d)
        params = norm_parameter_count(shape, attention_width + kv_width)
        return dict(params=params, tp_split=params, split=qk_elements * d,
                    replicated=(query_tokens + kv_input_tokens) * norm_statistics, split_traffic=2 * qk_elements * d)

    def attention(query_tokens: int, key_tokens: int, kv_input_tokens: int, causal: bool = False) -> dict[str, float]:
        weights = h * attention_width + 2 * h * kv_width + attention_width * h
        qkv_bias = shape.bias if shape.qkv_bias is None else shape.qkv_bias
        column_biases = (attention_width + 2 * kv_width) if qkv_bias else 0
        row_bias = h if shape.bias else 0
        sinks = shape.heads if shape.attention_sinks else 0  # one learned logit per head, split with the heads
        qk = qk_norms(query_tokens, kv_input_tokens)
        flops = (
            2 * query_tokens * (h * attention_width + attention_width * h)
            + 2 * kv_input_tokens * (2 * h * kv_width)
            + 4 * query_tokens * key_tokens * attention_width  # scores QK^T and scores × V
        )
        scores_per_head = query_tokens * key_tokens
        if flash:
            score_bytes = shape.heads * query_tokens * 4  # fp32 log-sum-exp per row
        else:
            score_bytes = shape.heads * scores_per_head * (d + (1 + d if score_dropout else 0) + (d if raw_scores else 0))
        # the output projection's input: kept by the projection (FP8: its quantised copy, and flash attention keeps
        # its bf16 output beside it)
        projection_input = (d + fp8) if flash else linear_input
        split = (
            query_tokens * attention_width * d  # Q
            + 2 * kv_input_tokens * kv_width * d  # K, V
            + score_bytes
            + query_tokens * attention_width * projection_input
        )
        # norm input, norm output (the QKV linear's input), the norm's fp32 statistics per token (mean and 1/std;
        # RMSNorm: 1/rms only), dropout mask
        replicated = query_tokens * h * (d + linear_input) + query_tokens * norm_statistics + query_tokens * h * mask
        core_traffic = 2 * query_tokens * attention_width * d + 2 * kv_input_tokens * kv_width * d
        score_traffic = 0 if flash else shape.heads * scores_per_head * ((6 * d + 1) if score_dropout else 4 * d)
        core_traffic += score_traffic
        return dict(
            params=weights + column_biases + row_bias + norm_params + qk["params"] + sinks,
            tp_split=weights + column_biases + qk["tp_split"] + sinks,
            flops=flops,
            replicated_flops=0,
            split=split + qk["split"],
            replicated=replicated + qk["replicated"],
            allreduce=query_tokens * h * d,
            traffic=sub_block_traffic(query_tokens),
            split_traffic=core_traffic + qk["split_traffic"],
            flash_flops=4 * query_tokens * key_tokens * attention_width if flash else 0,
            flash_skipped_flops=(4 * query_tokens * key_tokens * attention_width
                                 * (1 - causal_computed_share(query_tokens, key_tokens))
                                 if flash and causal else 0),
            core_bytes=score_bytes,
            core_flops=4 * query_tokens * key_tokens * attention_width,
            core_traffic=score_traffic,
            fp8_flops=fp8 * (flops - 4 * query_tokens * key_tokens * attention_width),
            fp8_params=fp8 * weights,
            fp8_replicated_params=0,
            # forward: the projection's input (the QKV input is the norm's FP8 output); backward: QKV's and the
            # projection's output gradients
            fp8_forward_cast=fp8 * cast * query_tokens * attention_width,
            fp8_backward_cast=fp8 * cast * (query_tokens * attention_width + kv_input_tokens * 2 * kv_width
                                            + query_tokens * h),
            fp8_norm_cast=fp8 * query_tokens * h,  # QKV's input, the norm's output (a cross-attention's query only)
            matmuls=(
                # Q and K, V (one fused QKV matmul where they read the same tokens), then the output projection
                (Matmul(rows_per_sample=query_tokens, out_features=attention_width + 2 * kv_width, in_features=h,
                        tp_split="out"),)
                if query_tokens == kv_input_tokens else
                (Matmul(rows_per_sample=query_tokens, out_features=attention_width, in_features=h, tp_split="out"),
                 Matmul(rows_per_sample=kv_input_tokens, out_features=2 * kv_width, in_features=h, tp_split="out"))
            ) + (Matmul(rows_per_sample=query_tokens, out_features=h, in_features=attention_width, tp_split="in"),),
        )

    self_attention = latent_attention(shape, d, dropout, flash, raw_scores, sub_block_traffic(s)) \
        if shape.kv_lora_rank else attention(s, shape.attended_tokens, s, shape.causal)
    if shape.experts:
        return _finish_block(name, kind, shape, d, [self_attention, moe_mlp(shape, d, dropout, sub_block_traffic(s))],
                             expert_mlp=True)
    mlp_weights = h * shape.ffn * up_outputs + shape.ffn * h
    # beside the attention (`parallel_norms`): the MLP reads the block's input through the attention's norm (1) or its
    # own (2, whose input is the block's input) and shares the attention's dropout; its output is one more add
    mlp_norm_params, mlp_replicated, mlp_traffic = {
        0: (norm_params, s * h * (d + linear_input) + s * norm_statistics + s * h * mask, sub_block_traffic(s)),
        1: (0, s * h * fp8, s * h * 3 * d),  # under FP8, FC1 keeps its own quantised copy of the shared norm output
        2: (norm_params, s * h * linear_input + s * norm_statistics, s * h * 5 * d)}[shape.parallel_norms]
    mlp = dict(
        params=mlp_weights + ((shape.ffn * up_outputs + h) if shape.bias else 0) + mlp_norm_params,
        tp_split=mlp_weights + (shape.ffn * up_outputs if shape.bias else 0),
        flops=2 * s * mlp_weights,
        replicated_flops=0,
        # up-projection output(s), kept by the activation, and the activation's output, kept by FC2; ReLU keeps its
        # output, the tensor FC2 keeps (under FP8 beside FC2's quantised copy)
        split=s * shape.ffn * ((d + fp8) if shape.mlp_activation == "relu" else (up_outputs * d + linear_input)),
        replicated=mlp_replicated,
        allreduce=s * h * d,
        traffic=mlp_traffic,
        split_traffic=s * shape.ffn * (up_outputs + 1) * d,  # the activation reads its input(s), writes its output
        flash_flops=0,
        flash_skipped_flops=0,
        core_bytes=0,
        core_flops=0,
        core_traffic=0,
        fp8_flops=fp8 * 2 * s * mlp_weights,
        fp8_params=fp8 * mlp_weights,
        fp8_replicated_params=0,
        fp8_forward_cast=fp8 * cast * s * shape.ffn,  # FC2's input (FC1's is the norm's FP8 output)
        fp8_backward_cast=fp8 * cast * s * (shape.ffn * up_outputs + h),
        fp8_norm_cast=fp8 * s * h,  # FC1's input, the norm's output
        matmuls=(Matmul(rows_per_sample=s, out_features=shape.ffn * up_outputs, in_features=h, tp_split="out"),
                 Matmul(rows_per_sample=s, out_features=h, in_features=shape.ffn, tp_split="in")),
        gated_elements=s * shape.ffn if shape.gated_mlp else 0,
    )
    parts = [self_attention, mlp]
    if shape.cross_attention_tokens:
        parts.append(attention(s, shape.cross_attention_tokens, shape.cross_attention_tokens))
    return _finish_block(name, kind, shape, d, parts)


def _finish_block(name: str, kind: str, shape: BlockShape, d: int, parts: list[dict], expert_mlp: bool = False
                  ) -> LayerSpec:
    """The LayerSpec of a block from its sub-blocks' costs (self-attention, the MLP or MoE MLP, cross-attention)."""
    s, h = shape.tokens, shape.hidden
    attention_width = shape.heads * shape.head_dim
    kv_width = shape.kv_heads * shape.head_dim
    up_outputs = 2 if shape.gated_mlp else 1
    total = {key: sum((part[key] for part in parts), () if key == "matmuls" else 0) for key in parts[0]}
    boundary = s * h * d
    moe = parts[1] if expert_mlp else None
    workspace = moe["workspace"] if moe else s * shape.ffn * up_outputs * d
    largest_mlp = moe["largest_weight"] / d if moe else h * shape.ffn
    query_width, key_value_width, largest_attention = latent_attention_widths(shape) if shape.kv_lora_rank else (
        attention_width, 2 * kv_width, h * (attention_width + 2 * kv_width))
    return LayerSpec(
        name=name,
        kind=kind,
        parameter_count=int(total["params"] + shape.extra_params),
        tp_split_parameter_count=int(total["tp_split"]),
        forward_flops_per_sample=float(total["flops"]),
        tp_replicated_forward_flops_per_sample=float(total["replicated_flops"]),
        matmuls=total["matmuls"],
        boundary_activation_bytes_per_sample=float(boundary),
        # The first norm's input is the boundary itself: it is counted there, not twice.
        intermediate_activation_bytes_per_sample=float(total["replicated"] - boundary),
        intermediate_tp_split_activation_bytes_per_sample=float(total["split"]),
        side_input_bytes_per_sample=float(shape.cross_attention_tokens * h * d),
        tp_allreduce_bytes_per_sample=float(total["allreduce"]),
        forward_flash_attention_flops_per_sample=float(total["flash_flops"]),
        flash_attention_skipped_flops_per_sample=float(total["flash_skipped_flops"]),
        attention_core_activation_bytes_per_sample=float(total["core_bytes"]),
        attention_core_flops_per_sample=float(total["core_flops"]),
        attention_core_memory_traffic_bytes_per_sample=float(total["core_traffic"]),
        forward_memory_traffic_bytes_per_sample=float(total["traffic"]),
        forward_tp_split_memory_traffic_bytes_per_sample=float(total["split_traffic"]),
        fp8_forward_flops_per_sample=float(total["fp8_flops"]),
        fp8_parameter_count=int(total["fp8_params"]),
        fp8_tp_replicated_parameter_count=int(total["fp8_replicated_params"]),
        fp8_forward_cast_traffic_bytes_per_sample=float(total["fp8_forward_cast"]),
        fp8_backward_cast_traffic_bytes_per_sample=float(total["fp8_backward_cast"]),
        fp8_norm_cast_elements_per_sample=float(total["fp8_norm_cast"]),
        # backward's working set beside the stash: the gradient of the MLP's up-projection output(s), and of its
        # largest weight matrix (an MLP projection, or the fused QKV) in the activation dtype
        backward_workspace_tp_split_bytes_per_sample=float(workspace),
        largest_weight_gradient_tp_split_bytes=float(max(largest_mlp, largest_attention) * d),
        gated_activation_elements_per_sample=float(parts[1].get("gated_elements", 0)),
        # one norm per sub-block (side by side: one or two for both); latent attention's rotary part is not counted
        rms_norm_elements_per_sample=float((shape.parallel_norms or len(parts)) * s * h if shape.norm == "rms" else 0),
        rotary_elements_per_sample=float(s * (attention_width + kv_width)
                                         if shape.rotary and not shape.kv_lora_rank else 0),
        # each sub-block reads the residual stream (side by side, both read the block's input)
        residual_input_bytes_per_sample=float((1 if shape.parallel_norms else len(parts)) * boundary),
        attention_heads=shape.heads,
        kv_heads=shape.kv_heads,
        attention_query_bytes_per_sample=float(s * query_width * d),
        attention_key_value_bytes_per_sample=float(s * key_value_width * d),
        **(moe["experts"] if moe else {}),
    )


def embedding_layer(
    name: str, tokens: int, hidden: int, vocab: int, positions: int, extra_rows: int, dtype_bytes: int,
    dropout: bool, norm: bool, scaled: bool = False,
) -> LayerSpec:
    """Token (vocabulary-parallel under TP) + position embeddings; output all-reduced across TP. `scaled`: the rows
    multiplied by a constant (Gemma's √hidden), one more read and write of each, nothing kept for the backward."""
    d, mask = dtype_bytes, 1 if dropout else 0
    return LayerSpec(
        name=name,
        kind="embedding",
        parameter_count=(vocab + positions + extra_rows) * hidden + (2 * hidden if norm else 0),
        tp_split_parameter_count=vocab * hidden,
        forward_flops_per_sample=0.0,
        boundary_activation_bytes_per_sample=float(tokens * TOKEN_ID_BYTES),
        intermediate_activation_bytes_per_sample=float(tokens * hidden * (mask + (d if norm else 0))),
        intermediate_tp_split_activation_bytes_per_sample=0.0,
        tp_allreduce_bytes_per_sample=float(tokens * hidden * d),
        # the lookup reads and writes each row, the scaling too, positions are added, then dropout and the norm
        forward_memory_traffic_bytes_per_sample=float(tokens * hidden * (
            2 * d + (2 * d if scaled else 0) + (3 * d if positions else 0) + ((2 * d + 1) if dropout else 0)
            + (2 * d if norm else 0))),
        # backward scatters the rows' gradients into a dense fp32 gradient of the table
        largest_weight_gradient_tp_split_bytes=float(vocab * hidden * 4),
    )


def lm_head_layer(
    name: str, tokens: int, hidden: int, vocab: int, dtype_bytes: int, tied_to: str | None, transform: bool,
    norm_params: int, norm_statistics: int | None = None,
) -> LayerSpec:
    """Final norm, (BERT: dense+norm transform), vocabulary projection and cross-entropy.

    The vocabulary-parallel cross-entropy (Megatron's, and torch's on one device) keeps the fp32 softmax of the
    logits, divided by TP; the logits themselves are not kept (the projection keeps its input, and a 16-bit
    logit tensor is freed once copied to fp32). Also kept: the int64 labels, and the norms' fp32 statistics
    (`norm_statistics` per token for the final norm; None: 2 for a LayerNorm of scale and shift, 1 for RMSNorm).
    """
    d = dtype_bytes
    transform_weights = hidden * hidden if transform else 0
    params = norm_params + vocab * hidden + (transform_weights + hidden + 2 * hidden if transform else 0)
    if norm_statistics is None:
        norm_statistics = 2 if norm_params == 2 * hidden else 1 if norm_params else 0
    statistics = norm_statistics + (2 if transform else 0)
    replicated = (
        tokens * hidden * d * (3 if transform else 1)  # norm output (+ dense in, gelu in)
        + tokens * statistics * 4  # fp32 mean and 1/std per token of each LayerNorm (RMSNorm: 1/rms)
        + tokens * TOKEN_ID_BYTES  # the labels
    )
    return LayerSpec(
        name=name,
        kind="head",
        parameter_count=params,
        tp_split_parameter_count=vocab * hidden,
        forward_flops_per_sample=float(2 * tokens * hidden * vocab + 2 * tokens * transform_weights),
        matmuls=(Matmul(rows_per_sample=tokens, out_features=vocab, in_features=hidden, tp_split="out"),),
        boundary_activation_bytes_per_sample=float(tokens * hidden * d),
        intermediate_activation_bytes_per_sample=float(replicated),
        intermediate_tp_split_activation_bytes_per_sample=float(tokens * vocab * 4),
        tp_allreduce_bytes_per_sample=float(tokens * hidden * d),
        # the final norm (BERT: + the transform's GELU and norm); cross-entropy reads the logits, writes their
        # fp32 softmax and reads it for the loss
        forward_memory_traffic_bytes_per_sample=float(tokens * hidden * d * (2 + (4 if transform else 0))),
        forward_tp_split_memory_traffic_bytes_per_sample=float(tokens * vocab * (d + 8)),
        # the cross-entropy's working set beside the kept softmax depends on its implementation (per logit:
        # gbmw.cost.framework_memory.cross_entropy_workspace_bytes_per_logit); the projection's weight gradient
        loss_logits_per_sample=float(tokens * vocab),
        largest_weight_gradient_tp_split_bytes=float(vocab * hidden * d),
        rms_norm_elements_per_sample=float(tokens * hidden if norm_statistics == 1 and not transform else 0),
        tied_to=tied_to,
        tied_parameter_count=vocab * hidden if tied_to else 0,
    )


def classifier_head(tokens: int, hidden: int, classes: int, d: int) -> LayerSpec:
    """Final norm over all tokens, pooling, and a linear classifier (column-parallel over classes)."""
    return LayerSpec(
        name="head",
        kind="head",
        parameter_count=2 * hidden + hidden * classes + classes,
        tp_split_parameter_count=hidden * classes + classes,
        forward_flops_per_sample=float(2 * hidden * classes),
        matmuls=(Matmul(rows_per_sample=1, out_features=classes, in_features=hidden, tp_split="out"),),
        boundary_activation_bytes_per_sample=float(tokens * hidden * d),
        intermediate_activation_bytes_per_sample=float(tokens * hidden * d),
        intermediate_tp_split_activation_bytes_per_sample=float(classes * (d + 4)),
        tp_allreduce_bytes_per_sample=float(hidden * d),
        forward_memory_traffic_bytes_per_sample=float(tokens * hidden * d * 2),  # the final norm
    )
