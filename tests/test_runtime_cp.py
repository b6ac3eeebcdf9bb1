"""Ring context parallelism (Liu et al. 2023, megatron-core's load-balanced CP; gbmw.adapters.runtime.context_parallel)
in the hybrid runtime trains exactly what one process trains: on GPT (LayerNorm, learned positions, tied head) and
LLaMA-style models (RMSNorm, SwiGLU, rotary positions, 8 query heads on 4 key/value heads), plans with cp alone, with
data parallelism and ZeRO, with TP, over four ranks, mixed with other layouts between layers (Slice-Gather between
CP's chunks j and 2c − 1 − j, Ulysses' contiguous parts and batch slices), with +sel and across a pipeline boundary
give the same losses, weights and Adam moments as single-process training.

Tolerances are test_runtime_equivalence's (its comment derives them). CP adds one reordering to data parallelism's:
attention's softmax over the whole sequence is merged from blocks by their log-sum-exp, a few fp32 roundings per row
(the ring alone is checked in float64 below, where it agrees with torch's attention to 1e-12). What the tolerances
catch here, each by far more: positions taken as a contiguous part rather than the two chunks (learned positions and
rotary angles of the wrong tokens: `test_contiguous_positions_would_be_caught`), a causal mask on the wrong blocks
(a query attends to a later chunk, or misses an earlier one), a key/value gradient left on the rank that computed it
instead of travelling home, a loss share not divided by c, and gradients left unsummed over the CP group (half of
every moment's gradient: 50 %).
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
    ("gpt-cp2", "gpt-tiny", 2, ["cp2"] * 6, [6], 2),
    ("llama-cp2", "llama-tiny", 2, ["cp2"] * 6, [6], 2),
    ("gpt-mixed", "gpt-tiny", 2, ["dp2", "cp2", "ulysses2", "cp2+ckpt", "tp2", "cp2"], [6], 2),
    ("llama-mixed", "llama-tiny", 2, ["cp2", "dp2", "cp2+sel", "ulysses2", "cp2", "sdp2"], [6], 2),
    ("gpt-cp2-dp2", "gpt-tiny", 4, ["cp2-dp2"] * 6, [6], 2),
    ("llama-tp2-cp2", "llama-tiny", 4, ["tp2-cp2"] * 6, [6], 2),
    ("gpt-tp2-cp2", "gpt-tiny", 4, ["tp2-cp2"] * 6, [6], 2),
    ("llama-cp4", "llama-tiny", 4, ["cp4"] * 6, [6], 2),
    ("gpt-cp4-mixed", "gpt-tiny", 4, ["dp4", "cp4", "ulysses4", "cp2-dp2", "tp2-cp2", "dp2-tp2"], [6], 2),
    ("llama-cp2-zero", "llama-tiny", 4, ["cp2-sdp2", "cp2-z1dp2", "cp2-z2dp2+ckpt", "tp2-cp2", "dp4", "cp2-sdp2"],
     [6], 2),
    ("gpt-pp2", "gpt-tiny", 4, ["cp2", "cp2", "dp2", "cp2", "ulysses2", "cp2"], [3, 3], 2),
]


@pytest.mark.parametrize("plan_id, model, processes, strategies, partition, micro_batches", PLANS,
                         ids=[plan[0] for plan in PLANS])
def test_cp_matches_single_process(plan_id, model, processes, strategies, partition, micro_batches):
    assert_same_training(*trained_from(PLANS, processes, plan_id), *reference(model))


def _ring_against_one_process(rank, world_size):
    """Ring attention of this rank's chunks (float64, 8 query heads on 4 key/value heads) and its gradients, against
    torch's attention over the whole sequence, on a ring of all ranks and on rings of two: {(ring size, causal): the
    largest absolute differences of O, dQ, dK and dV}."""
    from dataclasses import replace

    import torch.distributed as dist
    import torch.nn.functional as F

    from gbmw.adapters.runtime.context_parallel import ContextParallel

    generator = torch.Generator().manual_seed(0)
    batch, tokens, heads, kv_heads, head_dim = 2, 16, 8, 4, 8
    query, output_grad = (torch.randn(batch, tokens, heads, head_dim, generator=generator, dtype=torch.float64)
                          for _ in range(2))
    key, value = (torch.randn(batch, tokens, kv_heads, head_dim, generator=generator, dtype=torch.float64)
                  for _ in range(2))
    whole_ring = tuple(range(world_size))
    pairs = [dist.new_group([first, first + 1]) for first in range(0, world_size, 2)]  # every rank creates every group
    rings = [ContextParallel(dist.new_group(list(whole_ring)), world_size, rank, whole_ring),
             ContextParallel(pairs[rank // 2], 2, rank % 2, (rank // 2 * 2, rank // 2 * 2 + 1))]
    # the same rings attending one query row at a time, and 3 rows of a 4-row chunk (a last tile of 1)
    rings += [replace(ring, score_tile_elements=1) for ring in rings]
    rings.append(replace(rings[1], score_tile_elements=3 * batch * heads * 4))
    differences = {}
    for ring in rings:
        for causal in (True, False):
            chunk = tokens // (2 * ring.size)
            mine = torch.cat([torch.arange(index * chunk, (index + 1) * chunk) for index in ring.chunks_of(ring.part)])
            local = [tensor[:, mine].clone().requires_grad_() for tensor in (query, key, value)]
            output = ring.attend(*local, causal, 0.0)
            output.backward(output_grad[:, mine])
            whole = [tensor.clone().requires_grad_() for tensor in (query, key, value)]
            expected = F.scaled_dot_product_attention(*(tensor.transpose(1, 2) for tensor in whole), is_causal=causal,
                                                      enable_gqa=True).transpose(1, 2)
            expected.backward(output_grad)
            compared = [(output, expected[:, mine])] + [(part.grad, full.grad[:, mine])
                                                        for part, full in zip(local, whole)]
            tile = ring.tile_rows(batch, heads, chunk)
            differences[ring.size, causal, tile] = [float((a - b).abs().max()) for a, b in compared]
    return differences


def test_ring_attention_equals_attention_over_the_whole_sequence():
    """In float64, so the check is of the algorithm, not of fp32 rounding: rings of 4 and of 2, causal (the
    load-balanced blocks) and bidirectional (BERT's), whole blocks and tiles of query rows (one row; three of a chunk's
    four, so a diagonal tile starts mid-block), forward and every gradient, within 1e-12."""
    for differences in run_distributed(4, _ring_against_one_process, timeout_s=120):
        assert set(differences) == {(size, causal, tile) for causal in (True, False)
                                    for size, tile in ((4, 2), (2, 4), (4, 1), (2, 1), (2, 3))}
        for case, values in differences.items():
            assert max(values) < 1e-12, (case, values)


def _with_contiguous_positions(rank, world_size, models):
    """Train each model with every CP rank taking its positions as one contiguous part (as Ulysses' would be): the bug
    the chunk positions avoid."""
    from runtime_reference import distributed_training

    from gbmw.adapters.runtime.context_parallel import ContextParallel

    ContextParallel.positions = lambda self, local_tokens, device: torch.arange(
        self.part * local_tokens, (self.part + 1) * local_tokens, device=device)
    return [distributed_training(rank, world_size, model, ["cp2"] * 6, [6], GLOBAL_BATCH, 2, STEPS) for model in models]


def test_contiguous_positions_would_be_caught():
    """The tolerances see the bug: learned positions (GPT) or rotary angles (LLaMA) of each chunk pair taken as one
    contiguous part. GPT's losses move by far more than LOSS_TOLERANCE; LLaMA's rotary angles depend on relative
    positions only, so only pairs of tokens in different chunks are wrong — still more than the tolerance."""
    models = ["gpt-tiny", "llama-tiny"]
    results = run_distributed(2, _with_contiguous_positions, models, timeout_s=300)
    for index, model in enumerate(models):
        losses, weights = collect([result[index] for result in results])
        expected_losses, expected_weights = reference(model)
        assert max(abs(a - b) for a, b in zip(losses, expected_losses)) > 10 * LOSS_TOLERANCE, model
        with pytest.raises(AssertionError):
            assert_same_training(losses, weights, expected_losses, expected_weights)


def test_attention_dropout_and_plus_sp_are_refused_in_one_line():
    """What the ring does not run is refused before training, in the planner's words (gbmw.space)."""
    from runtime_reference import architecture

    from gbmw.adapters.runtime.context_parallel import ContextParallel
    from gbmw.adapters.runtime.model import build_layer
    from gbmw.adapters.runtime.tensor_parallel import TensorParallel
    from gbmw.errors import PlanError
    from gbmw.space.runtime_support import runtime_strategy_refusal
    from gbmw.space.strategy import Strategy

    with pytest.raises(PlanError, match=r"^layer decoder\.0: gbmw.s ring attention \(cp\) runs without attention"):
        build_layer(architecture("gpt-tiny+dropout"), "decoder.0", TensorParallel.single(),
                    sequence=ContextParallel(None, 2, 0, (0, 1)))
    assert "without +sp" in runtime_strategy_refusal(Strategy.parse("tp2-cp2+sp"))
    assert runtime_strategy_refusal(Strategy.parse("tp2-cp2-z2dp2")) is None
