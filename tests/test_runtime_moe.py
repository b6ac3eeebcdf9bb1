"""Mixture-of-experts blocks in the runtime (gbmw.adapters.runtime.experts): the MoE MLP is Mixtral's routing with
its exact gradient on one process, and plans with expert parallelism (+epN) on N gloo processes — alone, with TP,
with pipeline stages, beside context parallelism and Ulysses, and mixed with other per-layer strategies — train
exactly what one process trains."""

import pytest

from gbmw.space.runtime_support import runtime_refusal

MODEL = "llama-moe-tiny"
"""llama-tiny with 4 routed experts (top-2), one shared expert, block 0 dense (recipes/models/llama-moe-tiny.yaml)."""
STEPS = 3
GLOBAL_BATCH = 8

# (id, model, processes, per-layer strategies (embedding, dense block 0, MoE blocks 1–3, head), partition,
# micro-batches). +epN puts E/N experts on each rank; without it every rank holds every expert.
PLANS = [
    ("dp2+ep2", MODEL, 2, ["dp2+ep2"] * 6, [6], 2),
    ("mixed-tp-sdp-ep-ckpt", MODEL, 2, ["tp2", "sdp2", "dp2+ep2", "dp2+ep2+ckpt", "tp2", "dp2"], [6], 2),
    ("sharded-without-ep", MODEL, 2, ["dp2", "dp2", "sdp2", "z1dp2", "sdp2+ckpt", "z2dp2"], [6], 2),
    ("dp4+ep4", MODEL, 4, ["dp4+ep4"] * 6, [6], 2),
    ("dp4+ep2", MODEL, 4, ["dp4+ep2"] * 6, [6], 2),
    ("tp2-dp2+ep2", MODEL, 4, ["tp2-dp2+ep2"] * 6, [6], 2),
    ("dp2-tp2+ep2", MODEL, 4, ["dp2-tp2+ep2"] * 6, [6], 2),
    ("pp2-dp2+ep2", MODEL, 4, ["dp2+ep2", "tp2", "dp2+ep2", "dp2+ep2+ckpt", "dp2+ep2", "dp2"], [3, 3], 4),
    # +sp in MoE blocks: each TP rank routes its sequence slice; the experts' TP shards run on the TP group's copies
    ("tp2+sp", MODEL, 2, ["tp2", "tp2+sp", "tp2+sp", "tp2+sp+ckpt", "tp2+sp", "tp2"], [6], 2),
    ("tp2-dp2+ep2+sp", MODEL, 4, ["tp2-dp2", "tp2-dp2+sp", "tp2-dp2+ep2+sp", "dp2-tp2+ep2+sp", "tp2-dp2+ep2+sp+ckpt",
                                  "tp2-dp2"], [6], 2),
    # +etpN: the experts at a TP degree of their own (megatron-core's ETP · EP · EDP grid over the stage's ranks): at
    # ETP 1 whole experts on each rank's own copies, the EP group spanning TP ranks; at ETP 2 inside TP 4 the copies
    # gathered over the ETP pair only
    ("tp2+ep2+etp1+sp", MODEL, 2, ["tp2", "tp2+sp", "tp2+ep2+etp1+sp", "tp2+ep2+etp1+sp+ckpt", "tp2+sp", "tp2"], [6], 2),
    ("tp2-dp2+etp1", MODEL, 4, ["tp2-dp2", "tp2-dp2+ep2+etp1+sp", "tp2-dp2+ep2+etp1+sp", "tp2-dp2+ep4+etp1+sp",
                                "tp2-dp2+ep2+sp+ckpt", "tp2-dp2"], [6], 2),
    ("tp4+ep2+etp2", MODEL, 4, ["tp4", "tp4+sp", "tp4+ep2+etp2+sp", "tp4+ep4+etp1+sp+ckpt", "tp4+ep2+etp2+sp", "tp4"],
     [6], 2),
    # EP beside a sequence axis (cp, ulysses): every rank routes its own tokens, the EP group spans the sequence ranks
    # first, then the data-parallel ones (megatron-core's expert grid folds cp into EP and EDP): EP 4 over cp2 × dp2
    # (EDP 1), EP 2 over a TP pair's cp ranks, and Ulysses with the experts sharded over their EDP pair (ZeRO-3)
    ("cp2+ep2", MODEL, 2, ["cp2", "cp2", "cp2+ep2", "cp2+ep2+ckpt", "ulysses2+ep2", "cp2"], [6], 2),
    ("cp2-dp2+ep", MODEL, 4, ["cp2-dp2", "tp2-cp2", "cp2-dp2+ep4", "tp2-cp2+ep2+ckpt", "ulysses2-sdp2+ep2",
                              "cp2-z1dp2"], [6], 2),
]
# Tolerances: test_runtime_equivalence's (same fp32 reorderings: an expert sums its tokens' gradients in another
# order when they arrive from several ranks; its argument holds unchanged). What they still catch here: expert
# gradients summed over the whole data-parallel group instead of the expert-data-parallel one (experts' gradients
# mixed: moments off by far more than 1e-4 of scale — checked by breaking it), a token copy combined into another
# token's place or with another copy's weight (losses differ from the 3rd decimal), an all-to-all backward that
# does not return each gradient to its sender (expert and upstream gradients wrong), an expert held under another
# expert's name (its weights compared with another's), and a router whose gradient is lost (its weights would not
# move by Adam's ~lr per step).


@pytest.mark.torch
def test_a_capacity_factor_is_refused_in_one_line():
    from runtime_reference import architecture

    from gbmw.specs.architectures import MixtureOfExperts

    arch = architecture(MODEL)
    assert runtime_refusal(arch) is None
    dropping = arch.model_copy(update={"moe": MixtureOfExperts(num_experts=4, top_k=2, expert_ffn_hidden_size=96,
                                                               capacity_factor=1.25)})
    refusal = runtime_refusal(dropping)
    assert "capacity_factor: 1.25" in refusal and "dropless" in refusal and "\n" not in refusal


@pytest.mark.torch
@pytest.mark.parametrize("gated, shared_gate", [(True, True), (False, False)])
def test_the_moe_mlp_is_mixtrals_routing_with_its_exact_gradient(gated, shared_gate):
    """Against the formula token by token (float64): y = Σ_{e ∈ top-k} (p_e / Σ_top-k p) · E_e(x) + σ(g·x) · S(x),
    p = softmax(router · x); the output and every weight's gradient."""
    import torch
    import torch.nn.functional as F

    from gbmw.adapters.runtime.experts import ExpertParallel, MixtureOfExpertsMLP
    from gbmw.adapters.runtime.tensor_parallel import TensorParallel
    from gbmw.specs.architectures import MixtureOfExperts

    moe = MixtureOfExperts(num_experts=4, top_k=2, expert_ffn_hidden_size=12, shared_experts=2,
                           shared_expert_ffn_hidden_size=6, shared_expert_gate=shared_gate)
    layer = MixtureOfExpertsMLP(8, moe, True, gated, TensorParallel.single(), ExpertParallel.single(), torch.float64)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    x = torch.randn(3, 5, 8, generator=generator, dtype=torch.float64)

    def mlp(module, token):
        up = F.linear(token, module.fc1.weight, module.fc1.bias)
        hidden = F.silu(F.linear(token, module.gate.weight, module.gate.bias)) * up if gated else F.gelu(up)
        return F.linear(hidden, module.fc2.weight, module.fc2.bias)

    expected = []
    for token in x.reshape(-1, 8):
        probabilities = torch.softmax(layer.router.weight @ token, -1)
        top = probabilities.topk(2).indices
        out = sum(probabilities[e] / probabilities[top].sum() * mlp(layer.experts[str(int(e))], token) for e in top)
        shared = mlp(layer.shared, token)
        if shared_gate:
            shared = torch.sigmoid(layer.shared_gate.weight @ token) * shared
        expected.append(out + shared)
    expected = torch.stack(expected).view_as(x)
    output = layer(x)
    torch.testing.assert_close(output, expected, rtol=1e-12, atol=1e-12)
    names = [name for name, _ in layer.named_parameters()]
    cotangent = torch.randn(x.shape, generator=generator, dtype=torch.float64)
    grads = torch.autograd.grad((output * cotangent).sum(), list(layer.parameters()))
    expected_grads = torch.autograd.grad((expected * cotangent).sum(), list(layer.parameters()))
    for name, grad, expected_grad in zip(names, grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12, msg=lambda text: f"{name}: {text}")


@pytest.mark.dist
@pytest.mark.parametrize("plan_id", [plan[0] for plan in PLANS])
def test_matches_single_process(plan_id):
    from test_runtime_equivalence import assert_same_training, trained_from

    processes = next(plan[2] for plan in PLANS if plan[0] == plan_id)
    assert_same_training(*trained_from(PLANS, processes, plan_id), *_reference())


_references = []


def _reference():
    from runtime_reference import reference_training

    if not _references:
        _references.append(reference_training(MODEL, GLOBAL_BATCH, STEPS))
    return _references[0]


def _routing(rank, world_size, strategies):
    """Every MoE layer's expert choices for this rank's tokens in the first step's forward, in call order, with the
    rank's (batch slice, slice count, TP index) under the MoE blocks' strategy."""
    import gbmw.adapters.runtime.experts as experts
    from runtime_reference import architecture, make_plan

    from gbmw.adapters.runtime.engine import HybridEngine
    from gbmw.adapters.runtime.groups import GroupPool
    from gbmw.adapters.runtime.model import synthetic_batch

    chosen, route = [], experts.route

    def recording_route(logits, top_k):
        weights, experts_chosen = route(logits, top_k)
        chosen.append(experts_chosen.clone())
        return weights, experts_chosen

    experts.route = recording_route
    plan = make_plan(MODEL, world_size, strategies, [6], GLOBAL_BATCH, 2)
    engine = HybridEngine(plan, architecture(MODEL), GroupPool(plan), "cpu")
    engine.train_step(synthetic_batch(architecture(MODEL), GLOBAL_BATCH, 0, 0))
    strategy = plan.strategies[2]
    return {"shard": engine.layout.batch_shard(rank, strategy),
            "tp": engine.layout.digits(rank, strategy).get("tp", 0), "chosen": chosen}


@pytest.mark.dist
def test_the_routers_choices_are_the_same_in_every_expert_parallel_arrangement():
    """Routing depends on the token alone (its router scores), not on where its experts are or how loaded they are:
    the experts every token of the first step chooses, in every MoE block, are those of one process."""
    import torch
    from dist_fixture import run_distributed

    def global_choices(processes, strategy):
        per_rank = run_distributed(processes, _routing, [strategy] * 6, timeout_s=150)
        calls = len(per_rank[0]["chosen"])
        slices = sorted((result["shard"], result["tp"], result["chosen"]) for result in per_rank)
        for (shard, _, chosen), (other_shard, _, other) in zip(slices, slices[1:]):
            if shard == other_shard:  # TP peers route alike
                assert all(torch.equal(a, b) for a, b in zip(chosen, other))
        by_slice = {shard: chosen for shard, _, chosen in slices}
        return [torch.cat([by_slice[shard][call] for shard in sorted(by_slice)]) for call in range(calls)]

    expected = global_choices(1, "single")
    assert len(expected) == 2 * 3  # 2 micro-batches × 3 MoE blocks
    for processes, strategy in ((2, "dp2+ep2"), (4, "dp4+ep4"), (4, "dp4+ep2"), (4, "tp2-dp2+ep2")):
        choices = global_choices(processes, strategy)
        assert all(torch.equal(a, b) for a, b in zip(choices, expected)), strategy


@pytest.mark.dist
def test_a_checkpoint_saved_under_ep2_resumes_under_ep1_and_ep4(tmp_path):
    """Checkpoints hold every expert's full tensors by name whatever the EP degree: saved after 2 steps under dp2+ep2
    (2 experts per rank), resumed on one process, under dp4+ep4 (one per rank) and with the experts at TP degrees of
    their own (+etpN: shards of 1/2, whole), the third step's loss and the weights after it equal uninterrupted
    single-process training."""
    from dist_fixture import run_distributed
    from runtime_reference import collect, distributed_training
    from test_runtime_equivalence import assert_same_training

    checkpoint = tmp_path / "step2"
    run_distributed(2, distributed_training, MODEL, ["dp2+ep2"] * 6, [6], GLOBAL_BATCH, 2, 2, str(checkpoint),
                    timeout_s=150)
    expected_losses, expected_weights = _reference()
    etp = ["tp4", "tp4+sp", "tp4+ep2+etp2+sp", "tp4+ep4+etp1+sp", "tp2-dp2+ep2+etp1+sp", "tp4"]  # experts' own TP
    for processes, strategies in ((1, ["single"] * 6), (4, ["dp4+ep4"] * 6), (4, etp)):
        resumed = run_distributed(processes, distributed_training, MODEL, strategies, [6], GLOBAL_BATCH, 2, 1,
                                  None, str(checkpoint), timeout_s=150)
        assert_same_training(*collect(resumed), expected_losses[2:], expected_weights)


@pytest.mark.dist
def test_clipping_counts_each_expert_gradient_once():
    """The global gradient norm weights a routed expert's gradient by its expert-data-parallel copies (dp / ep, or
    W / (ETP · EP) under +etpN, times the ETP copies of an unsplit one), the others by their data-parallel copies:
    clipped training with different EP and ETP degrees per block (and TP on the embedding) equals clipped
    single-process training."""
    from dist_fixture import run_distributed
    from runtime_reference import collect, distributed_training, reference_training
    from test_runtime_equivalence import CLIP_NORM, assert_same_training

    strategies = ["tp4", "dp4+ep2", "tp2-dp2+ep2+etp1+sp", "dp4+ep4", "tp4+ep2+etp2+sp", "dp4"]
    trained = run_distributed(4, distributed_training, MODEL, strategies, [6], GLOBAL_BATCH, 2, STEPS, None, None, 0,
                              CLIP_NORM, timeout_s=150)
    assert_same_training(*collect(trained), *reference_training(MODEL, GLOBAL_BATCH, STEPS, max_grad_norm=CLIP_NORM))


def _moe_layer_under_sequence_parallelism(rank, world_size, gated, bias):
    """One MoE MLP (shared expert with its gate) on `world_size` TP ranks with +sp, each given its sequence slice:
    (output slice, input-gradient slice, every parameter's gradient by name) beside one process's whole layer."""
    import torch
    import torch.distributed as dist

    from gbmw.adapters.runtime.experts import ExpertParallel, MixtureOfExpertsMLP
    from gbmw.adapters.runtime.tensor_parallel import TensorParallel, partition_dims, shard_for_rank
    from gbmw.specs.architectures import MixtureOfExperts

    moe = MixtureOfExperts(num_experts=4, top_k=2, expert_ffn_hidden_size=8, shared_experts=1,
                           shared_expert_ffn_hidden_size=8, shared_expert_gate=True)
    whole = MixtureOfExpertsMLP(16, moe, bias, gated, TensorParallel.single(), ExpertParallel.single(), torch.float64)
    generator = torch.Generator().manual_seed(3)
    for parameter in whole.parameters():
        parameter.data = torch.randn(parameter.shape, generator=generator, dtype=torch.float64) * 0.3
    x = torch.randn(2, 8, 16, generator=generator, dtype=torch.float64)
    grad = torch.randn(2, 8, 16, generator=generator, dtype=torch.float64)
    tp = TensorParallel(dist.group.WORLD, world_size, rank, sequence_parallel=True)
    split = MixtureOfExpertsMLP(16, moe, bias, gated, tp, ExpertParallel.single(), torch.float64)
    full = dict(whole.named_parameters())
    dims = partition_dims(split)
    for name, parameter in split.named_parameters():
        parameter.data = shard_for_rank(full[name].data, dims[name], tp).clone()
    slices = [part.clone().requires_grad_() for part in x.chunk(world_size, 1)]
    mine = slices[rank]
    out = split(mine)
    out.backward(grad.chunk(world_size, 1)[rank])
    whole_x = x.clone().requires_grad_()
    whole(whole_x).backward(grad)
    return dict(
        output=(out.detach(), whole(x).detach().chunk(world_size, 1)[rank]),
        input_gradient=(mine.grad, whole_x.grad.chunk(world_size, 1)[rank]),
        **{name: (parameter.grad, shard_for_rank(full[name].grad, dims[name], tp))
           for name, parameter in split.named_parameters()})


@pytest.mark.dist
@pytest.mark.parametrize("gated, bias", [(True, False), (False, True)])
def test_an_moe_mlp_under_sequence_parallelism_is_the_whole_layer(gated, bias):
    """+sp in an MoE block on 2 gloo ranks against one process's layer (float64): output and input gradient of each
    rank's slice, the TP shards' gradients of the routed and shared experts, and the gradients of what is replicated
    over the group and used on a slice — router, shared gate, fc2 biases — summed over it. Tolerance 1e-10 of scale:
    float64 reorderings are ~1e-15; a bias added on every rank's partial sums, a replicated gradient not summed
    (half of it), or a copy returned to the wrong rank are O(1) off."""
    from dist_fixture import run_distributed

    for results in run_distributed(2, _moe_layer_under_sequence_parallelism, gated, bias):
        for name, (got, want) in results.items():
            assert got is not None, name
            assert (got - want).abs().max() <= 1e-10 * max(want.abs().max().item(), 1e-30), name
