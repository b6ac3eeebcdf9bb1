"""Expert parallelism beside a sequence axis (issue 26 with issue 27's cp and ulysses): the experts see the layer as
its weights do (Strategy.gradient_view), so EP splits them over the sequence ranks first, then the data-parallel
ones — megatron-core's expert grid, which folds cp into EP and EDP. Names, rank groups (by hand and against
megatron-core's RankGenerator), costs by hand, the space, the targets, uniform configs and Megatron arguments."""

import pytest
from conftest import make_cluster, make_layer
from test_expert_parallel import EXPERT_FIELDS, costs, tiny_moe_job

import gbmw
from gbmw.cost.expert_parallel import expert_alltoall_group, expert_data_parallel_group, expert_view
from gbmw.errors import PlanError
from gbmw.handwritten.uniform_config import UniformConfig
from gbmw.ranks import RankLayout
from gbmw.space.runtime_support import runtime_strategy_refusal
from gbmw.space.strategy import Strategy, enumerate_strategies
from gbmw.space.targets import get_target


def test_names_degrees_and_refusals():
    for name in ("cp2-dp2+ep4", "tp2-cp2-z1dp2+ep2+sp", "ulysses4+ep2", "tp2-ulysses2-sdp2+ep4+ckpt"):
        assert Strategy.parse(name).name == name
    assert Strategy.parse("tp2-cp2-dp4+ep4+sp").expert_data_parallel == 2  # cp · dp / ep = 2 · 4 / 4
    assert Strategy.parse("ulysses4+ep2").expert_data_parallel == 2
    assert Strategy.parse("cp2-dp2+ep4").gradient_view == Strategy.parse("dp4+ep4")
    with pytest.raises(PlanError) as refused:
        Strategy.parse("cp2-dp2+ep8")
    assert str(refused.value) == (
        "strategy cp2-dp2+ep8: expert parallelism (+ep8) splits the experts over the ranks holding other tokens — the "
        "cp ranks, then at most one data-parallel axis; 8 must divide their product (cp2 × dp2), e.g. tp2-cp2-dp4+ep8")
    # the experts at a TP of their own beside cp: megatron-core's ETP · EP · EDP over the TP · CP · DP ranks
    assert Strategy.parse("tp2-cp2-dp2+ep4+etp1+sp").expert_data_parallel == 2  # 8 / (1 · 4)
    assert Strategy.parse("tp2-cp2-dp2+ep4+etp1+sp").name == "tp2-cp2-dp2+ep4+etp1+sp"
    with pytest.raises(PlanError, match="TP innermost"):
        Strategy.parse("cp2-dp2-tp2+ep2+etp1+sp")


def test_groups_by_hand():
    """8 ranks, tp2-cp2-dp2: local rank r = t + 2·(c + 2·d). EP 2 pairs the two cp ranks of one replica (2 apart),
    EP 4 takes every cp and dp rank of one TP index; the experts' gradients are summed over the rest."""
    layout = RankLayout(8, 1)
    ep2, ep4 = Strategy.parse("tp2-cp2-dp2+ep2+sp"), Strategy.parse("tp2-cp2-dp2+ep4+sp")
    assert layout.expert_group(1, ep2) == (1, 3) and layout.expert_data_group(1, ep2) == (1, 5)
    assert layout.expert_group(4, ep2) == (4, 6) and layout.expert_data_group(4, ep2) == (0, 4)
    assert layout.expert_group(3, ep4) == (1, 3, 5, 7) and layout.expert_data_group(3, ep4) == (3,)
    ulysses = Strategy.parse("ulysses2-dp2+ep2")  # r = u + 2·d
    four = RankLayout(4, 1)
    assert four.expert_group(2, ulysses) == (2, 3) and four.expert_data_group(2, ulysses) == (0, 2)
    # the cost prices the same groups
    assert expert_alltoall_group(ep2) == (2, 2) and expert_data_parallel_group(ep2) == ("dp", 2, 4)
    assert expert_alltoall_group(ep4) == (4, 2) and expert_view(ep4.gradient_view) == Strategy.parse("tp2+sp")


@pytest.mark.torch
def test_groups_against_megatron_cores_rank_generator():
    """megatron-core lays the experts out with cp = 1 and ETP = TP over the same ranks (parallel_state's
    expert_decoder_rank_generator); its dense grid keeps cp between TP and DP (order tp-cp-ep-dp-pp)."""
    parallel_state = pytest.importorskip("megatron.core.parallel_state")
    layout = RankLayout(32, 2)
    for tp, cp, dp, ep, etp in ((2, 2, 4, 4, None), (2, 4, 2, 2, None), (1, 2, 8, 16, None), (4, 2, 2, 4, None),
                                (1, 4, 4, 8, None), (2, 2, 4, 8, 1), (4, 2, 2, 2, 2), (2, 4, 2, 16, 1)):
        name = "-".join(f"{axis}{degree}" for axis, degree in (("tp", tp), ("cp", cp), ("dp", dp)) if degree > 1)
        strategy = Strategy.parse(f"{name}+ep{ep}" + (f"+etp{etp}" if etp else "") + ("+sp" if tp > 1 else ""))
        expert_tp = etp or tp
        dense = parallel_state.RankGenerator(tp=tp, ep=1, dp=dp, pp=2, cp=cp, order="tp-cp-ep-dp-pp")
        experts = parallel_state.RankGenerator(tp=expert_tp, ep=ep, dp=16 // (expert_tp * ep), pp=2, cp=1,
                                               order="tp-cp-ep-dp-pp")
        assert sorted({layout.group(rank, strategy, ("cp",)) for rank in range(32)}) == sorted(
            tuple(ranks) for ranks in dense.get_ranks("cp")), strategy.name
        for group_name, group in (("ep", layout.expert_group), ("dp", layout.expert_data_group)):
            assert sorted({group(rank, strategy) for rank in range(32)}) == sorted(
                tuple(ranks) for ranks in experts.get_ranks(group_name)), (strategy.name, group_name)
        assert sorted({layout.expert_tensor_group(rank, strategy) for rank in range(32)}) == sorted(
            tuple(ranks) for ranks in experts.get_ranks("tp")), strategy.name


def test_costs_by_hand():
    """cp2-dp4+ep4, micro-batch 8: a rank holds half the sequence of 2 samples (8 / (4 · 2) = 1 sample's worth of
    tokens), routes 1 · 40 B and exchanges it with the 3 others of its EP group (4 consecutive ranks: both cp ranks
    of two replicas); the experts' 600 parameters split 4 ways, their optimizer states sharded over EDP = 2 · 4 / 4.
    Catches the sequence degree left out of the tokens routed, or EDP taken from dp alone (4 / 4 = 1)."""
    cluster = make_cluster(latency_us=5.0)
    layer = make_layer(**EXPERT_FIELDS)
    with_ep, without = costs("cp2-dp4+ep4", layer, cluster=cluster), costs("cp2-dp4", layer, cluster=cluster)
    message = 8 / 8 * 40.0
    one = 3 / 4 * message / 100e9 + 3 * 5e-6
    assert with_ep.time_no_grad_sync_s[0] - without.time_no_grad_sync_s[0] == pytest.approx(4 * one, rel=1e-9)
    # fp32 Adam, 16 bytes a parameter: the 400 dense ones whole, the experts' 600 over EP 4
    assert with_ep.model_state_bytes[0] == pytest.approx((400 + 600 / 4) * 16)
    z1 = costs("cp2-z1dp4+ep4", layer)  # ZeRO-1 over cp · dp = 8 for the dense part, over EDP 2 for the experts
    assert z1.optimizer_parameters[0] == pytest.approx(400 / 8 + 150 / 2)


def test_the_space_offers_ep_up_to_the_ranks_holding_other_tokens():
    strategies = enumerate_strategies(8, axes=("tp", "cp", "dp"), expert_parallel=True)
    offered = {s.name for s in strategies}
    assert {"cp2-dp4+ep8", "cp8+ep8", "tp2-cp2-dp2+ep4", "tp4-cp2+ep2", "cp4-dp2+ep2"} <= offered
    assert not any(s.ep > s.gradient_view.data_parallel for s in strategies)
    assert all(s.ep == 1 for s in strategies if s.name.startswith("tp8"))


def test_targets_run_what_their_frameworks_run():
    runtime, core, deepspeed = (get_target(name) for name in ("runtime", "megatron-core", "megatron-deepspeed"))
    for name in ("cp2-dp2+ep4", "tp2-cp2-z1dp2+ep2", "ulysses2-sdp2+ep2", "ulysses4+ep4"):
        strategy = Strategy.parse(name)
        assert runtime.allows(strategy, 1) and runtime_strategy_refusal(strategy) is None, name
    assert core.allows(Strategy.parse("tp2-cp2-z1dp2+ep4+sp"), 1)
    assert core.allows(Strategy.parse("tp2-cp2-z1dp2+ep8+etp1+sp"), 1)  # the experts whole beside cp
    assert runtime_strategy_refusal(Strategy.parse("tp2-cp2-z1dp2+ep8+etp1+sp")) == (
        "strategy tp2-cp2-z1dp2+ep8+etp1+sp: gbmw's runtime runs context parallelism (cp) without +sp, which +etp1 "
        "needs; leave +etp1 out (the experts at the layer's TP) or plan for megatron-core (--target megatron-core)")
    assert not core.allows(Strategy.parse("tp2-cp2-z1dp2+ep4"), 1)  # EP with TP needs +sp in megatron-core
    assert not deepspeed.allows(Strategy.parse("ulysses2-z1dp2+ep2"), 1)  # not modelled there
    job = tiny_moe_job(8)
    allowed = runtime.layers_allowed(job.model, [Strategy.parse("cp2-dp4+ep8")])[0]
    assert list(allowed) == [bool(layer.num_experts) for layer in job.model.layers]


def test_uniform_configs_and_megatron_arguments():
    from gbmw.adapters.megatron import megatron_args_to_plan, plan_to_megatron_args

    job = gbmw.load_job("mixtral-8x7b-32k_h100-80g-x64")  # flash attention, as megatron-core's cp needs
    plan = gbmw.uniform_plan(job, "tp=2,pp=4,zero=1,cp=2,ep=8,sp=on,micro=1,target=megatron-core")
    assert {s.name for s, layer in zip(plan.strategies, job.model.layers) if layer.num_experts} == {
        "tp2-cp2-z1dp4+ep8+sp"}
    args = " ".join(plan_to_megatron_args(plan, job, "megatron-core")) + " "
    assert " --context-parallel-size 2 " in args and " --expert-model-parallel-size 8 " in args
    assert megatron_args_to_plan(args.split(), job, "megatron-core").strategies == plan.strategies
    # the experts whole beside cp: EP 8 over the stage's 16 ranks at ETP 1 (EDP 2), read back from the flags
    whole = gbmw.uniform_plan(job, "tp=2,pp=4,zero=1,cp=2,ep=8,etp=1,sp=on,micro=1,target=megatron-core")
    assert {s.name for s, layer in zip(whole.strategies, job.model.layers) if layer.num_experts} == {
        "tp2-cp2-z1dp4+ep8+etp1+sp"}
    args = plan_to_megatron_args(whole, job, "megatron-core")
    assert args[args.index("--expert-tensor-parallel-size") + 1] == "1"
    assert megatron_args_to_plan(args, job, "megatron-core").strategies == whole.strategies
    with pytest.raises(PlanError) as refused:
        UniformConfig.parse("tp=2,pp=4,cp=2,ep=16,sp=on,micro=1").to_plan(job)
    assert str(refused.value) == ("--uniform ep=16: expert parallelism splits the experts over the cp and "
                                  "data-parallel ranks, so it must divide cp * dp = 2 * 4; EP degrees that do: "
                                  "[2, 4, 8]")
