"""Expert parallelism composed with sharded data parallelism in the runtime (gbmw.adapters.runtime.expert_data_parallel):
an MoE block's routed experts are sharded (ZeRO-1/2/3) over their expert-data-parallel group, everything else over
the whole data-parallel group — and the plan trains exactly what one process trains, on 2 and 4 gloo processes.

On 2 processes with +ep2 every rank holds different experts (expert-data-parallel group of one: the layer's FSDP2
ignores them); on 4 with +ep2 the experts are sharded over two ranks, nested inside the layer's unit over four."""

import pytest

from test_runtime_moe import GLOBAL_BATCH, MODEL, _reference

# (id, model, processes, per-layer strategies (embedding, dense block 0, MoE blocks 1–3, head), partition,
# micro-batches)
PLANS = [
    ("zero-1-2-3+ep2", MODEL, 2, ["z1dp2", "z2dp2", "sdp2+ep2", "z2dp2+ep2+ckpt", "z1dp2+ep2", "sdp2"], [6], 2),
    ("sdp4+ep2", MODEL, 4, ["sdp4+ep2"] * 6, [6], 2),
    ("z1dp4+ep2", MODEL, 4, ["z1dp4+ep2"] * 6, [6], 2),
    ("z2dp4+ep2+ckpt", MODEL, 4, ["z2dp4+ep2+ckpt"] * 6, [6], 2),
    # MoE blocks: ep2 with sdp (experts sharded over 2), ep2 with TP and sdp (not sharded), ep2 with plain dp; dense
    # layers z1dp
    ("mixed", MODEL, 4, ["z1dp4", "z1dp4", "sdp4+ep2", "tp2-sdp2+ep2+ckpt", "dp4+ep2", "z1dp4"], [6], 2),
    ("pp2", MODEL, 4, ["sdp2", "tp2", "sdp2+ep2", "z2dp2+ep2+ckpt", "z1dp2+ep2", "dp2"], [3, 3], 4),
    # +etp1: the experts whole, sharded over their expert-data-parallel pair (ranks ETP · EP = 2 apart), the rest over
    # the data-parallel pair
    ("etp1", MODEL, 4, ["tp2-z1dp2", "tp2-z1dp2", "tp2-sdp2+ep2+etp1+sp", "tp2-z2dp2+ep2+etp1+sp+ckpt",
                        "tp2-z1dp2+ep2+etp1+sp", "tp2-z1dp2"], [6], 2),
]
# Tolerances: test_runtime_equivalence's, as in test_runtime_moe (the same fp32 reorderings: an expert's gradient
# summed from copies that arrive from several ranks, a reduce-scatter in place of an all-reduce). What they still
# catch here, each checked by breaking it: the experts' unit averaging over its expert-data-parallel group instead
# of summing (FSDP2's divide factor is per unit, not recursive: a loss of the three differs) and experts
# sharded over the whole data-parallel group (experts of different EP ranks reduce-scattered into each other: every
# loss differs); and, by the test_runtime_moe argument, expert shards gathered for checkpoints in the wrong order or
# loaded into another rank's shard (weights compared element by element).


@pytest.mark.dist
@pytest.mark.parametrize("plan_id", [plan[0] for plan in PLANS])
def test_matches_single_process(plan_id):
    from test_runtime_equivalence import assert_same_training, trained_from

    processes = next(plan[2] for plan in PLANS if plan[0] == plan_id)
    assert_same_training(*trained_from(PLANS, processes, plan_id), *_reference())


def _save_and_describe_shards(rank, world_size, strategies, steps, checkpoint):
    """Train `steps` steps and save; return, for an MoE block (decoder.1), how many ranks each parameter is sharded
    over (1: a plain tensor) and the shard's share of its rows."""
    from runtime_reference import architecture, make_plan

    from gbmw.adapters.runtime.checkpoint_files import save_checkpoint
    from gbmw.adapters.runtime.engine import AdamSettings, HybridEngine
    from gbmw.adapters.runtime.groups import GroupPool
    from gbmw.adapters.runtime.model import synthetic_batch
    from runtime_reference import ADAM_EPS, LEARNING_RATE

    arch = architecture(MODEL)
    plan = make_plan(MODEL, world_size, strategies, [6], GLOBAL_BATCH, 2)
    engine = HybridEngine(plan, arch, GroupPool(plan), "cpu", adam=AdamSettings(LEARNING_RATE, eps=ADAM_EPS))
    for _ in range(steps):
        engine.train_step(synthetic_batch(arch, GLOBAL_BATCH, engine.step, 0))
    save_checkpoint(engine, checkpoint)
    block = next(layer for layer in engine.layers if layer.name == "decoder.1")
    return {key: (parameter.device_mesh.size() if hasattr(parameter, "device_mesh") else 1,
                  parameter.to_local().shape[0] / parameter.shape[0] if hasattr(parameter, "device_mesh") else 1.0)
            for key, parameter in block.parameters.items()}


@pytest.mark.dist
def test_a_checkpoint_saved_with_sharded_experts_resumes_under_another_sharding(tmp_path):
    """Saved after 2 steps with the experts ZeRO-3-sharded over two ranks (sdp4+ep2: each shard gathered over its
    expert-data-parallel group, then every EP rank's experts), resumed on 2 processes with ZeRO-1 and every rank
    holding its own experts unsharded (z1dp2+ep2): the third step's loss and the weights after it equal
    uninterrupted single-process training. Under sdp4+ep2 a rank holds half of each of its experts (the expert-data-
    parallel group of 2) and a quarter of the router and attention (the data-parallel group of 4)."""
    from dist_fixture import run_distributed
    from runtime_reference import collect, distributed_training
    from test_runtime_equivalence import assert_same_training

    checkpoint = tmp_path / "step2"
    shards = run_distributed(4, _save_and_describe_shards, ["sdp4+ep2"] * 6, 2, str(checkpoint), timeout_s=150)
    for rank, described in enumerate(shards):
        experts = {key: value for key, value in described.items() if key.startswith("moe.experts.")}
        assert len(experts) == 2 * 3  # two experts of three matrices (SwiGLU, no biases)
        assert set(experts.values()) == {(2, 0.5)}, rank
        assert {value for key, value in described.items() if key not in experts} == {(4, 0.25)}, rank
    expected_losses, expected_weights = _reference()
    resumed = run_distributed(2, distributed_training, MODEL, ["z1dp2+ep2"] * 6, [6], GLOBAL_BATCH, 2, 1, None,
                              str(checkpoint), timeout_s=150)
    assert_same_training(*collect(resumed), expected_losses[2:], expected_weights)
