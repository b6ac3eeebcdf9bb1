"""The hybrid runtime on N gloo processes trains exactly what one process trains (DESIGN.md, runtime
principles): same losses and same final weights within fp32 tolerance, for every strategy kind, their
combinations, mixed per-layer plans and uneven pipeline partitions."""

import pytest

torch = pytest.importorskip("torch")

from dist_fixture import run_distributed  # noqa: E402
from runtime_reference import collect, distributed_training, reference_training  # noqa: E402

pytestmark = pytest.mark.dist

STEPS = 3
GLOBAL_BATCH = 8

# (id, model, processes, per-layer strategies (embedding, 4 blocks, head), partition, micro-batches);
# ids ending in "-clipped" clip the global gradient norm to CLIP_NORM (small enough to clip every step).
PLANS = [
    ("dp", "gpt-tiny", 2, ["dp2"] * 6, [6], 2),
    ("sdp", "gpt-tiny", 2, ["sdp2"] * 6, [6], 2),
    ("tp", "gpt-tiny", 2, ["tp2"] * 6, [6], 1),
    ("zero1-zero2-ckpt", "gpt-tiny", 2, ["z1dp2", "z2dp2+ckpt", "z1dp2", "z2dp2", "z1dp2+ckpt", "z2dp2"], [6], 2),
    ("pp-uneven", "gpt-tiny", 2, ["single"] * 6, [2, 4], 4),
    ("mixed-ckpt", "gpt-tiny", 2, ["dp2+ckpt", "tp2", "sdp2+ckpt", "tp2+ckpt", "dp2", "tp2"], [6], 2),
    ("bert-mixed", "bert-tiny", 2, ["tp2", "sdp2", "tp2+ckpt", "dp2", "sdp2+ckpt", "tp2"], [6], 2),
    ("2d-mixed", "gpt-tiny", 4, ["dp2-tp2", "tp2-dp2", "sdp4", "tp4+ckpt", "sdp2-tp2", "dp4"], [6], 2),
    ("pp2-mixed-uneven", "gpt-tiny", 4, ["dp2", "tp2+ckpt", "sdp2", "tp2", "dp2+ckpt", "tp2"], [2, 4], 4),
    ("pp4", "gpt-tiny", 4, ["single"] * 6, [1, 2, 2, 1], 4),
    ("bert-pp2-mixed", "bert-tiny", 4, ["sdp2", "tp2", "dp2+ckpt", "tp2", "sdp2", "tp2+ckpt"], [3, 3], 2),
    ("mixed-clipped", "gpt-tiny", 2, ["sdp2", "tp2", "dp2+ckpt", "tp2", "sdp2", "dp2"], [6], 2),
    ("pp2-2d-clipped", "gpt-tiny", 4, ["tp2", "dp2+ckpt", "sdp2", "tp2", "sdp2", "tp2"], [3, 3], 2),
    # LLaMA-style (RMSNorm, SwiGLU, rotary, 8 query heads on 4 key/value heads, untied head; "+tied": tied head)
    ("llama-mixed", "llama-tiny", 2, ["tp2", "sdp2", "tp2+ckpt", "dp2", "z2dp2+ckpt", "tp2"], [6], 2),
    ("llama-tied-mixed-clipped", "llama-tiny+tied", 2, ["sdp2", "tp2", "dp2+ckpt", "tp2", "z1dp2", "tp2"], [6], 2),
    ("llama-pp2-mixed", "llama-tiny", 4, ["dp2", "tp2+ckpt", "sdp2", "tp2", "dp2+ckpt", "tp2"], [3, 3], 2),
    ("llama-2d-tp4", "llama-tiny", 4, ["dp2-tp2", "tp4", "sdp4+ckpt", "tp2-sdp2", "z1dp4", "tp4"], [6], 2),
    ("llama-tied-pp2", "llama-tiny+tied", 4, ["tp2", "sdp2+ckpt", "dp2", "tp2", "z2dp2", "sdp2"], [2, 4], 4),
]
CLIP_NORM = 0.05

_references = {}
_results = {}


def _train_plans(rank, world_size, runs):
    """Every plan of one world size in one spawn (starting processes and importing torch dominates)."""
    return [distributed_training(rank, world_size, model, strategies, partition, GLOBAL_BATCH, micro_batches, STEPS,
                                 max_grad_norm=max_grad_norm)
            for model, strategies, partition, micro_batches, max_grad_norm in runs]


_tables = {}


def trained_from(plans, processes: int, plan_id: str):
    """(losses, full weights) of `plan_id` among `plans`, training all of `plans` that run on `processes` processes
    in one spawn on first use (train_plan_table)."""
    key = (tuple(plan[0] for plan in plans), processes)
    if key not in _tables:
        _tables[key] = train_plan_table(plans, processes)
    return _tables[key][plan_id]


def train_plan_table(plans, processes: int) -> dict:
    """{plan id: (losses, full weights)} for the rows (id, model, processes, strategies, partition, micro-batches) of
    `plans` that run on `processes` processes, all trained in one spawn without clipping."""
    chosen = [plan for plan in plans if plan[2] == processes]
    runs = [(model, strategies, partition, micro_batches, None)
            for _, model, _, strategies, partition, micro_batches in chosen]
    per_rank = run_distributed(processes, _train_plans, runs, timeout_s=600)
    return {plan[0]: collect([rank_results[index] for rank_results in per_rank]) for index, plan in enumerate(chosen)}


def _family(model):
    return "llama" if model.startswith("llama") else "gpt-bert"


def trained(processes, plan_id):
    """(losses, full weights) of `plan_id`, training every plan with `processes` processes of its family (LLaMA-style
    or GPT/BERT: `-k llama` runs those alone) on first use."""
    family = _family(next(model for identifier, model, *_ in PLANS if identifier == plan_id))
    if (processes, family) not in _results:
        plans = [(identifier, model, strategies, partition, micro_batches)
                 for identifier, model, count, strategies, partition, micro_batches in PLANS
                 if count == processes and _family(model) == family]
        runs = [(model, strategies, partition, micro_batches, clip_norm(identifier))
                for identifier, model, strategies, partition, micro_batches in plans]
        per_rank = run_distributed(processes, _train_plans, runs, timeout_s=600)
        _results[processes, family] = {identifier: collect([rank_results[index] for rank_results in per_rank])
                                       for index, (identifier, *_) in enumerate(plans)}
    return _results[processes, family][plan_id]


def reference(model, max_grad_norm=None):
    if (model, max_grad_norm) not in _references:
        _references[model, max_grad_norm] = reference_training(model, GLOBAL_BATCH, STEPS, max_grad_norm=max_grad_norm)
    return _references[model, max_grad_norm]


def clip_norm(plan_id):
    return CLIP_NORM if plan_id.endswith("-clipped") else None


# fp32 tolerances: what reordered fp32 sums may change, against what the checks exist to catch.
# * Reduction order differs between N processes and one (TP splits each matmul's sum, data parallelism sums a
#   micro-batch's tokens in slices, gloo adds ranks in its own order). A reordered sum rounds differently by a few
#   units of u = 2^-24 (6e-8) of its largest partial sums, compounded through 6 layers' backward and 3 steps: a
#   moment element differs by a small multiple of 1e-7 of its tensor's largest element (at most 1.6e-6 over these
#   plans on the machine this was written on), relative to the element itself by much more where a bias sums 256
#   tokens that cancel — which is why tolerances are relative to each tensor's scale, not to each element.
# * Adam's moments scale with the gradient (Adam's update does not), so comparing them catches a gradient summed or
#   averaged over the wrong ranks (off by a factor ≥ 2: 50 % of every element), a micro-batch dropped or counted
#   twice (~1/m, m ≤ 4: ≥ 25 %), a tied copy's gradient missing. They agree to 1e-4 of their tensor's largest
#   element: ~10³ u-sized reorderings, and 2500× below the smallest of those errors.
# * Weights: Adam's update m̂/(√v̂ + ε) changes by at most ~2·lr·δ/ε per step for a gradient change δ (ε = ADAM_EPS
#   = lr = 1e-3), so 3 steps move a weight ≲ 6·δ apart; with δ ≲ 1e-6 (gradients of size ≲ 1e-2 reordered), 1e-5
#   holds that, and is 1 % of one Adam step (lr), the least a gradient of the wrong sign or a missed update moves
#   a weight.
# * Losses: the mean over 256 tokens of log-softmax values ≈ ln(128) ≈ 4.85, whose fp32 ulp is 4.8e-7; 5e-6 (ten
#   ulps) catches a loss share divided or summed wrongly, which moves it by a factor.
# * The LLaMA-style plans add no new sum to reorder beyond these (RMSNorm's mean over 64 features and rotary's
#   per-element rotation are computed alike on every rank; grouped-query attention keeps whole groups per TP rank),
#   so the same tolerances hold; they still catch a key/value head paired with the wrong query heads (a different
#   attention pattern: losses differ in the 3rd decimal), a rotation by the wrong positions, a gate and up matrix
#   swapped, or a norm's gradient missing its mean term (each changes the moments by far more than 1e-4 of scale).
MOMENT_SCALE_TOLERANCE = 1e-4
WEIGHT_TOLERANCE = 1e-5
LOSS_TOLERANCE = 5e-6


def assert_same_training(losses, weights, expected_losses, expected_weights):
    assert losses == pytest.approx(expected_losses, rel=0.0, abs=LOSS_TOLERANCE)
    assert weights.keys() == expected_weights.keys()
    for name, expected in expected_weights.items():
        if "#" in name:  # an Adam moment: relative to its tensor's largest element
            tolerance = dict(rtol=0.0, atol=MOMENT_SCALE_TOLERANCE * float(expected.abs().max()))
        else:
            tolerance = dict(rtol=0.0, atol=WEIGHT_TOLERANCE)
        torch.testing.assert_close(weights[name], expected, **tolerance, msg=lambda text: f"{name}: {text}")


@pytest.mark.parametrize("plan_id, model, processes, strategies, partition, micro_batches", PLANS,
                         ids=[plan[0] for plan in PLANS])
def test_matches_single_process(plan_id, model, processes, strategies, partition, micro_batches):
    assert_same_training(*trained(processes, plan_id), *reference(model, clip_norm(plan_id)))


def test_resume_under_another_plan_and_device_count(tmp_path):
    """Save after 2 steps on 4 processes (pp 2, mixed), resume on 2 processes (other strategies) and on 1:
    the next step's loss and the weights after it equal uninterrupted single-process training."""
    checkpoint = tmp_path / "step2"
    run_distributed(4, distributed_training, "gpt-tiny", ["dp2", "tp2+ckpt", "sdp2", "tp2", "dp2+ckpt", "tp2"],
                    [2, 4], GLOBAL_BATCH, 4, 2, str(checkpoint), timeout_s=150)
    expected_losses, expected_weights = reference("gpt-tiny")
    for processes, strategies in ((2, ["sdp2", "tp2", "z2dp2", "tp2+ckpt", "sdp2", "dp2"]), (1, ["single"] * 6)):
        resumed = run_distributed(processes, distributed_training, "gpt-tiny", strategies, [6], GLOBAL_BATCH, 2, 1,
                                  None, str(checkpoint), timeout_s=150)
        assert_same_training(*collect(resumed), expected_losses[2:], expected_weights)
