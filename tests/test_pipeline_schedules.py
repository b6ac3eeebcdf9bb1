"""Pipeline schedules (gbmw.cost.pipeline_schedules) and the kernel-level parts of a layer's and a stage's cost: the
interleaved stash and bubble against their closed forms in the literature, stage synchronisations that run at the
same time, memory-bound traffic at the memory bandwidth, flash attention at its own rate, Megatron's scatter-gather
pipeline send, and the optimizer step's traffic."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from conftest import make_cluster, make_layer, make_model

from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings, forward_compute_s
from gbmw.cost.model_states import state_bytes, step_traffic_bytes
from gbmw.cost.pipeline_schedules import in_flight_micro_batches, pipeline_time_s
from gbmw.cost.stage_cost import StageCosts, stage_estimate, strategy_tables
from gbmw.space.strategy import Strategy
from gbmw.space.targets import get_target
from gbmw.specs.transformer_layers import BlockShape, block_layer

pytestmark = pytest.mark.unit


@dataclass
class Times:
    time_s: float
    time_no_grad_sync_s: float
    optimizer_time_s: float = 0.0


@pytest.mark.parametrize("pp, v", [(2, 2), (4, 2), (8, 3), (35, 3)])
def test_interleaved_stash_on_stage_zero_is_korthikantis(pp, v):
    """Korthikanti et al. (2022) Sec. 4.2.3: the first stage of an interleaved pipeline keeps p·(1 + (p−1)/(p·v))
    micro-batches' worth of its activations (plain 1F1B: p)."""
    assert in_flight_micro_batches("1f1b", 0, pp, 1000, v) == pytest.approx(pp * (1 + (pp - 1) / (pp * v)))
    assert in_flight_micro_batches("1f1b", 0, pp, 1000) == pp
    # the last stage: its own warm-up chunks (v − 1)·p plus the one in flight
    assert in_flight_micro_batches("1f1b", pp - 1, pp, 1000, v) == pytest.approx(((v - 1) * pp + 1) / v)
    # never more than all m micro-batches
    assert in_flight_micro_batches("1f1b", 0, pp, 2, v) <= 2


@pytest.mark.parametrize("pp, v, m", [(4, 1, 8), (4, 2, 8), (8, 3, 24)])
def test_balanced_pipeline_time_is_m_plus_the_bubble(pp, v, m):
    """Narayanan et al. (SC21) Sec. 2.2: balanced stages of time C per micro-batch take m·C plus a bubble of
    (p − 1)·C/v; each stage's gradient synchronisation S − C runs on its own devices, so it adds once."""
    compute, sync = 0.5, 0.2
    stages = [Times(compute + sync, compute) for _ in range(pp)]
    assert pipeline_time_s(stages, m, v) == pytest.approx(m * compute + (pp - 1) * compute / v + sync)


def test_the_slowest_synchronisation_and_optimizer_step_count_not_their_sum():
    stages = [Times(1.0, 0.8, 0.05), Times(1.3, 0.9, 0.02), Times(0.95, 0.85, 0.07)]
    expected = 3 * 0.9 + (0.8 + 0.9 + 0.85) + max(0.2, 0.4, 0.1) + 0.07
    assert pipeline_time_s(stages, 4) == pytest.approx(expected)


def test_a_block_costs_its_matmuls_attention_and_traffic_at_their_rates():
    """h = 64, s = 32, 4 heads, ffn 256, 2-byte activations with dropout, flash attention: the memory-bound
    traffic per sample is 2 sub-blocks × s·h·(2d + (2d + 1) + 3d) outside TP, and Q, K, V, O plus the GELU's
    input and output inside it."""
    s, h, ffn, d = 32, 64, 256, 2
    shape = BlockShape(tokens=s, hidden=h, heads=4, head_dim=16, kv_heads=4, ffn=ffn, attended_tokens=s)
    layer = block_layer("b", "decoder", shape, d, dropout=True, flash=True)
    assert layer.forward_memory_traffic_bytes_per_sample == 2 * s * h * (2 * d + 2 * d + 1 + 3 * d)
    assert layer.forward_tp_split_memory_traffic_bytes_per_sample == 4 * s * h * d + 2 * s * ffn * d
    assert layer.forward_flash_attention_flops_per_sample == 4 * s * s * h
    assert layer.forward_flops_per_sample == 2 * s * (4 * h * h + 2 * h * ffn) + 4 * s * s * h
    # without flash, the scores (4 heads × s × s per sample) are written, softmaxed, dropped out and read
    standard = block_layer("b", "decoder", shape, d, dropout=True, flash=False)
    assert (standard.forward_tp_split_memory_traffic_bytes_per_sample
            - layer.forward_tp_split_memory_traffic_bytes_per_sample) == 4 * s * s * (6 * d + 1)
    assert standard.forward_flash_attention_flops_per_sample == 0

    cluster = make_cluster(memory_gb_per_s=100.0)
    model = make_model([layer])
    settings = CostSettings(cluster, "bf16")
    flops, flash = layer.forward_flops_per_sample, layer.forward_flash_attention_flops_per_sample
    split = (flops - flash) / 2e12 + flash / 2e12 + layer.forward_tp_split_memory_traffic_bytes_per_sample / 100e9
    whole = layer.forward_memory_traffic_bytes_per_sample / 100e9
    assert forward_compute_s(model, settings, 8, 2)[0] == pytest.approx(split * 8 / 2 + whole * 8)


def test_scatter_gather_sends_one_tp_share_and_all_gathers():
    """Megatron's pipeline with TP 4: each rank sends 1/4 of the activation over the inter-stage link, then the
    next stage all-gathers it over its TP group; without scatter-gather each rank sends all of it."""
    cluster = make_cluster(nodes=2, devices_per_node=4, intra_gb_per_s=200.0, inter_gb_per_s=40.0)
    comm = CommModel(cluster)
    model = make_model([make_layer(f"l{i}") for i in range(4)])
    tables = strategy_tables(model, [Strategy.parse("tp4")], 8, CostSettings(cluster, "fp32"), comm)
    message = model.layers[2].boundary_activation_bytes_per_sample * 8
    plain = StageCosts(model, tables, 2, 4, "1f1b", comm)
    scatter = StageCosts(model, tables, 2, 4, "1f1b", comm, scatter_gather=True)
    assert plain.boundary_send_s(2, 1, 4) == pytest.approx(comm.p2p_s(message, 4))
    assert scatter.boundary_send_s(2, 1, 4) == pytest.approx(comm.p2p_s(message / 4, 4) + comm.allgather_s(message, 4, 1))
    assert scatter.boundary_send_s(2, 1, 4) < plain.boundary_send_s(2, 1, 4)


def test_blocking_p2p_waits_out_each_boundary_transfer_twice():
    """DeepSpeed's pipeline engine sends and receives as separate blocking calls: a middle stage spends each of its
    two boundaries' transfer twice per micro-batch (its send and the receive the other way), an end stage its one
    boundary's twice; Megatron's batched pairs once. Catches the receives left out (1×) or charged where the
    transfers are batched, or the end stages charged a boundary they do not have."""
    cluster = make_cluster(nodes=2, devices_per_node=4)
    comm = CommModel(cluster)
    model = make_model([make_layer(f"l{i}") for i in range(9)])
    tables = strategy_tables(model, [Strategy.parse("dp4")], 8, CostSettings(cluster, "fp32"), comm)
    batched, blocking = (StageCosts(model, tables, 3, 4, "1f1b", comm, blocking_p2p=flag) for flag in (False, True))
    send = batched.boundary_send_s(3, 4)
    assert blocking.boundary_send_s(3, 4) == pytest.approx(2 * send)
    for stage, boundaries in ((0, 1), (1, 2), (2, 1)):
        once, twice = (stage_estimate(costs, stage, 3 * stage, [0] * 3) for costs in (batched, blocking))
        assert twice.time_no_grad_sync_s - once.time_no_grad_sync_s == pytest.approx(boundaries * send)
        assert twice.time_s - once.time_s == pytest.approx(boundaries * send)
    tp_tables = strategy_tables(model, [Strategy.parse("tp4")], 8, CostSettings(cluster, "fp32"), comm)
    message = model.layers[3].boundary_activation_bytes_per_sample * 8
    scatter = StageCosts(model, tp_tables, 3, 4, "1f1b", comm, scatter_gather=True, blocking_p2p=True)
    # each direction's 1/4 share sent and received, the received one all-gathered once
    assert scatter.boundary_send_s(3, 1, 4) == pytest.approx(2 * comm.p2p_s(message / 4, 4)
                                                             + comm.allgather_s(message, 4, 1))
    assert get_target("megatron-deepspeed").pipeline_blocking_p2p and get_target("deepspeed").pipeline_blocking_p2p
    assert not get_target("megatron-core").pipeline_blocking_p2p


def test_sequence_parallel_layers_send_their_shards_at_a_megatron_boundary():
    """Megatron's +sp layers hold s/t of the sequence on each TP rank: each sends its shard to its peer in the next
    stage and nothing is all-gathered (megatron-core's (s/t, b, h) tensor shape; the older Megatron-LM scatter-gathered
    only without sp). Without +sp the scatter-gather stays (1/t sent, then all-gathered); other frameworks keep the
    whole sequence at a boundary. The two +sp layouts are told apart (and cost nothing to switch between), so the
    search's per-layout boundary prices them right. Catches the all-gather charged under +sp, the shard not taken
    (a whole send), or the rule applied to a framework whose boundary is whole."""
    cluster = make_cluster(nodes=2, devices_per_node=4)
    comm = CommModel(cluster)
    model = make_model([make_layer(f"l{i}") for i in range(6)])
    message = model.layers[3].boundary_activation_bytes_per_sample * 8
    strategies = [Strategy.parse("tp4"), Strategy.parse("tp4+sp")]
    megatron = strategy_tables(model, strategies, 8, CostSettings(cluster, "bf16", framework="megatron"), comm)
    assert list(megatron.boundary_shards) == [1, 4]
    assert megatron.layout[0] != megatron.layout[1]
    assert megatron.transition_fraction[megatron.layout[0], megatron.layout[1]] == 0
    costs = StageCosts(model, megatron, 2, 4, "1f1b", comm, scatter_gather=True)
    assert costs.boundary_send_s(3, 1, 4, 4) == pytest.approx(comm.p2p_s(message / 4, 4))
    assert costs.boundary_send_s(3, 1, 4, 1) == pytest.approx(comm.p2p_s(message / 4, 4) + comm.allgather_s(message, 4, 1))
    plain, sharded = (stage_estimate(costs, 0, 0, [index] * 3) for index in (0, 1))
    gather = comm.allgather_s(message, 4, 1)
    assert (plain.time_no_grad_sync_s - plain_compute(megatron, 0)) - (
        sharded.time_no_grad_sync_s - plain_compute(megatron, 1)) == pytest.approx(gather)
    runtime = strategy_tables(model, strategies, 8, CostSettings(cluster, "bf16"), comm)
    assert list(runtime.boundary_shards) == [1, 1] and runtime.layout[0] == runtime.layout[1]


def plain_compute(tables, strategy: int) -> float:
    """Stage 0's three layers without their boundary: the layers' own time."""
    return float(tables.time_no_grad_sync_s[strategy, :3].sum())


def test_interleaving_multiplies_the_sends_and_the_stash():
    cluster = make_cluster(nodes=2, devices_per_node=4)
    comm = CommModel(cluster)
    model = make_model([make_layer(f"l{i}") for i in range(8)])
    tables = strategy_tables(model, [Strategy.parse("dp4")], 8, CostSettings(cluster, "fp32"), comm)
    plain = stage_estimate(StageCosts(model, tables, 2, 4, "1f1b", comm), 0, 0, [0] * 4)
    interleaved = stage_estimate(StageCosts(model, tables, 2, 4, "1f1b", comm, virtual_stages=2), 0, 0, [0] * 4)
    send = StageCosts(model, tables, 2, 4, "1f1b", comm).boundary_send_s(4, 4)
    compute = plain.time_no_grad_sync_s - send  # stage 0 sends its output (and receives nothing) once
    # stage 0 of 2 with 2 chunks: both chunks send their output, only the second receives an input (and sends its
    # gradient back): the first chunk reads the data
    assert interleaved.time_no_grad_sync_s == pytest.approx(compute + (2 + 1) * send)
    assert interleaved.in_flight_micro_batches == pytest.approx(2 * (1 + 1 / 4))
    # on 3 stages: the middle one sends at every chunk boundary both ways, the last one's last chunk ends in the loss
    three = StageCosts(model, tables, 3, 4, "1f1b", comm, virtual_stages=2)
    middle, final = stage_estimate(three, 1, 2, [0] * 2), stage_estimate(three, 2, 4, [0] * 4)
    layers_s = float(tables.time_no_grad_sync_s[0, :2].sum())
    assert middle.time_no_grad_sync_s == pytest.approx(layers_s + 2 * 2 * send)
    assert final.time_no_grad_sync_s == pytest.approx(2 * layers_s + (1 + 2) * send)


def test_optimizer_step_moves_its_states_gradients_and_weights():
    """Adam: read and write the optimizer states, read the gradient twice (norm, update), write the weights (and
    read them where they are the fp32 master)."""
    assert step_traffic_bytes(state_bytes("megatron", "bf16", "adam")) == 2 * 12 + 2 * 4 + 2
    assert step_traffic_bytes(state_bytes("gbmw-runtime", "bf16", "adam")) == 2 * 8 + 2 * 4 + 2 * 4
    cluster = make_cluster(memory_gb_per_s=100.0)
    comm = CommModel(cluster)
    model = make_model([make_layer(f"l{i}") for i in range(2)])
    settings = CostSettings(cluster, "bf16", framework="megatron")
    tables = strategy_tables(model, [Strategy.parse("z1dp8")], 8, settings, comm)
    stage = stage_estimate(StageCosts(model, tables, 1, 1, "1f1b", comm), 0, 0, [0, 0])
    stepped = 2 * 1000 / 8  # two layers of 1000 parameters, optimizer states sharded 8 ways
    assert stage.optimizer_time_s == pytest.approx(stepped * 34 / 100e9)
