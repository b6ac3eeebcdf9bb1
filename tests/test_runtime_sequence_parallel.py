"""Sequence parallelism (+sp, Korthikanti et al. 2022 Sec. 4.2.2) in the hybrid runtime trains exactly what one
process trains: plans mixing +sp TP blocks with plain TP, DP, ZeRO-3 and checkpointed layers, on GPT (LayerNorm with
biases, learned positions), BERT (post-norm) and LLaMA-style models (RMSNorm, SwiGLU, rotary, grouped-query attention), give the same
losses, weights and Adam moments as single-process training.

Tolerances are test_runtime_equivalence's (its comment derives them): +sp reorders no sum beyond what TP already
reorders, except the norm weights' and the row-parallel bias's gradients, now summed over the TP group from two
sequence halves (one more fp32 addition of two partial sums: a few u of the gradient). BERT's post-norm blocks
run their norms on the slices too. What they still catch here:
a norm weight's gradient left unsummed over the group (half its value: 50 % of every element of its Adam moments),
a sequence slice taken from the wrong rank or gathered in the wrong order (tokens attend to the wrong positions:
losses differ from the 3rd decimal), an input gradient all-gathered instead of reduce-scattered (the partial sums of
the other ranks missing or doubled), a row-parallel bias added on every rank before the reduction (t times the bias).
"""

import pytest

torch = pytest.importorskip("torch")

from test_runtime_equivalence import assert_same_training, reference, trained_from  # noqa: E402

pytestmark = pytest.mark.dist

# (id, model, processes, per-layer strategies (embedding, 4 blocks, head), partition, micro-batches)
PLANS = [
    ("gpt-sp-mixed", "gpt-tiny", 2, ["tp2", "tp2+sp", "sdp2", "tp2+sp+ckpt", "dp2", "tp2"], [6], 2),
    ("gpt-sp-pp2", "gpt-tiny", 4, ["dp2", "tp2+sp", "tp2+sp+ckpt", "sdp2", "tp2+sp", "tp2"], [3, 3], 2),
    ("gpt-sp-2d", "gpt-tiny", 4, ["dp2-tp2", "tp2-dp2+sp", "tp4+sp", "sdp4", "tp2-sdp2+sp+ckpt", "tp2-z1dp2"], [6], 2),
    ("bert-sp-mixed", "bert-tiny", 2, ["tp2", "tp2+sp", "sdp2", "tp2+sp+ckpt", "dp2+ckpt", "tp2"], [6], 2),
    ("llama-sp-mixed", "llama-tiny", 2, ["tp2", "tp2+sp", "dp2+ckpt", "tp2+sp+ckpt", "z1dp2", "tp2"], [6], 2),
    ("llama-sp-tp4", "llama-tiny", 4, ["dp2-tp2", "tp4+sp", "sdp4+ckpt", "tp2-sdp2+sp", "tp4+sp+ckpt", "tp4"], [6], 2),
]


@pytest.mark.parametrize("plan_id, model, processes, strategies, partition, micro_batches", PLANS,
                         ids=[plan[0] for plan in PLANS])
def test_sequence_parallel_matches_single_process(plan_id, model, processes, strategies, partition, micro_batches):
    assert_same_training(*trained_from(PLANS, processes, plan_id), *reference(model))
