"""Selective recomputation (+sel, Korthikanti et al. 2022 Sec. 5) in the hybrid runtime: blocks that recompute their
attention core in backward (gbmw.adapters.runtime.attention_core_recompute) train exactly what one process trains,
in plans that mix +sel with sequence parallelism, TP, ZeRO-1/2/3, data parallelism, full recomputation and a
pipeline, on GPT, BERT (post-norm) and LLaMA-style models (RMSNorm, SwiGLU, rotary, grouped-query attention); and with
dropout on, the recomputation draws the masks the forward drew.

Tolerances are test_runtime_equivalence's (its comment derives them): recomputing the core repeats the same kernel on
the same Q, K and V, so it reorders no sum and the plans differ from one process only by what their TP and data
parallelism reorder. What they still catch here: a recomputed core fed other inputs than the forward's (a stale or
another micro-batch's Q, K, V: losses and moments off by far more than 1e-4 of scale), its gradient dropped or added
twice (Q, K and V's gradients, hence the QKV weights' moments, off by 100 %), a block of a +sel plan that lost its
+sp, TP or sharding (caught as in the other equivalence tests).

The dropout tests compare a plan with its +sel twin, not single-process training: dropout masks are drawn per
(seed, step, micro-batch, layer, batch slice) by the engine and per head on each TP rank, which one process does not
reproduce. Recomputation runs the forward's kernels on the forward's inputs, so the twins agree bit for bit; a mask
drawn again from another generator state (the state not restored) drops other probabilities — about 10 % of them
differ — and changes the attention's gradients by O(1), which bitwise equality (and any tolerance below that) fails.
"""

import pytest

torch = pytest.importorskip("torch")

from dist_fixture import run_distributed  # noqa: E402
from runtime_reference import architecture, collect  # noqa: E402
from test_runtime_equivalence import _train_plans, assert_same_training, reference, trained_from  # noqa: E402

pytestmark = pytest.mark.dist

# (id, model, processes, per-layer strategies (embedding, 4 blocks, head), partition, micro-batches)
PLANS = [
    ("gpt-sel-mixed", "gpt-tiny", 2, ["tp2", "tp2+sp+sel", "sdp2+sel", "tp2+ckpt", "z1dp2+sel", "tp2"], [6], 2),
    ("bert-sel-mixed", "bert-tiny", 2, ["tp2", "tp2+sp+sel", "sdp2+sel", "dp2+ckpt", "tp2+sel", "tp2"], [6], 2),
    ("llama-sel-mixed", "llama-tiny", 2, ["tp2", "tp2+sp+sel", "dp2+ckpt", "sdp2+sel", "z2dp2+sel", "tp2"], [6], 2),
    ("gpt-sel-pp2", "gpt-tiny", 4, ["dp2", "tp2+sel", "tp2+sp+ckpt", "sdp2+sel", "tp2+sp+sel", "tp2"], [3, 3], 2),
    ("llama-sel-tp4", "llama-tiny", 4, ["dp2-tp2", "tp4+sp+sel", "sdp4+sel", "tp2-sdp2+sp+sel", "tp4+ckpt", "tp4"],
     [6], 2),
]


@pytest.mark.parametrize("plan_id, model, processes, strategies, partition, micro_batches", PLANS,
                         ids=[plan[0] for plan in PLANS])
def test_selective_recomputation_matches_single_process(plan_id, model, processes, strategies, partition,
                                                        micro_batches):
    assert_same_training(*trained_from(PLANS, processes, plan_id), *reference(model))


# ---------------------------------------------------------------------------------------------- dropout masks

DROPOUT_PLANS = [  # (model, per-layer strategies without +sel; the twin adds +sel to every block)
    ("gpt-tiny+dropout", ["tp2", "tp2", "sdp2", "tp2+sp", "dp2", "tp2"]),
    ("llama-tiny+dropout", ["tp2", "sdp2", "tp2+sp", "tp2", "z1dp2", "tp2"]),  # grouped-query attention
]


def _with_selective(strategies):
    return [strategies[0]] + [f"{name}+sel" for name in strategies[1:-1]] + [strategies[-1]]


def test_recomputed_core_draws_the_forwards_dropout_masks():
    """Each dropout plan and its +sel twin, 2 processes, 3 steps: the same losses, weights and Adam moments, bit for
    bit (see the module docstring)."""
    runs = []
    for model, strategies in DROPOUT_PLANS:
        runs += [(model, strategies, [6], 2, None), (model, _with_selective(strategies), [6], 2, None)]
    per_rank = run_distributed(2, _train_plans, runs, timeout_s=600)
    trained = [collect([rank_results[index] for rank_results in per_rank]) for index in range(len(runs))]
    for (model, _), plain, selective in zip(DROPOUT_PLANS, trained[0::2], trained[1::2]):
        assert selective[0] == plain[0], model
        assert selective[1].keys() == plain[1].keys()
        for name, tensor in plain[1].items():
            assert torch.equal(selective[1][name], tensor), (model, name)


def _block_gradients(model, recompute_core: bool, seed: int = 0, device: str = "cpu"):
    """The input and parameter gradients of one block with dropout on (the engine's `_seed_dropout` seeds each
    layer's forward alike), its attention core recomputed in backward or not."""
    from gbmw.adapters.runtime.model import build_layer, initial_value
    from gbmw.adapters.runtime.tensor_parallel import TensorParallel

    arch = architecture(model)
    block = build_layer(arch, "decoder.0", TensorParallel.single()).to(device)
    with torch.no_grad():
        for key, parameter in block.named_parameters():
            parameter.copy_(initial_value(f"decoder.0.{key}", parameter.shape, seed))
    block.recompute_attention_core = recompute_core
    x = torch.randn(3, arch.seq_length, arch.hidden_size, generator=torch.Generator().manual_seed(seed))
    x = x.to(device).requires_grad_()
    torch.manual_seed(seed)  # (seeds CUDA's generators too)
    (block(x) ** 2).mean().backward()
    return [x.grad] + [parameter.grad for parameter in block.parameters()]


@pytest.mark.parametrize("model", ["gpt-tiny+dropout", "llama-tiny+dropout"])
def test_one_block_recomputes_its_core_with_the_same_masks(model, monkeypatch):
    """In one process: a +sel block's gradients equal the plain block's bit for bit, and a recomputation that does
    not restore the generator state (what this test exists to catch) changes them."""
    from gbmw.adapters.runtime import attention_core_recompute
    from gbmw.adapters.runtime import ulysses as plain_or_ulysses  # where a block picks its attention core

    plain = _block_gradients(model, recompute_core=False)
    assert all(torch.equal(a, b) for a, b in zip(_block_gradients(model, recompute_core=True), plain))

    def without_restored_state(query, key, value, causal, dropout_p):
        return torch.utils.checkpoint.checkpoint(attention_core_recompute.attention, query, key, value, causal,
                                                 dropout_p, use_reentrant=False, preserve_rng_state=False)

    monkeypatch.setattr(plain_or_ulysses, "recomputed_attention", without_restored_state)
    broken = _block_gradients(model, recompute_core=True)
    assert not torch.equal(broken[0], plain[0])  # the input's gradient flows through the attention's masks


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("model", ["gpt-tiny+dropout", "llama-tiny+dropout"])
def test_one_block_on_cuda_recomputes_its_core_with_the_same_masks(model, monkeypatch):
    """On a GPU SDPA's fused kernels draw attention dropout from the CUDA generator's Philox state, which the
    checkpoint restores for the recomputation. Their fp32 backward may accumulate with atomics (not bit for bit), so
    gradients are compared at 1e-4 of each tensor's largest element: ~10³ fp32 roundings, while another mask (the
    state not restored, checked below) changes them by O(1)."""
    from gbmw.adapters.runtime import attention_core_recompute
    from gbmw.adapters.runtime import ulysses as plain_or_ulysses  # where a block picks its attention core

    def close(mine, expected):
        return all(torch.allclose(a, b, rtol=0.0, atol=1e-4 * float(b.abs().max())) for a, b in zip(mine, expected))

    plain = _block_gradients(model, recompute_core=False, device="cuda")
    assert close(_block_gradients(model, recompute_core=True, device="cuda"), plain)

    def without_restored_state(query, key, value, causal, dropout_p):
        return torch.utils.checkpoint.checkpoint(attention_core_recompute.attention, query, key, value, causal,
                                                 dropout_p, use_reentrant=False, preserve_rng_state=False)

    monkeypatch.setattr(plain_or_ulysses, "recomputed_attention", without_restored_state)
    assert not close(_block_gradients(model, recompute_core=True, device="cuda")[:1], plain[:1])


# ---------------------------------------------------------------------------------------------- gbmw train


@pytest.mark.parametrize("strategies", [["tp2", "tp2+sp+sel", "dp2+sel", "tp2+ckpt", "sdp2+sel", "tp2"]])
def test_gbmw_train_runs_a_selective_plan_under_torchrun(strategies, tmp_path):
    """`gbmw train` on 2 torchrun processes runs a plan with +sel blocks end to end and prints the losses one
    process prints for the one-device plan. Each printed loss (6 decimals) is within 5e-7 of the loss, and the two
    plans' losses agree within test_runtime_equivalence's LOSS_TOLERANCE (5e-6, ten fp32 ulps of a loss ≈ 4.85), so
    6e-6 holds; a wrong loss share (a factor) or a core fed other inputs (the 3rd decimal) fails it."""
    from test_runtime_train import BIN, JOB, _launch, write_plan

    selective = write_plan(tmp_path, 2, strategies)
    single = write_plan(tmp_path, 1, ["single"] * 6)
    runs = [_launch([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "gbmw", "train", JOB,
                     "--plan", selective, "--steps", "2"], tmp_path),
            _launch([str(BIN / "gbmw"), "train", JOB, "--plan", single, "--steps", "2"], tmp_path)]
    assert "tp2+sp+sel, dp2+sel, tp2+ckpt, sdp2+sel" in runs[0]
    losses = [[float(line.split("loss ")[1].split()[0]) for line in out.splitlines() if line.startswith("step ")]
              for out in runs]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], rel=0, abs=6e-6)


@pytest.mark.parametrize("model", ["gpt-tiny+dropout", "llama-tiny+dropout"])
def test_backward_repeats_the_cores_forward_flops_the_estimator_prices(model):
    """A +sel block runs, beyond the plain block's forward and backward, exactly the attention core's forward FLOPs
    that the estimator's recomputation time prices (gbmw.cost.activation_recompute.selective_recompute_s:
    `attention_core_flops_per_sample`, QKᵀ and scores × V, on the flash-costed model the runtime target plans with),
    counted by torch's FlopCounterMode over the matmuls the CPU's recomputing attention runs (with dropout; torch
    does not count its fused CPU kernel). Catches the core recomputed twice or not at all (0 or 2× the FLOPs), or
    the projections recomputed too (+ the QKV and output projections' FLOPs)."""
    from torch.utils.flop_counter import FlopCounterMode

    from gbmw.adapters.runtime.model import build_layer
    from gbmw.adapters.runtime.tensor_parallel import TensorParallel
    from gbmw.specs.models import build_model, model_as_run

    arch, samples = architecture(model), 3
    counted = []
    for recompute_core in (False, True):
        block = build_layer(arch, "decoder.0", TensorParallel.single())
        block.recompute_attention_core = recompute_core
        x = torch.randn(samples, arch.seq_length, arch.hidden_size, requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            block(x).sum().backward()
        counted.append(counter.get_total_flops())
    spec = model_as_run(build_model(arch, "fp32"), fused_attention=True)
    assert counted[1] - counted[0] == spec.layers[1].attention_core_flops_per_sample * samples
