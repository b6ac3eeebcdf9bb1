"""FP8 current scaling (Transformer Engine's Float8CurrentScaling, megatron-core `--fp8-recipe tensorwise`) beside
delayed scaling: each term by exact arithmetic (gbmw.cost.fp8) — the amax pass of every cast, the norm outputs'
own cast passes, the weights' extra read, the TP all-reduces of the amax under sequence parallelism — and the
field's one-line refusals, YAML round trip and Megatron round trip."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_cluster

import gbmw
from gbmw.adapters.megatron import megatron_args_to_plan, plan_to_megatron_args
from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.layer_cost_batch import layer_costs
from gbmw.errors import GbmwError, PlanError, SpecError
from gbmw.plan import Plan
from gbmw.space.strategy import Strategy
from gbmw.specs.cluster_spec import ClusterSpec
from gbmw.specs.jobs import JobSpec
from gbmw.specs.model_spec import ModelSpec
from gbmw.specs.transformer_layers import BlockShape, block_layer

S, H, A, KV, F = 64, 32, 4, 2, 96  # tokens, hidden, heads (head_dim 8), kv heads, SwiGLU width
D = 2  # bf16 activations
LATENCY_S = 5e-6


def _block():
    shape = BlockShape(tokens=S, hidden=H, heads=A, head_dim=H // A, kv_heads=KV, ffn=F, attended_tokens=S,
                       gated_mlp=True, bias=False, norm="rms", fp8_linears=True)
    return block_layer("decoder.0", "decoder", shape, D, dropout=False, flash=True)


def _cluster() -> ClusterSpec:
    base = make_cluster(devices_per_node=2, latency_us=LATENCY_S * 1e6)
    return ClusterSpec.model_validate(base.model_dump() | {"device": {
        **base.device.model_dump(), "peak_tflops": {"fp32": 2.0, "bf16": 4.0, "fp8": 8.0},
        "sustained_tflops": {"fp32": 1.0, "bf16": 2.0, "fp8": 3.0}}})


def _costs(strategy: str, recipe: str, micro_batch: int = 4):
    cluster, block = _cluster(), _block()
    model = ModelSpec(name="b", family="gpt", precision="fp8", sequence_length=S, hidden_size=H, layers=(block,))
    settings = CostSettings(cluster, "fp8", framework="megatron", fp8_recipe=recipe)
    return block, layer_costs(model, Strategy.parse(strategy), micro_batch, settings, CommModel(cluster))


def test_block_counts_the_inputs_its_norms_quantise():
    # QKV's and FC1's inputs: a LayerNormLinear's norm output each
    assert _block().fp8_norm_cast_elements_per_sample == 2 * S * H


def test_current_scaling_adds_an_amax_pass_per_cast_the_norm_casts_and_a_weight_read():
    block, delayed = _costs("tp2", "delayed")
    _, current = _costs("tp2", "current")
    samples, tp, bandwidth = 4, 2, 1000e9
    # every cast (d + 2 bytes per element) reads its tensor once more for the amax (d bytes); the norms' outputs
    # get a cast pass of their own (d + 2); forward once, backward's gradient casts once
    forward_extra = (block.fp8_forward_cast_traffic_bytes_per_sample * D / (D + 2)
                     + block.fp8_norm_cast_elements_per_sample * (D + 2)) * samples / tp / bandwidth
    backward_extra = block.fp8_backward_cast_traffic_bytes_per_sample * D / (D + 2) * samples / tp / bandwidth
    assert forward_extra == pytest.approx(S * (A * (H // A) * D + F * D + 2 * H * (D + 2)) * samples / tp / bandwidth)
    assert current.time_no_grad_sync_s[0] == pytest.approx(
        delayed.time_no_grad_sync_s[0] + forward_extra + backward_extra, rel=1e-12)
    weight_read = block.fp8_parameter_count / tp * 2 / bandwidth  # each weight's amax: its bf16 value read once more
    assert current.time_s[0] - current.time_no_grad_sync_s[0] == pytest.approx(
        delayed.time_s[0] - delayed.time_no_grad_sync_s[0] + weight_read, rel=1e-12)
    # no amax history: nothing held beyond delayed scaling's FP8 copies
    assert current.model_state_bytes[0] == delayed.model_state_bytes[0]
    assert current.forward_memory_bytes[0] == delayed.forward_memory_bytes[0]


def test_sequence_parallel_tensors_all_reduce_their_amax_over_tp():
    """Column-parallel inputs (QKV, FC1) in forward, row-parallel output gradients (projection, FC2) in backward:
    a 4-byte all-reduce over the two TP ranks each, 2·(t − 1) latencies plus its bytes."""
    _, delayed = _costs("tp2+sp", "delayed")
    block, current = _costs("tp2+sp", "current")
    _, current_without_sp = _costs("tp2", "current")
    _, delayed_without_sp = _costs("tp2", "delayed")
    one = 2 * (2 - 1) / 2 * 4 / 100e9 + 2 * (2 - 1) * LATENCY_S
    casts = current_without_sp.time_no_grad_sync_s[0] - delayed_without_sp.time_no_grad_sync_s[0]
    assert current.time_no_grad_sync_s[0] - delayed.time_no_grad_sync_s[0] == pytest.approx(casts + 4 * one,
                                                                                            rel=1e-9)


@pytest.mark.parametrize("bad, line", [
    ("blockwise", "fp8_recipe 'blockwise' is not one of ['delayed', 'current'] (blockwise and MXFP8 scaling are not "
                  "costed)"),
    ("current", None)])
def test_plan_field_round_trips_and_refuses_in_one_line(bad, line):
    plan = Plan(model="m", cluster="c", num_devices=2, precision="fp8", global_batch=4, micro_batch=2,
                num_micro_batches=2, pp=1, partition=(1,), strategies=(Strategy.parse("dp2"),))
    assert "fp8_recipe" not in plan.to_yaml()  # the default is not written: older plans read the same
    if line:
        with pytest.raises(PlanError, match=r"^invalid plan: " + line.replace("[", r"\[").replace("(", r"\(")
                           .replace(")", r"\)").replace("]", r"\]") + "$"):
            dataclasses.replace(plan, fp8_recipe=bad)
        return
    current = dataclasses.replace(plan, fp8_recipe=bad)
    assert "fp8_recipe: current" in current.to_yaml() and Plan.from_yaml(current.to_yaml()) == current
    with pytest.raises(PlanError, match=r"^invalid plan: fp8_recipe current needs precision fp8 \(the plan's is "
                                        r"bf16\)$"):
        dataclasses.replace(current, precision="bf16")
    with pytest.raises(PlanError, match="^plan is for fp8_recipe current but the job scales FP8 by delayed; plan "
                                        "again"):
        current.check_against(ModelSpec(name="m", family="gpt", precision="fp8", sequence_length=S, hidden_size=H,
                                        layers=(_block(),)), fp8_recipe="delayed")


def test_job_refuses_a_recipe_without_fp8_in_one_line():
    model = ModelSpec(name="m", family="gpt", precision="bf16", sequence_length=S, hidden_size=H, layers=(_block(),))
    with pytest.raises(SpecError, match="^j: fp8_recipe current scales FP8 tensors, but the precision is bf16; set "
                                        "precision: fp8 or drop fp8_recipe$"):
        JobSpec(name="j", model=model, cluster=_cluster(), precision="bf16", fp8_recipe="current",
                memory_budget_bytes=1)


FP8_JOB = "model: gpt3-15b\ncluster: h100-80g-x64\nprecision: fp8\nfp8_recipe: current\nglobal_batch: 512\n"


def test_megatron_emits_tensorwise_and_reads_it_back(tmp_path):
    path = tmp_path / "gpt3-15b-fp8cs_h100-80g-x64.yaml"
    path.write_text(FP8_JOB)
    job = gbmw.load_job(path)
    plan = gbmw.uniform_plan(job, "tp=4,pp=2,zero=1,sp=on,micro=1,target=megatron-core")
    assert plan.fp8_recipe == "current"
    args = plan_to_megatron_args(plan, job, "megatron-core")
    assert args[args.index("--fp8-recipe") + 1] == "tensorwise"
    back = megatron_args_to_plan(args, job, "megatron-core")
    assert back == dataclasses.replace(plan, estimate=None)
    delayed = [*args[:args.index("--fp8-recipe") + 1], "delayed", *args[args.index("--fp8-recipe") + 2:]]
    with pytest.raises(GbmwError, match="^Megatron arguments scale FP8 by --fp8-recipe delayed but job "
                                        "gpt3-15b-fp8cs_h100-80g-x64 has fp8_recipe current$"):
        megatron_args_to_plan(delayed, job, "megatron-core")
    with pytest.raises(GbmwError, match="--fp8-recipe blockwise with bf16: gbmw costs FP8 as --bf16 --fp8-format "
                                        "hybrid --fp8-recipe delayed or tensorwise only$"):
        megatron_args_to_plan(args + ["--fp8-recipe", "blockwise"], job, "megatron-core")
