"""Sequence parallelism and selective recomputation in the estimator against Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models" (2022), Sec. 4–5 and Table 2."""

import numpy as np
import pytest
from conftest import make_cluster

from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.layer_cost_batch import layer_costs
from gbmw.space.strategy import Strategy
from gbmw.specs.model_spec import ModelSpec
from gbmw.specs.transformer_layers import BlockShape, block_layer

# GPT-3-like blocks (their Table 3's models): sequence 2048, and the 22B/175B/530B/1T widths and heads.
GPT3_BLOCKS = [(2048, 6144, 64), (2048, 12288, 96), (2048, 20480, 128), (2048, 25600, 160)]


def _block_model(s: int, h: int, a: int, flash: bool = False) -> ModelSpec:
    shape = BlockShape(tokens=s, hidden=h, heads=a, head_dim=h // a, kv_heads=a, ffn=4 * h, attended_tokens=s)
    block = block_layer("decoder.0", "decoder", shape, dtype_bytes=2, dropout=True, flash=flash)
    return ModelSpec(name="gpt3-block", family="gpt", precision="bf16", sequence_length=s, hidden_size=h,
                     layers=(block,))


def _korthikanti_bytes(s: int, h: int, a: int, b: int, t: int, sp: bool, selective: bool) -> float:
    """Table 2's activation memory per layer: s·b·h·(10 + 24/t + 5·a·s/(h·t)) with TP, the 10 divided by t too
    with sequence parallelism, the 5·a·s/(h·t) term gone with selective recomputation."""
    replicated = 10 / t if sp else 10
    core = 0 if selective else 5 * a * s / (h * t)
    return s * b * h * (replicated + 24 / t + core)


@pytest.mark.parametrize("s,h,a", GPT3_BLOCKS)
@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("selective", [False, True])
def test_stash_is_korthikantis_table_2(s, h, a, t, sp, selective):
    """A Megatron-run GPT-3 block's forward stash O_f equals Table 2 for every TP degree with and without SP and
    selective recomputation, to the byte — plus the one thing gbmw counts that they leave out: each of the two
    LayerNorms keeps an fp32 mean and 1/std per token (16 bytes per token, split by t under SP).

    What it catches: a term SP should divide but does not (the norms' inputs and outputs, the dropout masks, the
    layer input), one it divides twice (the TP-split 24·s·h/t), selective recomputation dropping more or less than
    the attention core's 5·a·s² (softmax output, dropout mask and output), or the activation bytes of a block
    drifting from Megatron's (e.g. a mask counted in 2 bytes, or Q/K/V counted once)."""
    if sp and t == 1:
        pytest.skip("sequence parallelism needs TP")
    b = t * 2  # two samples per device after data parallelism over the rest of an 8t-device group
    model = _block_model(s, h, a)
    dims = ((("tp", t),) if t > 1 else ()) + (("dp", 2),)
    strategy = Strategy(dims, selective=selective, sp=sp)
    settings = CostSettings(make_cluster(devices_per_node=2 * t), "bf16", framework="megatron")
    costs = layer_costs(model, strategy, micro_batch=2 * b, settings=settings, comm=CommModel(settings.cluster))
    norm_statistics = 2 * 8 * s * b / (t if sp else 1)
    expected = _korthikanti_bytes(s, h, a, b, t, sp, selective) + norm_statistics
    assert costs.forward_memory_bytes[0] == pytest.approx(expected, rel=1e-12)
    # selective recomputation holds the recomputed core only while the layer runs backward
    core = 5 * a * s * s * b / t if selective else 0.0
    assert costs.backward_memory_bytes[0] == pytest.approx(core, rel=1e-12)


def test_selective_recomputes_the_attention_core_and_sp_keeps_tp_time():
    """Selective recomputation adds the attention core's forward (QKᵀ and scores × V at the matmul rate, softmax and
    dropout traffic at the memory bandwidth), far less than full recomputation; sequence parallelism divides the
    replicated regions' traffic by t (forward and backward) and leaves TP's communication as it was (all-gather + reduce-scatter move
    what the all-reduce moved)."""
    s, h, a, t = 2048, 12288, 96, 8
    model = _block_model(s, h, a)
    settings = CostSettings(make_cluster(), "bf16", framework="megatron")
    comm = CommModel(settings.cluster)

    def time_s(**flags) -> float:
        return float(layer_costs(model, Strategy((("tp", t),), **flags), 1, settings, comm).time_s[0])

    plain, selective, full = time_s(), time_s(selective=True), time_s(ckpt=True)
    flops_rate = settings.cluster.sustained_flops("bf16")
    bandwidth = settings.cluster.memory_bandwidth_bytes_per_s
    core = (4 * s * s * h / flops_rate + a * s * s * (6 * 2 + 1) / bandwidth) / t
    assert selective - plain == pytest.approx(core, rel=1e-9)
    assert selective - plain < (full - plain) / 5
    traffic = model.layers[0].forward_memory_traffic_bytes_per_sample / bandwidth
    # forward and backward (2 × forward) both run the replicated regions on 1/t of the sequence
    assert plain - time_s(sp=True) == pytest.approx(3 * traffic * (1 - 1 / t), rel=1e-9)


@pytest.mark.parametrize("framework", ["gbmw-runtime", "megatron"])
def test_selective_with_flash_attention_frees_the_log_sum_exp(framework):
    """With a fused (flash) core, +sel frees the fp32 log-sum-exp of each row, a·s·4 bytes per sample split by TP
    (gbmw.adapters.runtime.attention_core_recompute), wherever it runs. The core it rebuilds in backward adds nothing to
    gbmw's runtime's backward peak, whose workspace (the MLP's, freed before backward reaches the core) covers it
    (tests/test_fake_memory.py traces it to the byte); where no workspace is priced (Megatron) the rebuilt
    log-sum-exp stays the backward term. Catches +sel priced as standard attention's 5·a·s² on a flash model, or the
    rebuilt core counted in the runtime's backward peak."""
    s, h, a, t, micro_batch = 2048, 12288, 96, 8, 2
    model = _block_model(s, h, a, flash=True)
    settings = CostSettings(make_cluster(devices_per_node=t), "bf16", framework=framework)
    comm = CommModel(settings.cluster)
    plain, selective = (layer_costs(model, Strategy((("tp", t),), selective=flag), micro_batch, settings, comm)
                        for flag in (False, True))
    log_sum_exp = a * s * 4 * micro_batch / t
    assert plain.forward_memory_bytes[0] - selective.forward_memory_bytes[0] == pytest.approx(log_sum_exp, rel=1e-12)
    rebuilt = 0.0 if framework == "gbmw-runtime" else log_sum_exp
    assert selective.backward_memory_bytes[0] - plain.backward_memory_bytes[0] == pytest.approx(rebuilt, abs=1e-6)


def test_strategy_names_round_trip_and_refuse_bad_combinations():
    for name in ("tp4-dp2+sp+sel", "tp2+sp", "tp8+sp+ckpt", "dp8+sel", "single+sel"):
        assert Strategy.parse(name).name == name
    with pytest.raises(Exception, match=r"\+sp.*needs a tp axis"):
        Strategy.parse("dp8+sp")
    with pytest.raises(Exception, match="exclude each other"):
        Strategy.parse("tp8+ckpt+sel")
    with pytest.raises(Exception, match=r"suffixes are \+sp"):
        Strategy.parse("tp8+seq")


def test_search_offers_what_each_target_runs():
    """gbmw's runtime is offered +sp in Transformer blocks only and no +sel (it runs +sel plans; gbmw.space.targets says why
    its search leaves +sel out); megatron-core both; Megatron-DeepSpeed no +sel on a model
    with flash attention (its flash path recomputes nothing), so no plan it is given can be refused for that."""
    from gbmw.search.planner import Planner
    from gbmw.specs.jobs import load_job

    job = load_job("gpt-tiny_cpu-x4")  # flash attention, 4 devices

    def offered(target: str) -> set[str]:
        return {s.name for setting in Planner(job, target=target)._settings() for s in setting.tables.strategies}

    runtime, core, deepspeed = offered("runtime"), offered("megatron-core"), offered("megatron-deepspeed")
    assert {"tp2-dp2+sp", "tp4+sp+ckpt"} <= runtime and not any("+sel" in name for name in runtime)
    planner = Planner(job, target="runtime")
    setting = planner._settings()[0]
    sp = [index for index, s in enumerate(setting.tables.strategies) if s.sp]
    blocks = job.model.is_block
    assert sp and not setting.allowed[sp][:, ~blocks].any() and setting.allowed[sp][:, blocks].all()
    assert {"tp2-z1dp2+sp", "tp2-z1dp2+sp+sel", "z1dp4+sel"} <= core
    assert "tp2-z1dp2+sp" in deepspeed and not any("+sel" in name for name in deepspeed)


def test_plan_with_the_new_choices_round_trips_through_yaml():
    """+sp / +sel strategies and virtual stages survive Plan.to_yaml → Plan.from_yaml exactly."""
    import dataclasses

    import gbmw
    from gbmw.plan import Plan

    job = gbmw.load_job("gpt3-15b_a100-80g-x32")
    plan = gbmw.uniform_plan(job, "tp=8,pp=2,zero=1,ckpt=selective,sp=on,micro=1,target=megatron-core")
    plan = dataclasses.replace(plan, virtual_stages=3)
    again = Plan.from_yaml(plan.to_yaml())
    assert again == plan and again.strategies[1].name == "tp8-z1dp2+sp+sel" and again.virtual_stages == 3
