"""The mixture-of-experts MLP sub-block of a Transformer block (router, routed experts, shared experts): its
parameters, FLOPs, activations and memory traffic per sample, for gbmw.specs.transformer_layers.block_layer."""

from __future__ import annotations

from gbmw.specs.block_shape import BlockShape, norm_parameter_count
from gbmw.specs.model_spec import Matmul


def moe_mlp(shape: BlockShape, d: int, dropout: bool, sub_block_traffic: float) -> dict[str, float]:
    """The mixture-of-experts MLP of one block for one sample (gbmw.specs.architectures.MixtureOfExperts), as
    megatron-core's MoE layer runs it: a router (hidden → experts, replicated under TP, its fp32 probabilities
    stashed), the tokens permuted into c = s·k copies (c = capacity × s·k/E per expert, padded, under a capacity
    factor), the experts' MLPs on them (the experts' TP is the layer's: column- then row-parallel), and the
    weighted sum back; the shared experts run on every token as one dense MLP.

    Stashed beyond the norm: the permuted expert input and the expert output the weighted sum reads (c·h each,
    whole on every TP rank: the experts' TP all-gathers the tokens and reduce-scatters the output, an all-reduce's
    bytes of c·h), and the experts' hidden (c·f_e per up-projection output and the activation's output, split by
    TP). What grows with the tokens a rank receives is reported apart (`expert_*` fields), so that the cost model
    can charge an EP group's busiest rank its load (gbmw.cost.expert_parallel)."""
    s, h = shape.tokens, shape.hidden
    up = 2 if shape.gated_mlp else 1
    mask = 1 if dropout else 0
    norm_params = norm_parameter_count(shape, h)
    norm_statistics = (2 if shape.norm == "layer" else 1) * 4
    per_expert_token = shape.capacity_factor if shape.capacity_factor is not None else 1.0
    copies = s * shape.top_k * per_expert_token  # routed token copies of one sample (padded under a capacity factor)
    expert_weights = h * shape.expert_ffn * up + shape.expert_ffn * h
    expert_biases = (shape.expert_ffn * up + h) if shape.bias else 0
    shared_weights = h * shape.shared_ffn * up + shape.shared_ffn * h
    shared_biases = (shape.shared_ffn * up + h) if shape.bias and shape.shared_ffn else 0
    router_weights = h * shape.experts + (h if shape.shared_gate else 0)
    score_bias = shape.experts if shape.expert_score_bias else 0  # DeepSeek-V3's per-expert routing bias
    router_biases = shape.experts if shape.router_bias else 0
    expert_parameters = shape.experts * (expert_weights + expert_biases)
    expert_flops = 2 * copies * expert_weights
    fp8 = 1 if shape.fp8_linears else 0
    linear_input = 1 if fp8 else d
    cast = d + 2
    # the experts' hidden (FC1's outputs, kept by the activation; its output, kept by FC2), the permuted expert
    # input (kept by FC1) and the expert output the weighted sum reads
    expert_split = copies * shape.expert_ffn * (up * d + linear_input)
    expert_whole = copies * h * (linear_input + d)
    shared_split = s * shape.shared_ffn * (up * d + linear_input)
    # the router keeps the norm output in bf16; a shared expert's FC1 keeps its FP8 copy beside it
    shared_input = s * h * fp8 if shape.shared_ffn else 0
    fp8_cast_forward = cast * (copies * (h + shape.expert_ffn) + (s * (h + shape.shared_ffn) if shape.shared_ffn else 0))
    fp8_cast_backward = cast * (copies * (shape.expert_ffn * up + h)
                                + (s * (shape.shared_ffn * up + h) if shape.shared_ffn else 0))
    return dict(
        params=(expert_parameters + shared_weights + shared_biases + router_weights + score_bias + router_biases
                + norm_params),
        tp_split=expert_parameters + shared_weights + (shared_biases - (h if shared_biases else 0)),
        flops=expert_flops + 2 * s * shared_weights + 2 * s * router_weights,
        replicated_flops=2 * s * router_weights,  # every TP rank routes its tokens whole (the router is not split)
        split=expert_split + shared_split,
        replicated=(s * h * (d + d) + s * norm_statistics + s * h * mask + s * shape.experts * 4 + expert_whole
                    + shared_input),
        allreduce=copies * h * d + (s * h * d if shape.shared_ffn else 0),
        # the norm, dropout and residual add; the permutation and un-permutation copies (each reads and writes the
        # token copies); the router's fp32 softmax
        traffic=sub_block_traffic + 4 * copies * h * d + s * shape.experts * 8,
        split_traffic=copies * shape.expert_ffn * (up + 1) * d + s * shape.shared_ffn * (up + 1) * d,
        flash_flops=0, flash_skipped_flops=0, core_bytes=0, core_flops=0, core_traffic=0,
        fp8_flops=fp8 * (expert_flops + 2 * s * shared_weights),
        fp8_params=fp8 * (shape.experts * expert_weights + shared_weights),
        fp8_replicated_params=0,
        fp8_forward_cast=fp8 * fp8_cast_forward,
        fp8_backward_cast=fp8 * fp8_cast_backward,
        fp8_norm_cast=0,  # the pre-MLP norm writes bf16: the router and the dispatch read it
        matmuls=(Matmul(rows_per_sample=s, out_features=shape.shared_ffn * up, in_features=h, tp_split="out"),
                 Matmul(rows_per_sample=s, out_features=h, in_features=shape.shared_ffn, tp_split="in"))
        if shape.shared_ffn else (),
        workspace=copies * shape.expert_ffn * up * d,
        gated_elements=s * shape.shared_ffn if shape.gated_mlp else 0,
        largest_weight=h * shape.expert_ffn * d,
        experts=dict(num_experts=shape.experts, experts_per_token=shape.top_k, expert_parameter_count=expert_parameters,
                     expert_forward_flops_per_sample=float(expert_flops),
                     expert_dispatch_bytes_per_sample=float(copies * h * d),
                     expert_activation_bytes_per_sample=float(expert_whole),
                     expert_input_activation_bytes_per_sample=float(copies * h * linear_input),
                     expert_tp_split_activation_bytes_per_sample=float(expert_split),
                     expert_load_factor=1.0 if shape.capacity_factor is not None else shape.load_imbalance,
                     expert_largest_weight_gradient_bytes=float(h * shape.expert_ffn * d),
                     expert_gated_activation_elements_per_sample=float(
                         copies / shape.experts * shape.expert_ffn if shape.gated_mlp else 0)),
    )
