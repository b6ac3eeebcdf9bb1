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
    ("sdp2+ep2", MODEL, 2, ["sdp2+ep2"] * 6, [6], 2),
    ("z1dp2-z2dp2+ep2", MODEL, 2, ["z1dp2", "z2dp2", "z1dp2+ep2", "z2dp2+ep2+ckpt", "z1dp2+ep2", "z2dp2"], [6], 2),
    ("sdp4+ep2", MODEL, 4, ["sdp4+ep2"] * 6, [6], 2),
    ("z1dp4+ep2", MODEL, 4, ["z1dp4+ep2"] * 6, [6], 2),
    ("z2dp4+ep2+ckpt", MODEL, 4, ["z2dp4+ep2+ckpt"] * 6, [6], 2),
    # MoE blocks: ep2 with sdp (experts sharded over 2), ep4 with sdp (not sharded), ep2 with plain dp; dense z1dp
    ("mixed", MODEL, 4, ["z1dp4", "z1dp4", "sdp4+ep2", "sdp4+ep4+ckpt", "dp4+ep2", "z1dp4"], [6], 2),
    ("tp2-sdp2+ep2", MODEL, 4, ["tp2-sdp2+ep2"] * 6, [6], 2),
    ("pp2", MODEL, 4, ["sdp2", "tp2", "sdp2+ep2", "z2dp2+ep2+ckpt", "z1dp2+ep2", "dp2"], [3, 3], 4),
]
# Tolerances: test_runtime_equivalence's, as in test_runtime_moe (the same fp32 reorderings: an expert's gradient
# summed from copies that arrive from several ranks, a reduce-scatter in place of an all-reduce). What they still
# catch here: expert gradients reduce-scattered over the whole data-parallel group (experts of different EP ranks
# summed into each other: their weights and moments off by far more than 1e-5 / 1e-4 of scale) or averaged instead
# of summed over the expert-data-parallel group (moments off by its size squared: the divide factor is per FSDP2
# unit, not recursive), a z1dp unit that reduce-scatters its experts every micro-batch and keeps only the last one's
# (moments off), and expert shards mis-gathered for checkpoints or loaded into another rank's shard (weights
# compared element by element).


@pytest.mark.dist
@pytest.mark.parametrize("plan_id", [plan[0] for plan in PLANS])
def test_matches_single_process(plan_id):
    from test_runtime_equivalence import assert_same_training, trained_from

    processes = next(plan[2] for plan in PLANS if plan[0] == plan_id)
    assert_same_training(*trained_from(PLANS, processes, plan_id), *_reference())


@pytest.mark.dist
def test_a_checkpoint_saved_with_sharded_experts_resumes_under_another_sharding(tmp_path):
    """Saved after 2 steps with the experts ZeRO-3-sharded over two ranks (sdp4+ep2: each shard gathered over its
    expert-data-parallel group, then every EP rank's experts), resumed on 2 processes with ZeRO-1 and every rank
    holding its own experts unsharded (z1dp2+ep2): the third step's loss and the weights after it equal
    uninterrupted single-process training."""
    from dist_fixture import run_distributed
    from runtime_reference import collect, distributed_training
    from test_runtime_equivalence import assert_same_training

    checkpoint = tmp_path / "step2"
    run_distributed(4, distributed_training, MODEL, ["sdp4+ep2"] * 6, [6], GLOBAL_BATCH, 2, 2, str(checkpoint),
                    timeout_s=150)
    expected_losses, expected_weights = _reference()
    resumed = run_distributed(2, distributed_training, MODEL, ["z1dp2+ep2"] * 6, [6], GLOBAL_BATCH, 2, 1, None,
                              str(checkpoint), timeout_s=150)
    assert_same_training(*collect(resumed), expected_losses[2:], expected_weights)
