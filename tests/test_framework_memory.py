"""What gbmw's runtime allocates beyond model states and activations (gbmw.framework_memory), priced exactly: the
16-bit weight copy each micro-batch keeps under autocast, a checkpointed layer's copy during recomputation, the
optimizer step's √v reserve, and a tied weight held twice by sharded layers."""

from __future__ import annotations

import pytest
from conftest import make_cluster, make_layer, make_model

from gbmw.comm import CommModel
from gbmw.layer_cost import CostSettings, layer_costs
from gbmw.space import Strategy
from gbmw.stage_cost import StageCosts, stage_estimate, strategy_tables

pytestmark = pytest.mark.unit


def costs(name: str, precision: str, framework: str):
    cluster = make_cluster()
    model = make_model([make_layer("embedding", kind="embedding"), make_layer("block")], precision)
    return layer_costs(model, Strategy.parse(name), 8, CostSettings(cluster, precision, framework=framework),
                       CommModel(cluster))


def test_autocast_copy_is_kept_per_micro_batch_or_made_again_in_recomputation():
    plain, runtime = costs("tp2-dp4", "bf16", "megatron"), costs("tp2-dp4", "bf16", "gbmw-runtime")
    local = 200 + 800 / 2  # the block's replicated and TP-divided parameters on one rank
    assert runtime.forward_memory_bytes[1] - plain.forward_memory_bytes[1] == pytest.approx(2 * local)
    assert runtime.forward_memory_bytes[0] == plain.forward_memory_bytes[0]  # an embedding's lookup runs in fp32
    checkpointed = costs("tp2-dp4+ckpt", "bf16", "gbmw-runtime")
    plain_checkpointed = costs("tp2-dp4+ckpt", "bf16", "megatron")
    assert checkpointed.forward_memory_bytes[1] == plain_checkpointed.forward_memory_bytes[1]
    assert checkpointed.backward_memory_bytes[1] - plain_checkpointed.backward_memory_bytes[1] == pytest.approx(2 * local)
    assert costs("tp2-dp4", "fp32", "gbmw-runtime").forward_memory_bytes[1] == costs(
        "tp2-dp4", "fp32", "megatron").forward_memory_bytes[1]  # no autocast in fp32


def _tied_stage(name: str):
    cluster = make_cluster()
    comm = CommModel(cluster)
    model = make_model([make_layer("embedding", kind="embedding"), make_layer("block"),
                        make_layer("head", kind="head", tied_to="embedding", tied_parameter_count=800)], "bf16")
    tables = strategy_tables(model, [Strategy.parse(name)], 8, CostSettings(cluster, "bf16"), comm)
    return tables, stage_estimate(StageCosts(model, tables, 1, 1, "1f1b", comm), 0, 0, [0, 0, 0])


def test_sharded_layers_hold_a_tied_weight_twice_and_every_stage_keeps_the_step_reserve():
    tables, sharded = _tied_stage("sdp8")
    assert sharded.model_state_bytes == pytest.approx(tables.model_state_bytes[0].sum())  # nothing shared
    tables, replicated = _tied_stage("dp8")
    shared = 800 * tables.state_bytes_per_parameter[0]
    assert replicated.model_state_bytes == pytest.approx(tables.model_state_bytes[0].sum() - shared)
    # Adam's √v (4 bytes) for every parameter the stage steps — the tied weight once — up to the runtime's chunk
    assert replicated.peak_memory_bytes == pytest.approx(replicated.forward_backward_peak_bytes + 4 * (3000 - 800))
    assert sharded.peak_memory_bytes == pytest.approx(sharded.forward_backward_peak_bytes + 4 * 3000 / 8)
    from gbmw.framework_memory import step_reserve_bytes
    assert step_reserve_bytes(4, 10**9) == 4 * 2**24
