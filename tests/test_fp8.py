"""Precision fp8 (Transformer Engine's FP8 linears, issue 28): each term by exact arithmetic — the block's FP8 FLOPs,
weights, stash and casts (gbmw.specs.transformer_layers), their time and memory (gbmw.cost.layer_cost), the device's
FP8 rate and the refusals."""

from __future__ import annotations

import pytest
from conftest import make_cluster

from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.layer_cost_batch import layer_costs
from gbmw.errors import GbmwError, SpecError
from gbmw.space.strategy import Strategy
from gbmw.space.targets import get_target
from gbmw.specs.architectures import GPTArchitecture
from gbmw.specs.cluster_spec import ClusterSpec
from gbmw.specs.model_spec import ModelSpec
from gbmw.specs.models import build_model
from gbmw.specs.transformer_layers import BlockShape, block_layer

S, H, A, KV, F = 64, 32, 4, 2, 96  # tokens, hidden, heads (head_dim 8), kv heads, SwiGLU width
HD = H // A


def _shape(fp8: bool) -> BlockShape:
    return BlockShape(tokens=S, hidden=H, heads=A, head_dim=HD, kv_heads=KV, ffn=F, attended_tokens=S,
                      gated_mlp=True, bias=False, norm="rms", fp8_linears=fp8)


def _blocks(flash: bool = True):
    return (block_layer("decoder.0", "decoder", _shape(False), 2, dropout=False, flash=flash),
            block_layer("decoder.0", "decoder", _shape(True), 2, dropout=False, flash=flash))


def test_fp8_block_counts_the_linear_gemms_weights_and_casts():
    bf16, fp8 = _blocks()
    qkv_out = A * HD + 2 * KV * HD
    weights = H * qkv_out + A * HD * H + H * 2 * F + F * H  # QKV, projection, SwiGLU FC1 (two outputs), FC2
    assert fp8.fp8_parameter_count == weights and bf16.fp8_parameter_count == 0
    assert fp8.fp8_forward_flops_per_sample == 2 * S * weights  # every FLOP but the attention core's
    assert fp8.forward_flops_per_sample == bf16.forward_flops_per_sample == 2 * S * weights + 4 * S * S * A * HD
    # forward: the projection's and FC2's inputs (d = 2 read, 2 written); backward: every linear's output gradient
    assert fp8.fp8_forward_cast_traffic_bytes_per_sample == 4 * S * (A * HD + F)
    assert fp8.fp8_backward_cast_traffic_bytes_per_sample == 4 * S * (qkv_out + H + 2 * F + H)


@pytest.mark.parametrize("flash", [True, False])
def test_fp8_block_stashes_linear_inputs_in_one_byte(flash):
    bf16, fp8 = _blocks(flash)
    # the two norm outputs (QKV's and FC1's inputs) lose a byte each, whole on every TP rank
    assert bf16.intermediate_activation_bytes_per_sample - fp8.intermediate_activation_bytes_per_sample == 2 * S * H
    # FC2's input (the activation's output) loses a byte; the projection's input gains one beside flash attention's
    # bf16 output, and loses one without flash (nothing else keeps it)
    projection = S * A * HD * (1 if flash else -1)
    assert (fp8.intermediate_tp_split_activation_bytes_per_sample
            - bf16.intermediate_tp_split_activation_bytes_per_sample) == projection - S * F


def test_fp8_layer_cost_prices_gemms_at_the_fp8_rate_casts_and_weight_copies():
    cluster = ClusterSpec.model_validate(make_cluster(devices_per_node=2).model_dump() | {"device": {
        **make_cluster().device.model_dump(), "peak_tflops": {"fp32": 2.0, "bf16": 4.0, "fp8": 8.0},
        "sustained_tflops": {"fp32": 1.0, "bf16": 2.0, "fp8": 3.0}}})
    bf16_block, fp8_block = _blocks()
    models = [ModelSpec(name="b", family="gpt", precision=precision, sequence_length=S, hidden_size=H, layers=(layer,))
              for precision, layer in (("bf16", bf16_block), ("fp8", fp8_block))]
    comm, strategy, micro_batch, tp = CommModel(cluster), Strategy.parse("tp2"), 4, 2
    bf16, fp8 = (layer_costs(model, strategy, micro_batch, CostSettings(cluster, precision, framework="megatron"), comm)
                 for model, precision in zip(models, ("bf16", "fp8")))
    samples, bandwidth = micro_batch, 1000e9
    gemm_saving = fp8_block.fp8_forward_flops_per_sample * samples / tp * (1 / 2e12 - 1 / 3e12)
    casts = (fp8_block.fp8_forward_cast_traffic_bytes_per_sample
             + fp8_block.fp8_backward_cast_traffic_bytes_per_sample) * samples / tp / bandwidth
    weight_cast = fp8_block.fp8_parameter_count / tp * 4 / bandwidth  # once per iteration: the last micro-batch
    # forward once, backward twice the forward GEMMs; the casts as counted
    assert fp8.time_no_grad_sync_s[0] == pytest.approx(bf16.time_no_grad_sync_s[0] - 3 * gemm_saving + casts,
                                                       rel=1e-12)
    assert fp8.time_s[0] - fp8.time_no_grad_sync_s[0] == pytest.approx(
        bf16.time_s[0] - bf16.time_no_grad_sync_s[0] + weight_cast, rel=1e-12)
    # Megatron's bf16 states (18 bytes per parameter) and TE's row- and column-wise FP8 copy of each linear weight
    assert fp8.model_state_bytes[0] - bf16.model_state_bytes[0] == 2 * fp8_block.fp8_parameter_count / tp


def test_fp8_model_keeps_the_head_and_embedding_in_bf16():
    arch = GPTArchitecture(name="m", family="gpt", num_layers=2, hidden_size=H, num_heads=A, num_kv_heads=KV,
                           ffn_hidden_size=F, seq_length=S, vocab_size=100, gated_mlp=True, bias=False, norm="rms",
                           position_embedding="rotary", tie_embeddings=False, dropout=False, attention="flash")
    model = build_model(arch, "fp8")
    assert [layer.fp8_parameter_count > 0 for layer in model.layers] == [False, True, True, False]
    with pytest.raises(SpecError, match="precision fp8 is costed as megatron-core runs it .* not for `family: bert`"):
        build_model(arch.model_copy(update={"family": "bert"}), "fp8")


def test_device_without_fp8_and_targets_without_transformer_engine_refuse_in_one_line():
    cluster = make_cluster()
    assert cluster.sustained_flops("fp8") == cluster.sustained_flops("bf16")  # everything but the FP8 linears
    with pytest.raises(SpecError) as error:
        cluster.linear_flops("fp8")
    assert str(error.value) == (
        "cluster test-cluster: precision fp8: device test-device has no FP8 rate (device.peak_tflops.fp8 and "
        "sustained_tflops.fp8 are not given: no FP8 tensor cores, e.g. A100); train in one of ['fp32', 'bf16'], or "
        "give the device's FP8 GEMM rates")
    assert get_target("megatron-core").precision_refusal("fp8") is None
    for target in ("runtime", "deepspeed", "megatron-deepspeed"):
        plans = "fp32, tf32, fp16, bf16" if target == "runtime" else "fp32, fp16, bf16"  # tf32: the runtime alone
        with pytest.raises(GbmwError, match=f"^precision fp8: --target {target} plans {plans} .*"
                                            "plan it for --target megatron-core, or set the job's precision to bf16$"):
            get_target(target).check_precision("fp8")
