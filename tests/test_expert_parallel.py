"""Expert parallelism (issue 26): the `+epN` strategies, their costs against hand-computed values, the search offering
them to mixture-of-experts layers only, and the Megatron arguments that carry them."""

import numpy as np
import pytest
from conftest import make_cluster, make_job, make_layer, make_model

from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.layer_cost_batch import layer_costs
from gbmw.errors import PlanError
from gbmw.handwritten.uniform_config import UniformConfig
from gbmw.plan import plan_from_strategy_names
from gbmw.search.planner import plan_job
from gbmw.space.strategy import Strategy, enumerate_strategies
from gbmw.space.targets import get_target
from gbmw.specs.architectures import parse_architecture
from gbmw.specs.jobs import JobSpec
from gbmw.specs.models import build_model

# An MoE layer: 1000 parameters of which 600 are routed experts (800 split by TP, as the dense layer of conftest);
# 4 experts, top-2; per sample 1e6 FLOPs of which 4e5 are the experts', 40 bytes of routed tokens to dispatch,
# 30 of its 50 whole intermediate bytes and 120 of its 200 split ones grow with the routed tokens.
EXPERT_FIELDS = dict(num_experts=4, experts_per_token=2, expert_parameter_count=600,
                     expert_forward_flops_per_sample=4e5, expert_dispatch_bytes_per_sample=40.0,
                     expert_activation_bytes_per_sample=30.0, expert_tp_split_activation_bytes_per_sample=120.0)


def costs(name, layer, micro_batch=8, cluster=None):
    cluster = cluster or make_cluster()
    model = make_model([layer])
    return layer_costs(model, Strategy.parse(name), micro_batch, CostSettings(cluster, "fp32"), CommModel(cluster))


def test_names_round_trip_and_bad_degrees_are_refused():
    for name in ("tp2-dp8+ep4", "z1dp8+ep8+ckpt", "tp2-z1dp4+ep2+sp+sel"):
        assert Strategy.parse(name).name == name
    assert Strategy.parse("tp2-dp8+ep4").expert_data_parallel == 2
    for bad, words in (("dp4+ep3", "degree 3 divides"), ("tp4+ep2", "none"), ("dp2-sdp2+ep2", "dp2 × sdp2"),
                       ("dp4+ep2+ep2", "given 2 times")):
        with pytest.raises(PlanError, match=words):
            Strategy.parse(bad)


def test_the_space_adds_every_power_of_two_dividing_the_data_parallel_degree():
    plain = enumerate_strategies(8, axes=("dp", "tp"))
    with_experts = enumerate_strategies(8, axes=("dp", "tp"), expert_parallel=True)
    assert with_experts[:len(plain)] == plain  # of equally fast plans the one without EP is found first
    added = with_experts[len(plain):]
    expected = {(s.name, e) for s in plain for e in (2, 4, 8) if e <= s.data_parallel}
    assert {(s.with_expert_parallel(1).name, s.ep) for s in added} == expected


def test_a_dense_layer_costs_the_same_with_and_without_ep():
    dense = make_layer()
    for a, b in (("tp2-dp4", "tp2-dp4+ep4"), ("z1dp8", "z1dp8+ep2")):
        x, y = costs(a, dense), costs(b, dense)
        for field in ("time_s", "time_no_grad_sync_s", "forward_memory_bytes", "backward_memory_bytes",
                      "model_state_bytes", "optimizer_parameters"):
            assert np.array_equal(getattr(x, field), getattr(y, field)), field


def test_expert_states_by_hand():
    layer = make_layer(**EXPERT_FIELDS)
    # fp32 Adam, 16 bytes per parameter; TP 2 splits 800, EP 4 splits the 600 experts' TP-local 300 four ways
    assert costs("tp2-dp4+ep4", layer).model_state_bytes[0] == pytest.approx((400 - 300 + 200 + 300 / 4) * 16)
    assert costs("tp2-dp4", layer).model_state_bytes[0] == pytest.approx((400 + 200) * 16)
    # ZeRO-1 over 8: the dense part's optimizer sharded 8 ways, the experts' over the expert-DP group of 8/2 = 4
    # (the runtime keeps whole weights and gradients and a 1/n shard of the weights beside them: 4 + 4 + 12/n)
    z1 = costs("z1dp8+ep2", layer)
    assert z1.model_state_bytes[0] == pytest.approx(400 * (8 + 12 / 8) + 600 / 2 * (8 + 12 / 4))
    assert z1.optimizer_parameters[0] == pytest.approx(400 / 8 + 300 / 4)
    # EP over all 8 ranks leaves no expert-data-parallel group: nothing to shard or synchronise
    assert costs("z1dp8+ep8", layer).model_state_bytes[0] == pytest.approx(400 * (8 + 12 / 8) + 600 / 8 * 16)


def test_dispatch_and_combine_by_hand():
    """Forward and backward each add a dispatch and a combine all-to-all of the rank's routed tokens over the EP
    group: (e − 1)/e · M / B + (e − 1) · α with M = samples · 40 B, / TP under +sp, where each TP rank routes its
    sequence slice; without +sp every TP rank routes the replica's tokens (gbmw's runtime, DeepSpeed-MoE). Catches a
    missing direction, the wrong group size or link, and TP dividing the dispatch where it does not, or not where
    it does."""
    cluster = make_cluster(latency_us=5.0)
    layer = make_layer(**EXPERT_FIELDS)
    for name, ep, divisor in (("dp8+ep4", 4, 1), ("tp2-dp4+ep2", 2, 1), ("tp2-dp4+ep2+sp", 2, 2)):
        samples = 8 / Strategy.parse(name).data_parallel
        message = samples * 40.0 / divisor
        one = (ep - 1) / ep * message / 100e9 + (ep - 1) * 5e-6
        without = costs(name.replace("+ep2", "").replace("+ep4", ""), layer, cluster=cluster)
        with_ep = costs(name, layer, cluster=cluster)
        # plain DP synchronises on the last micro-batch only: the others differ by the four all-to-alls alone
        assert with_ep.time_no_grad_sync_s[0] - without.time_no_grad_sync_s[0] == pytest.approx(4 * one, rel=1e-9)
    ckpt, plain = costs("dp8+ep4+ckpt", layer, cluster=cluster), costs("dp8+ckpt", layer, cluster=cluster)
    message = 1 * 40.0
    one = 3 / 4 * message / 100e9 + 3 * 5e-6
    assert ckpt.time_no_grad_sync_s[0] - plain.time_no_grad_sync_s[0] == pytest.approx(6 * one, rel=1e-9)


def test_the_busiest_rank_carries_the_stated_load():
    """Under EP the busiest rank computes and stashes load × the mean routed tokens; at EP 1 load does not matter
    (catches the factor applied without EP, to dense FLOPs, or missing from backward)."""
    layer = make_layer(**EXPERT_FIELDS, expert_load_factor=1.5)
    balanced = make_layer(**EXPERT_FIELDS)
    assert np.array_equal(costs("dp8", layer).time_s, costs("dp8", balanced).time_s)
    heavy, even = costs("tp2-dp4+ep2", layer), costs("tp2-dp4+ep2", balanced)
    samples, rate = 2, 1e12  # the test device sustains 1 TFLOP/s in fp32
    extra_compute = 0.5 * 4e5 * samples / 2 / rate
    assert heavy.time_no_grad_sync_s[0] - even.time_no_grad_sync_s[0] > 3 * extra_compute * (1 - 1e-9)
    assert heavy.forward_memory_bytes[0] - even.forward_memory_bytes[0] == pytest.approx(0.5 * (30 + 120 / 2) * 2)


def tiny_moe_job(devices: int = 4) -> JobSpec:
    arch = parse_architecture(dict(
        family="gpt", name="tiny-moe", num_layers=4, hidden_size=256, num_heads=8, seq_length=128, vocab_size=1024,
        gated_mlp=True, bias=False, norm="rms", position_embedding="rotary", tie_embeddings=False, dropout=False,
        moe=dict(num_experts=8, top_k=2, expert_ffn_hidden_size=512, dense_blocks=[0])), "test")
    model = build_model(arch, "fp32")
    return make_job(model, make_cluster(devices_per_node=devices), budget=64 * 2**30)


def test_the_per_layer_search_gives_ep_to_expert_blocks_only():
    job = tiny_moe_job()
    strategies = enumerate_strategies(4, axes=("dp", "tp"), expert_parallel=True)
    allowed = get_target("runtime").layers_allowed(job.model, strategies)
    for index, layer in enumerate(job.model.layers):
        offered = {strategies[s].ep for s in np.flatnonzero(allowed[:, index])}
        assert offered == ({1, 2, 4} if layer.num_experts else {1}), layer.name
    plan = plan_job(job, batch=8, exact=True)
    for strategy, layer in zip(plan.strategies, job.model.layers):
        assert strategy.ep == 1 or layer.num_experts


def test_ep_that_does_not_divide_the_experts_or_the_data_parallel_degree_is_refused():
    job = tiny_moe_job()
    with pytest.raises(PlanError, match=r"--uniform ep=8: .* must divide dp = 4; EP degrees that do: \[2, 4\]"):
        UniformConfig.parse("ep=8,batch=8").to_plan(job)
    six = job.model.layers[2].model_copy(update={"num_experts": 6})
    model = job.model.model_copy(update={"layers": job.model.layers[:2] + (six,) + job.model.layers[3:]})
    names = ["dp4+ep4" if layer.num_experts else "dp4" for layer in model.layers]
    with pytest.raises(PlanError, match=r"6 experts, not divisible by ep=4 .* EP degrees that divide it: \[2\]"):
        plan_from_strategy_names(model, 4, names, [model.num_layers], 8, 2)


def test_megatron_core_needs_sequence_parallelism_with_ep_and_tp():
    target = get_target("megatron-core")
    assert not target.allows(Strategy.parse("tp2-dp4+ep2"), 1)
    assert target.allows(Strategy.parse("tp2-dp4+ep2+sp"), 1)
    assert not get_target("deepspeed").allows(Strategy.parse("dp8+ep2"), 1)


def test_the_router_runs_whole_on_every_tensor_parallel_rank():
    """megatron-core's router (hidden → experts) is not split by TP: every TP rank routes its tokens whole, so its
    FLOPs are TP-replicated ones (issue 26: they were divided by TP). llama-moe-tiny: 32 tokens, hidden 64, 4
    experts, no shared-expert gate: 2 · 32 · 64 · 4 FLOPs per sample. Catches: the router's FLOPs split by TP."""
    from gbmw.specs.bundled import RECIPES_DIR
    from gbmw.specs.models import load_architecture
    model = build_model(load_architecture(RECIPES_DIR / "models" / "llama-moe-tiny.yaml"), "fp32")
    moe_blocks = [layer for layer in model.layers if layer.num_experts]
    assert moe_blocks and all(layer.tp_replicated_forward_flops_per_sample == 2 * 32 * 64 * 4 for layer in moe_blocks)
    dense_blocks = [layer for layer in model.layers if layer.kind == "decoder" and not layer.num_experts]
    assert dense_blocks and all(layer.tp_replicated_forward_flops_per_sample == 0 for layer in dense_blocks)


def test_zero3_experts_compute_their_backward_beside_the_dense_parts_buffer():
    """Under EP the routed experts are their own FSDP2 unit, after the layer's dense part: what FSDP2 prefetches beside
    their backward is the dense part's buffer (400 × 4 B), not the whole layer's (700 × 4 B). sdp8+ep2: 7/8 of the
    400 dense and 3/4 of the rank's 300 expert parameters gathered (575 × 4 B), their gradients as much, W = 200 B.
    Catches the whole layer's buffer charged (7600 B) or none (4800 B)."""
    layer = make_layer(**EXPERT_FIELDS)
    gathered = (400 * 7 / 8 + 300 * 3 / 4) * 4
    assert costs("sdp8+ep2", layer).backward_memory_bytes[0] == pytest.approx(gathered + gathered + 200 + 400 * 4)
    # EP over all 8 ranks: the experts are not sharded, one unit's buffer as for a dense layer (400 × 4 B)
    assert costs("sdp8+ep8", layer).backward_memory_bytes[0] == pytest.approx(350 * 4 * 2 + 200 + 400 * 4)
