"""Ulysses sequence parallelism (Jacobs et al. 2023; gbmw.adapters.runtime.ulysses) in the hybrid runtime trains exactly
what one process trains: on GPT (LayerNorm, learned positions, tied head) and LLaMA-style models (RMSNorm, SwiGLU,
rotary positions, 8 query heads on 4 key/value heads), plans with ulysses alone, with data parallelism, with TP, over
four ranks, mixed with other layouts between layers (Slice-Gather between sequence parts and batch slices) and across
a pipeline boundary give the same losses, weights and Adam moments as single-process training.

Tolerances are test_runtime_equivalence's (its comment derives them). Ulysses reorders no sum beyond data
parallelism's: each rank's loss is a mean over its tokens scaled by 1/u (one more rounding of a mean of equal parts),
and every weight's gradient is a sum over the data-parallel and Ulysses ranks of partial sums over their tokens, as
plain data parallelism sums them over samples; the attention core runs over the whole sequence on whole heads, as on
one process. What they catch here, each by far more than the tolerance: positions taken locally rather than globally
(the second part embedded or rotated as the first: losses move by 10× the tolerance or more — checked by
`test_local_positions_would_be_caught`), the causal mask over a part rather than the whole sequence, a head or token
part exchanged in the wrong order (tokens attend to other tokens' keys), a loss share not divided by u (every moment
u² too large) and gradients left unsummed over the Ulysses group (half of every moment's gradient: 50 %).
"""

import pytest

torch = pytest.importorskip("torch")

from dist_fixture import run_distributed  # noqa: E402
from runtime_reference import collect  # noqa: E402
from test_runtime_equivalence import (GLOBAL_BATCH, LOSS_TOLERANCE, STEPS, assert_same_training,  # noqa: E402
                                      reference, trained_from)

pytestmark = pytest.mark.dist

# (id, model, processes, per-layer strategies (embedding, 4 blocks, head), partition, micro-batches)
PLANS = [
    ("gpt-ulysses2", "gpt-tiny", 2, ["ulysses2"] * 6, [6], 2),
    ("llama-ulysses2", "llama-tiny", 2, ["ulysses2"] * 6, [6], 2),
    ("gpt-mixed", "gpt-tiny", 2, ["dp2", "ulysses2", "ulysses2+ckpt", "tp2", "ulysses2", "dp2"], [6], 2),
    ("llama-mixed", "llama-tiny", 2, ["dp2", "ulysses2", "tp2", "ulysses2+ckpt", "ulysses2", "sdp2"], [6], 2),
    ("gpt-ulysses2-dp2", "gpt-tiny", 4, ["ulysses2-dp2"] * 6, [6], 2),
    ("llama-tp2-ulysses2", "llama-tiny", 4, ["tp2-ulysses2"] * 6, [6], 2),
    ("gpt-tp2-ulysses2", "gpt-tiny", 4, ["tp2-ulysses2"] * 6, [6], 2),
    ("llama-ulysses4", "llama-tiny", 4, ["ulysses4"] * 6, [6], 2),
    ("gpt-ulysses4-mixed", "gpt-tiny", 4, ["dp4", "ulysses4", "ulysses2-dp2", "tp2-ulysses2", "ulysses4", "dp2-tp2"],
     [6], 2),
    ("llama-ulysses2-zero", "llama-tiny", 4, ["ulysses2-sdp2", "ulysses2-z1dp2", "ulysses2-z2dp2+ckpt", "ulysses2-sdp2",
                                              "dp4", "ulysses2-sdp2"], [6], 2),
    ("gpt-pp2", "gpt-tiny", 4, ["dp2", "ulysses2", "ulysses2", "ulysses2", "ulysses2+ckpt", "tp2"], [3, 3], 4),
    ("llama-pp2", "llama-tiny", 4, ["ulysses2", "ulysses2", "dp2", "ulysses2", "ulysses2", "ulysses2"], [3, 3], 2),
]


@pytest.mark.parametrize("plan_id, model, processes, strategies, partition, micro_batches", PLANS,
                         ids=[plan[0] for plan in PLANS])
def test_ulysses_matches_single_process(plan_id, model, processes, strategies, partition, micro_batches):
    assert_same_training(*trained_from(PLANS, processes, plan_id), *reference(model))


def _with_local_positions(rank, world_size, model, strategies):
    """Train with every Ulysses rank using positions from 0 (the bug global positions avoid)."""
    from runtime_reference import distributed_training

    from gbmw.adapters.runtime.ulysses import UlyssesParallel

    UlyssesParallel.offset = lambda self, local_tokens: 0
    return distributed_training(rank, world_size, model, strategies, [6], GLOBAL_BATCH, 2, STEPS)


@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny"])
def test_local_positions_would_be_caught(model):
    """The tolerances see the bug: learned positions (GPT) or rotary angles (LLaMA) of each part counted from 0. GPT's
    losses move by far more than LOSS_TOLERANCE; LLaMA's rotary angles depend on relative positions only, so only
    the pairs of tokens from different parts are wrong, and the losses move by ~1e-4 (16× the tolerance)."""
    losses, weights = collect(run_distributed(2, _with_local_positions, model, ["ulysses2"] * 6, timeout_s=300))
    expected_losses, expected_weights = reference(model)
    assert max(abs(a - b) for a, b in zip(losses, expected_losses)) > 10 * LOSS_TOLERANCE
    with pytest.raises(AssertionError):
        assert_same_training(losses, weights, expected_losses, expected_weights)
