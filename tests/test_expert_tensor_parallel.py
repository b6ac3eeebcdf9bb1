"""Expert tensor parallelism other than the layer's (`+etpN`, megatron-core's --expert-tensor-parallel-size; issue 26):
the strategy grammar and its refusals, the costs against hand arithmetic on a tiny MoE layer, the rank groups against
megatron-core's RankGenerator order, the targets that run it, the search offering it, and the arguments that carry it."""

import numpy as np
import pytest
from conftest import make_cluster, make_layer, make_model
from test_expert_parallel import EXPERT_FIELDS, tiny_moe_job

import gbmw
from gbmw.adapters.megatron import megatron_args_to_plan, plan_to_megatron_args
from gbmw.cost.comm import CommModel
from gbmw.cost.expert_parallel import expert_alltoall_group, expert_data_parallel_group, expert_view
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.layer_cost_batch import layer_costs
from gbmw.errors import GbmwError, PlanError
from gbmw.handwritten.uniform_config import UniformConfig
from gbmw.ranks import RankLayout
from gbmw.space.runtime_support import runtime_strategy_refusal
from gbmw.space.spaces import SearchSpace, search_space
from gbmw.space.strategy import Strategy, enumerate_strategies
from gbmw.space.targets import get_target

TWO_NODES = dict(nodes=2, devices_per_node=4, intra_gb_per_s=100.0, inter_gb_per_s=10.0, latency_us=5.0)


def costs(name, layer=None, micro_batch=8, cluster=None):
    cluster = cluster or make_cluster(**TWO_NODES)
    model = make_model([layer or make_layer(**EXPERT_FIELDS)])
    return layer_costs(model, Strategy.parse(name), micro_batch, CostSettings(cluster, "fp32"), CommModel(cluster))


# ------------------------------------------------------------------------------------------------------ the grammar


def test_names_round_trip_and_etp_equal_to_tp_is_the_plain_strategy():
    for name in ("tp2-dp16+ep32+etp1+sp", "tp4-z1dp2+ep4+etp2+sp+ckpt", "tp8+ep8+etp1+sp+sel"):
        assert Strategy.parse(name).name == name
    same = Strategy.parse("tp2-dp4+ep2+etp2+sp")
    assert same == Strategy.parse("tp2-dp4+ep2+sp") and same.name == "tp2-dp4+ep2+sp" and same.expert_tp is None
    strategy = Strategy.parse("tp2-dp16+ep32+etp1+sp")
    assert (strategy.expert_tensor_parallel, strategy.expert_data_parallel) == (1, 1)
    assert Strategy.parse("tp4-z1dp4+ep2+etp2+sp").expert_data_parallel == 4  # 16 / (2 · 2)
    assert strategy.with_recompute("full").name == "tp2-dp16+ep32+etp1+sp+ckpt"


@pytest.mark.parametrize("name, message", [
    ("tp4-dp2+ep2+etp3+sp", "strategy tp4-dp2+ep2+etp3+sp: the experts' TP degree 3 must divide the layer's TP degree 4 "
                            "(megatron-core splits the TP ranks' experts inside them), e.g. +etp2"),
    ("dp4+ep2+etp2", "strategy dp4+ep2+etp2: +etp2 without a tp axis; the experts' TP degree divides the layer's — "
                     "leave +etpN out"),
    ("tp2-dp4+etp1+sp", "strategy tp2-dp4+etp1+sp: +etp1 sets the TP degree of experts split over ranks; give expert "
                        "parallelism with it (+epN, N ≥ 2), e.g. tp2-dp4+ep8+etp1+sp"),
    ("dp4-tp2+ep2+etp1+sp", "strategy dp4-tp2+ep2+etp1+sp: +etp1 lays the experts out as megatron-core does (ETP, "
                            "then EP, then expert-data-parallel ranks over the layer's TP, sequence and data-parallel "
                            "ranks); it needs TP innermost and at most one data-parallel axis outside it, e.g. "
                            "tp2-dp8+ep8+etp1+sp"),
    ("cp2-dp2-tp2+ep2+etp1+sp", "it needs TP innermost and at most one data-parallel axis outside it"),
    ("tp2-dp4+ep16+etp1+sp", "strategy tp2-dp4+ep16+etp1+sp: etp(1) * ep(16) = 16 must divide the 8 ranks of the stage "
                             "(they are the experts' ETP · EP · EDP)"),
    ("tp2-dp4+ep2+etp1", "strategy tp2-dp4+ep2+etp1: +etp1 needs sequence parallelism (+sp): the EP group exchanges "
                         "each TP rank's own tokens (megatron-core requires --sequence-parallel with EP and TP)"),
    ("tp2-dp4+ep2+etp1+etp1+sp", "the experts' TP degree is given 2 times; give one +etpN"),
])
def test_bad_strategies_are_refused_in_one_line(name, message):
    with pytest.raises(PlanError) as refused:
        Strategy.parse(name)
    assert message in str(refused.value) and "\n" not in str(refused.value)


# --------------------------------------------------------------------------------------------------------- the costs


def test_expert_states_by_hand():
    """A rank holds E/EP experts, 1/ETP of each; the experts' ZeRO shards over EDP = W / (ETP · EP). The layer: 1000
    parameters, 800 TP-split of which 600 are the routed experts; fp32 Adam (16 B per parameter; gbmw's runtime keeps
    whole weights and gradients and a 1/n shard of the weights beside them under ZeRO-1: 8 + 12/n).
    Catches: the experts divided by TP instead of ETP, the expert-data-parallel group of the layer's DP."""
    dense = 800 / 2 + 200 - 600 / 2  # the TP-local parameters that are not routed experts
    assert costs("tp2-dp4+ep4+etp1+sp").model_state_bytes[0] == pytest.approx((dense + 600 / 1 / 4) * 16)
    assert costs("tp2-dp4+ep4+sp").model_state_bytes[0] == pytest.approx((dense + 600 / 2 / 4) * 16)
    # ZeRO-1: dense over the 4 data-parallel ranks, experts (600 / 2 of them here) over EDP = 8 / (1 · 2) = 4
    z1 = costs("tp2-z1dp4+ep2+etp1+sp")
    assert z1.model_state_bytes[0] == pytest.approx(dense * (8 + 12 / 4) + 600 / 2 * (8 + 12 / 4))
    assert z1.optimizer_parameters[0] == pytest.approx(dense / 4 + 300 / 4)
    # EP 8 over all 8 ranks: no expert-data-parallel group, nothing to shard
    z1_all = costs("tp2-z1dp4+ep8+etp1+sp")
    assert z1_all.model_state_bytes[0] == pytest.approx(dense * (8 + 12 / 4) + 600 / 8 * 16)


def test_groups_by_hand():
    etp1 = Strategy.parse("tp2-z1dp4+ep2+etp1+sp")
    assert expert_alltoall_group(etp1) == (2, 1)  # EP 2 on consecutive ranks (one TP pair)
    assert expert_data_parallel_group(etp1) == ("z1dp", 4, 2)  # EDP 8 / 2 = 4, ETP · EP = 2 apart
    assert expert_view(etp1) == Strategy.parse("z1dp4")
    wide = Strategy.parse("tp4-dp4+ep4+etp2+sp")
    assert expert_alltoall_group(wide) == (4, 2) and expert_data_parallel_group(wide) == ("dp", 2, 8)
    assert expert_view(wide) == Strategy.parse("tp2-dp2+sp")
    layer_tp = Strategy.parse("tp2-dp4+ep4+sp")
    assert expert_alltoall_group(layer_tp) == (4, 2)  # EP over the data-parallel ranks, TP apart


def test_dispatch_and_expert_tp_collectives_by_hand():
    """Against the same strategy without EP (2 nodes × 4 devices, 100 GB/s inside a node, 10 GB/s across, 5 µs):
    forward and backward each add a dispatch and a combine all-to-all of the rank's M = samples · 40 B / TP routed
    bytes, (e − 1)/e · M / B + (e − 1) · α; under +etp1 the experts' 40 of the layer's 100 TP bytes per sample leave
    the TP all-reduce, 2(t − 1)/t · Δ / B less, forward and backward. ETP 1's EP 4 spans ranks 0-3 (one node); the
    layer-TP EP 4 spans ranks 0, 2, 4, 6 (two nodes: 2 of a node's 4 devices, so 10 · 2/4 GB/s).
    Catches: the ETP group's collective left in TP's, the all-to-all over the wrong group or link, bytes not 1/TP."""
    samples, tp, alpha = 8 / 4, 2, 5e-6
    message = samples * 40.0 / tp
    without = costs("tp2-dp4+sp").time_no_grad_sync_s[0]
    inside = 3 / 4 * message / 100e9 + 3 * alpha
    fewer_tp_bytes = 2 * (2 * (tp - 1) / tp * 40.0 * samples / 100e9)
    assert costs("tp2-dp4+ep4+etp1+sp").time_no_grad_sync_s[0] - without == pytest.approx(
        4 * inside - fewer_tp_bytes, rel=1e-9)
    across = 3 / 4 * message / 5e9 + 3 * alpha
    assert costs("tp2-dp4+ep4+sp").time_no_grad_sync_s[0] - without == pytest.approx(4 * across, rel=1e-9)


def test_an_intermediate_expert_tp_moves_its_share_to_the_etp_group():
    """TP 4, ETP 2: the experts' all-gather / reduce-scatter moves ETP/TP = 1/2 of their 40 B per sample over the 2
    consecutive ranks of the ETP group (2(a − 1)/a · M / B + 2(a − 1) · α), and TP's all-reduce carries 60 B."""
    layer = make_layer(**EXPERT_FIELDS)
    cluster = make_cluster(**TWO_NODES)
    samples = 8 / 2

    def allreduce(message, size):
        return 2 * (size - 1) / size * message / 100e9 + 2 * (size - 1) * 5e-6

    etp2, plain = costs("tp4-dp2+ep2+etp2+sp", layer, cluster=cluster), costs("tp4-dp2+ep2+sp", layer, cluster=cluster)
    expected = 2 * ((allreduce(60 * samples, 4) + allreduce(40 * samples * 2 / 4, 2)) - allreduce(100 * samples, 4))
    # the all-to-alls of M = samples · 40 B / 4 differ too: EP 2 two ranks apart under ETP 2 (inside a node) against
    # four apart under the layer's TP 4 (across nodes, one of a node's 4 devices: 10 · 1/4 GB/s)
    message = samples * 40 / 4
    alltoall = 4 * ((1 / 2 * message / 100e9 + 5e-6) - (1 / 2 * message / 2.5e9 + 5e-6))
    assert etp2.time_no_grad_sync_s[0] - plain.time_no_grad_sync_s[0] == pytest.approx(expected + alltoall, rel=1e-9)


def test_megatron_cores_gathered_expert_input_is_etp_over_tp_of_the_copies():
    """Under +sp megatron-core all-gathers the routed copies over the ETP group before the experts run, and their
    first linear keeps what it was given: ETP/TP of the TP group's copies (the layer's 16 B of expert input per
    sample), where the sequence slice's share is 1/TP. TP 4 on 8 samples / DP 2 = 4 per rank: ETP 4 (megatron-core's
    default) keeps 16 · 4 · (4 − 1)/4 = 48 B more than ETP 1, ETP 2 16 · 4 · 1/4 = 16 B; a checkpointed layer keeps its
    boundary alone, and gbmw's runtime (gbmw.adapters.runtime.expert_sequence_parallel: the experts at the layer's
    TP, their input gathered over the TP group) keeps the 48 B of megatron-core's default. (ETP without +sp is
    refused.) Catches: the gathered input left at the slice's share, the share left out for the runtime, applied to
    DeepSpeed or to a checkpointed layer's forward stash."""
    layer = make_layer(**EXPERT_FIELDS, expert_input_activation_bytes_per_sample=16.0)
    without_field = make_layer(**EXPERT_FIELDS, expert_input_activation_bytes_per_sample=0.0)
    cluster = make_cluster(**TWO_NODES)

    def forward_memory(name, framework="megatron", of=layer):
        settings = CostSettings(cluster, "fp32", framework=framework)
        return layer_costs(make_model([of]), Strategy.parse(name), 8, settings, CommModel(cluster)
                           ).forward_memory_bytes[0]

    assert forward_memory("tp4-dp2+ep2+sp") - forward_memory("tp4-dp2+ep2+etp1+sp") == pytest.approx(48.0, rel=1e-12)
    assert forward_memory("tp4-dp2+ep2+etp2+sp") - forward_memory("tp4-dp2+ep2+etp1+sp") == pytest.approx(16.0,
                                                                                                      rel=1e-12)
    assert forward_memory("tp4-dp2+ep2+ckpt+sp") == forward_memory("tp4-dp2+ep2+etp1+ckpt+sp")
    runtime = "gbmw-runtime"
    assert forward_memory("tp4-dp2+ep2+sp", runtime) - forward_memory("tp4-dp2+ep2+sp", runtime, without_field
                                                                      ) == pytest.approx(48.0, rel=1e-12)
    assert forward_memory("tp4-dp2+ep2+sp", "deepspeed") == forward_memory("tp4-dp2+ep2+sp", "deepspeed",
                                                                           without_field)


def test_a_dense_layer_is_unchanged_by_etp():
    dense = make_layer()
    x, y = costs("tp2-dp4+sp", dense), costs("tp2-dp4+ep4+etp1+sp", dense)
    for field in ("time_s", "time_no_grad_sync_s", "forward_memory_bytes", "backward_memory_bytes",
                  "model_state_bytes", "optimizer_parameters"):
        assert np.array_equal(getattr(x, field), getattr(y, field)), field


# ------------------------------------------------------------------------------------------------------ rank groups


MEGATRON_EXPERT_GROUPS = {  # megatron-core's RankGenerator(tp=1, ep=4, dp=2, pp=2, cp=1, order="tp-cp-ep-dp-pp")
    "ep": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
    "dp": [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]],
}


def test_rank_groups_follow_megatron_cores_expert_order():
    """16 ranks, pp 2, each stage tp2-dp4 with experts at ETP 1 over EP 4: EP groups of 4 consecutive ranks (across
    TP pairs), expert-data-parallel pairs 4 apart, ETP groups of one — megatron-core's groups for the same sizes."""
    layout, strategy = RankLayout(16, 2), Strategy.parse("tp2-dp4+ep4+etp1+sp")
    ranks = range(16)
    assert sorted({layout.expert_group(rank, strategy) for rank in ranks}) == [
        tuple(group) for group in MEGATRON_EXPERT_GROUPS["ep"]]
    assert sorted({layout.expert_data_group(rank, strategy) for rank in ranks}) == [
        tuple(group) for group in MEGATRON_EXPERT_GROUPS["dp"]]
    assert {layout.expert_tensor_group(rank, strategy) for rank in ranks} == {(rank,) for rank in ranks}
    assert layout.tensor_group(5, strategy) == (4, 5)  # the attention's TP is untouched
    wide = Strategy.parse("tp4-dp2+ep2+etp2+sp")  # 8 ranks: ETP pairs, EP 2 ranks apart, EDP 4 apart
    single = RankLayout(8, 1)
    assert single.expert_tensor_group(5, wide) == (4, 5)
    assert single.expert_group(5, wide) == (5, 7) and single.expert_data_group(5, wide) == (1, 5)


@pytest.mark.torch
def test_rank_groups_against_megatron_cores_rank_generator():
    parallel_state = pytest.importorskip("megatron.core.parallel_state")
    layout = RankLayout(16, 2)
    for tp, dp, etp, ep in ((2, 4, 1, 4), (4, 2, 2, 2), (2, 4, 1, 8), (4, 2, 1, 2)):
        strategy = Strategy.parse(f"tp{tp}-dp{dp}+ep{ep}+etp{etp}+sp")
        generator = parallel_state.RankGenerator(tp=etp, ep=ep, dp=8 // (etp * ep), pp=2, cp=1, order="tp-cp-ep-dp-pp")
        for name, group in (("ep", layout.expert_group), ("dp", layout.expert_data_group),
                            ("tp", layout.expert_tensor_group)):
            assert sorted({group(rank, strategy) for rank in range(16)}) == sorted(
                tuple(ranks) for ranks in generator.get_ranks(name)), (strategy.name, name)


# ------------------------------------------------------------------------------------------- targets and the search


def test_megatron_core_and_the_runtime_run_it_and_megatron_deepspeed_says_why_in_one_line():
    strategy = Strategy.parse("tp2-dp4+ep4+etp1+sp")
    assert get_target("megatron-core").allows(strategy, 1) and get_target("runtime").allows(strategy, 1)
    assert not get_target("megatron-deepspeed").allows(strategy, 1)
    assert runtime_strategy_refusal(strategy) is None
    job = gbmw.load_job("mixtral-8x7b_h100-80g-x64")
    with pytest.raises(PlanError) as refused:
        gbmw.uniform_plan(job, "tp=2,pp=4,zero=1,ep=8,etp=1,sp=on,micro=1,target=megatron-deepspeed")
    assert str(refused.value) == (
        "megatron-deepspeed cannot run this plan: experts at TP 1 beside the layers' TP 2 (+etp1): megatron-deepspeed "
        "runs the experts at the layer's TP degree — use --target megatron-core")


def test_the_space_offers_etp1_beside_the_layers_tp_where_the_target_runs_it():
    plain = enumerate_strategies(8, axes=("tp", "dp"), sequence_parallel=True, expert_parallel=True)
    offered = enumerate_strategies(8, axes=("tp", "dp"), sequence_parallel=True, expert_parallel=True,
                                   expert_tensor_parallel=True)
    assert offered[:len(plain)] == plain
    added = {s.name for s in offered[len(plain):]}
    assert {"tp2-dp4+ep8+etp1+sp", "tp2-dp4+ep2+etp1+sp", "tp8+ep8+etp1+sp", "tp4-dp2+ep8+etp1+sp+ckpt"} <= added
    assert all(Strategy.parse(name).expert_tp == 1 for name in added)
    assert not any("dp2-tp4" in name or "dp4-tp2" in name for name in added)  # TP innermost only
    cluster = tiny_moe_job(8).cluster
    for target in ("megatron-core", "runtime"):
        assert search_space(target=target).expert_tensor_parallel
        assert any(s.expert_tp for s in search_space(target=target).strategies(cluster, 1, experts=True))
        assert not any(s.expert_tp for s in search_space(target=target).strategies(cluster, 1, experts=False))
    assert not any(s.expert_tp for s in search_space(target="megatron-deepspeed").strategies(cluster, 1, experts=True))


def test_a_uniform_search_never_mixes_etp1_with_the_layers_tp():
    job = tiny_moe_job(8)
    space = SearchSpace.for_target(get_target("megatron-core"))
    strategies = space.strategies(job.cluster, 1, experts=True)
    for mask in space.groups(strategies, job.model):
        chosen = {(strategies[index].ep, strategies[index].expert_tp) for index in np.flatnonzero(mask.any(axis=1))}
        assert len(chosen) == 1


# ------------------------------------------------------------------------------------------- configs and arguments


def test_uniform_configs_take_etp_and_refuse_what_does_not_fit():
    job = gbmw.load_job("mixtral-8x7b_h100-80g-x64")
    config = UniformConfig.parse("tp=2,pp=4,zero=1,ep=8,etp=1,sp=on,micro=1,target=megatron-core")
    assert config.describe() == "tp=2,pp=4,zero=1,ckpt=none,sp=on,ep=8,etp=1,micro=1,target=megatron-core"
    plan = config.to_plan(job)
    assert {s.name for s, layer in zip(plan.strategies, job.model.layers) if layer.num_experts} == {
        "tp2-z1dp8+ep8+etp1+sp"}
    assert UniformConfig.parse("tp=2,ep=8,etp=2,sp=on").describe() == UniformConfig.parse("tp=2,ep=8,sp=on").describe()
    for bad, message in (
            ("tp=2,pp=4,ep=8,etp=1,micro=1", "--uniform etp=1: the experts' own TP degree must divide tp = 2 and goes "
                                             "with ep >= 2 and sp=on (given ep=8, sp=off), e.g. tp=2,etp=1,ep=4,sp=on"),
            ("tp=2,pp=4,ep=32,etp=1,sp=on,micro=1", "--uniform ep=32: expert parallelism splits the experts over the "
                                                    "stage's ranks over the experts' TP degree, so it must divide tp * "
                                                    "dp / etp = 2 * 8 / 1; EP degrees that do: [2, 4, 8, 16]")):
        with pytest.raises(PlanError) as refused:
            UniformConfig.parse(bad).to_plan(job)
        assert str(refused.value) == message


def test_megatron_core_arguments_carry_the_experts_tp_and_read_back():
    job = gbmw.load_job("mixtral-8x7b_h100-80g-x64")
    plan = gbmw.uniform_plan(job, "tp=2,pp=4,zero=1,ep=8,etp=1,sp=on,micro=1,target=megatron-core")
    args = plan_to_megatron_args(plan, job, "megatron-core")
    assert " --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 " in " ".join(args) + " "
    assert megatron_args_to_plan(args, job, "megatron-core").strategies == plan.strategies
    layer_tp = gbmw.uniform_plan(job, "tp=2,pp=4,zero=1,ep=8,sp=on,micro=1,target=megatron-core")
    assert "--expert-tensor-parallel-size 2" in " ".join(plan_to_megatron_args(layer_tp, job, "megatron-core"))
    # arguments written by hand: the flag read back, and refused where it cannot be
    without = [arg for arg in plan_to_megatron_args(layer_tp, job, "megatron-core")]
    index = without.index("--expert-tensor-parallel-size")
    as_etp1 = without[:index + 1] + ["1"] + without[index + 2:]
    assert {s.expert_tp for s in megatron_args_to_plan(as_etp1, job, "megatron-core").strategies} == {None, 1}
    with pytest.raises(GbmwError, match=r"^--expert-tensor-parallel-size 3: it must divide "
                                        r"--tensor-model-parallel-size 2$"):
        megatron_args_to_plan(without[:index + 1] + ["3"] + without[index + 2:], job, "megatron-core")


def test_megatron_deepspeed_arguments_without_expert_tp_are_refused():
    job = gbmw.load_job("mixtral-8x7b_h100-80g-x64")
    plan = gbmw.uniform_plan(job, "tp=2,pp=1,zero=2,ep=2,sp=on,ckpt=full,micro=1,target=megatron-deepspeed")
    args = plan_to_megatron_args(plan, job, "megatron-deepspeed")
    assert "--enable-expert-tensor-parallelism" in args
    assert megatron_args_to_plan(args, job, "megatron-deepspeed").strategies == plan.strategies
    with pytest.raises(GbmwError) as refused:
        megatron_args_to_plan([arg for arg in args if arg != "--enable-expert-tensor-parallelism"], job,
                              "megatron-deepspeed")
    assert str(refused.value) == (
        "--tensor-model-parallel-size 2 without --enable-expert-tensor-parallelism: Megatron-DeepSpeed then runs the "
        "experts whole, its EP groups inside one TP rank's data-parallel ranks — a layout gbmw does not cost; add "
        "--enable-expert-tensor-parallelism")


@pytest.mark.parametrize("space_name", ["megatron-core", "megatron-deepspeed"])
@pytest.mark.parametrize("per_node", [8, 4, 2])
def test_the_brute_force_oracle_enumerates_the_moe_layouts_of_the_stock_targets(space_name, per_node):
    """tests/uniform_plan_oracle.py (what benchmarks/search_vs_brute_force.py --uniform compares the search with)
    writes the experts-whole layouts out by hand; they must be the space's, on an MoE model (8 experts)."""
    from uniform_plan_oracle import space_layouts

    from gbmw.specs.jobs import JobSpec

    def planner_layouts(pp):  # test_search_exact_uniform._planner_layouts with the experts' strategies
        space, target = search_space(target=space_name), get_target(space_name)
        strategies = [s for s in space.strategies(job.cluster, pp, experts=True)
                      if target.runs_recompute_of(s, job.model)]
        block, other = int(np.argmax(job.model.is_block)), int(np.argmin(job.model.is_block))
        return {(strategies[int(mask[:, block].argmax())], strategies[int(mask[:, other].argmax())])
                for mask in space.groups(strategies, job.model)}

    moe = tiny_moe_job(8)
    cluster = make_cluster(nodes=8 // per_node, devices_per_node=per_node)
    job = JobSpec(name=moe.name, model=moe.model, cluster=cluster, precision="fp32",
                  memory_budget_bytes=moe.memory_budget_bytes)
    for pp in (1, 2):
        found = {(layout.block, layout.other) for layout in space_layouts(space_name, job, pp)}
        assert found == planner_layouts(pp), (space_name, pp)
        whole = {block.name for block, _ in found if block.expert_tp is not None}
        assert bool(whole) == (space_name == "megatron-core"), whole
