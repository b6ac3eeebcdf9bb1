"""Multi-head latent attention (DeepSeek-V2 Sec. 2.1; gbmw.specs.latent_attention): each term of a block's cost by
exact arithmetic — weights and their TP split, FLOPs (the duplicated down-projections apart), stash, traffic, FP8 —
the layer cost of the duplicated linears under TP with and without +sp, the architecture's checks and the runtime's
refusal."""

from __future__ import annotations

import pytest
from conftest import make_cluster

from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings, forward_compute_s
from gbmw.cost.layer_cost_batch import layer_costs
from gbmw.space.runtime_support import runtime_refusal
from gbmw.space.strategy import Strategy
from gbmw.specs.architectures import GPTArchitecture
from gbmw.specs.cluster_spec import ClusterSpec
from gbmw.specs.model_spec import Matmul, ModelSpec
from gbmw.specs.models import build_model
from gbmw.specs.transformer_layers import BlockShape, block_layer

S, H, A, F = 32, 64, 4, 96  # tokens, hidden, heads, SwiGLU width
QR, KR, NOPE, ROPE, V = 48, 16, 12, 4, 10  # query latent, key/value latent, head widths
QK = NOPE + ROPE
D = 2


def _shape(q_rank: int = QR, fp8: bool = False) -> BlockShape:
    return BlockShape(tokens=S, hidden=H, heads=A, head_dim=QK, kv_heads=A, ffn=F, attended_tokens=S, gated_mlp=True,
                      bias=False, norm="rms", q_lora_rank=q_rank, kv_lora_rank=KR, qk_rope_head_dim=ROPE, v_head_dim=V,
                      fp8_linears=fp8)


def _block(q_rank: int = QR, flash: bool = True, fp8: bool = False):
    return block_layer("decoder.0", "decoder", _shape(q_rank, fp8), D, dropout=False, flash=flash)


def test_weights_as_transformers_builds_them_and_their_tp_split_as_megatron_core():
    block = _block()
    q_a, q_b = H * QR, QR * A * QK
    kv_a, kv_b = H * (KR + ROPE), KR * A * (NOPE + V)
    o = A * V * H
    norms = H + QR + KR  # input norm, q_a_layernorm, kv_a_layernorm (RMSNorm: a scale each)
    mlp = 3 * H * F + H
    assert block.parameter_count == q_a + q_b + kv_a + kv_b + o + norms + mlp
    assert block.tp_split_parameter_count == q_b + kv_b + o + 3 * H * F  # the down-projections are duplicated
    no_query_latent = _block(q_rank=0)  # q_proj straight from the hidden state
    assert no_query_latent.parameter_count == H * A * QK + kv_a + kv_b + o + H + KR + mlp
    assert no_query_latent.tp_split_parameter_count == H * A * QK + kv_b + o + 3 * H * F


@pytest.mark.parametrize("flash", [True, False])
def test_flops_and_matmuls(flash):
    block = _block(flash=flash)
    projections = H * QR + QR * A * QK + H * (KR + ROPE) + KR * A * (NOPE + V) + A * V * H
    core = 2 * S * S * A * (QK + V)  # Q·Kᵀ over the n + r wide heads, scores × V over v
    assert block.forward_flops_per_sample == 2 * S * (projections + 3 * H * F) + core
    assert block.tp_replicated_forward_flops_per_sample == 2 * S * (H * QR + H * (KR + ROPE))
    assert block.attention_core_flops_per_sample == core
    assert block.forward_flash_attention_flops_per_sample == (core if flash else 0)
    assert block.matmuls[:5] == (
        Matmul(rows_per_sample=S, out_features=QR, in_features=H, tp_split="none"),
        Matmul(rows_per_sample=S, out_features=A * QK, in_features=QR, tp_split="out"),
        Matmul(rows_per_sample=S, out_features=KR + ROPE, in_features=H, tp_split="none"),
        Matmul(rows_per_sample=S, out_features=A * (NOPE + V), in_features=KR, tp_split="out"),
        Matmul(rows_per_sample=S, out_features=H, in_features=A * V, tp_split="in"))
    assert sum(2 * S * m.out_features * m.in_features for m in block.matmuls) == block.forward_flops_per_sample - core


@pytest.mark.parametrize("flash", [True, False])
def test_stash_traffic_and_what_sequence_splitting_moves(flash):
    block = _block(flash=flash)
    statistic = 4  # RMSNorm's fp32 1/rms per row
    scores = A * S * 4 if flash else A * S * S * D
    # Q, K (n + r per head) and V as the fused RoPE writes them, the scores, the core output kept by o_proj; then the
    # MLP's SwiGLU hidden (two FC1 outputs and the activation's output)
    assert block.intermediate_tp_split_activation_bytes_per_sample == (
        S * A * (2 * QK + V) * D + scores + S * A * V * D + S * F * 3 * D)
    # the input norm's output and statistic, each latent with its norm's output and statistic; the MLP's norm input
    # and output and statistic; less the boundary (the input norm's input)
    attention = S * H * D + S * statistic + S * (QR + KR) * 2 * D + 2 * S * statistic
    mlp = S * H * 2 * D + S * statistic
    assert block.intermediate_activation_bytes_per_sample == attention + mlp - S * H * D
    assert block.attention_query_bytes_per_sample == S * A * QK * D
    assert block.attention_key_value_bytes_per_sample == S * A * (QK + V) * D
    # TP: o_proj's all-reduce in forward, the up-projections' input gradients in backward: half their sum per pass
    assert block.tp_allreduce_bytes_per_sample == S * (H + QR + KR) * D / 2 + S * H * D
    assert block.largest_weight_gradient_tp_split_bytes == max(H * F, QR * A * QK, A * V * H, H * QR) * D


def test_fp8_makes_every_projection_an_fp8_linear():
    bf16, fp8 = _block(), _block(fp8=True)
    down, up, o = H * QR + H * (KR + ROPE), QR * A * QK + KR * A * (NOPE + V), A * V * H
    assert fp8.fp8_parameter_count == down + up + o + 3 * H * F and bf16.fp8_parameter_count == 0
    assert fp8.fp8_tp_replicated_parameter_count == down
    assert fp8.fp8_forward_flops_per_sample == 2 * S * (down + up + o + 3 * H * F)
    cast = D + 2
    # forward: the norm output into each down-projection, o_proj's input, FC2's; backward: every output gradient
    assert fp8.fp8_forward_cast_traffic_bytes_per_sample == cast * S * (2 * H + A * V + F)
    assert fp8.fp8_backward_cast_traffic_bytes_per_sample == cast * S * (
        QR + A * QK + KR + ROPE + A * (NOPE + V) + H + 2 * F + H)
    # the norm output: two 1-byte copies for bf16's one; the latents' norm outputs and the MLP's: 1 byte each
    assert (bf16.intermediate_activation_bytes_per_sample - fp8.intermediate_activation_bytes_per_sample
            == S * H * (D - 2) + S * (QR + KR) * (D - 1) + S * H * (D - 1))


def test_duplicated_linears_cost_whole_on_every_tp_rank_unless_sequence_parallel():
    block = _block()
    cluster = ClusterSpec.model_validate(make_cluster().model_dump() | {"device": {
        **make_cluster().device.model_dump(), "peak_tflops": {"fp32": 2.0, "bf16": 4.0, "fp8": 8.0},
        "sustained_tflops": {"fp32": 1.0, "bf16": 2.0, "fp8": 3.0}}})
    model = ModelSpec(name="b", family="gpt", precision="bf16", sequence_length=S, hidden_size=H, layers=(block,))
    settings = CostSettings(cluster, "bf16", framework="megatron")
    samples, tp, rate = 4, 2, 2e12
    replicated = block.tp_replicated_forward_flops_per_sample * samples / rate
    plain = forward_compute_s(model, settings, samples, tp)[0]
    sequence_parallel = forward_compute_s(model, settings, samples, tp, sequence_parallel=True)[0]
    whole_traffic = block.forward_memory_traffic_bytes_per_sample * samples / 1000e9
    assert plain - sequence_parallel == pytest.approx((replicated + whole_traffic) * (1 - 1 / tp), rel=1e-12)
    one_rank = forward_compute_s(model, settings, samples, 1)[0]
    assert plain == pytest.approx((one_rank - replicated - whole_traffic) / tp + replicated + whole_traffic, rel=1e-12)
    fp8_block = _block(fp8=True)
    fp8_model = model.model_copy(update={"layers": (fp8_block,), "precision": "fp8"})
    weights = [layer_costs(m, Strategy.parse("tp2"), 4, CostSettings(cluster, m.precision, framework="megatron"),
                           CommModel(cluster)).model_state_bytes[0] for m in (model, fp8_model)]
    # TE's FP8 copies: the duplicated down-projections' whole on each rank, the rest halved
    whole = fp8_block.fp8_tp_replicated_parameter_count
    assert weights[1] - weights[0] == 2 * ((fp8_block.fp8_parameter_count - whole) / tp + whole)


def _architecture(**changes) -> GPTArchitecture:
    fields = dict(name="m", family="gpt", num_layers=2, hidden_size=H, num_heads=A, ffn_hidden_size=F, seq_length=S,
                  vocab_size=100, gated_mlp=True, bias=False, norm="rms", position_embedding="rotary",
                  tie_embeddings=False, dropout=False,
                  latent_attention=dict(q_lora_rank=QR, kv_lora_rank=KR, qk_nope_head_dim=NOPE,
                                        qk_rope_head_dim=ROPE, v_head_dim=V))
    return GPTArchitecture.model_validate({**fields, **changes})


def test_the_architecture_builds_the_block_and_refuses_what_mla_has_no_room_for():
    arch = _architecture()
    assert build_model(arch, "bf16").layers[1] == _block(flash=False)
    assert _architecture(num_kv_heads=A).num_kv_heads == A  # as many key/value heads as heads: no groups
    for changes, message in (({"num_kv_heads": 2}, "num_kv_heads 2 with latent_attention: every one of the 4 heads"),
                             ({"head_dim": 8}, "head_dim 8 with latent_attention"),
                             ({"position_embedding": "learned"}, "position_embedding 'learned' with latent_attention"),
                             ({"bias": True}, "bias true with latent_attention"),
                             ({"qk_norm": "head"}, "qk_norm 'head' with latent_attention"),
                             ({"sliding_window": 8}, "sliding_window 8 with latent_attention")):
        with pytest.raises(ValueError, match=message):
            _architecture(**changes)
    assert "`latent_attention` (multi-head latent attention" in runtime_refusal(arch, "bf16")
