"""Rank math (gbmw.ranks) of the cost model and the runtime's process groups, without processes or torch."""

import pytest

from gbmw.errors import PlanError
from gbmw.plan import plan_from_strategy_names
from gbmw.ranks import RankLayout, activation_layout, plan_group_ranks
from gbmw.space.strategy import Strategy
from gbmw.specs.jobs import load_job


def test_tp_innermost_groups_are_consecutive():
    layout = RankLayout(16, 2)
    strategy = Strategy.parse("tp2-dp4")
    assert layout.tensor_group(9, strategy) == (8, 9)
    assert layout.data_group(9, strategy) == (9, 11, 13, 15)
    assert layout.digits(13, strategy) == {"tp": 1, "dp": 2}
    outer = Strategy.parse("dp4-tp2")
    assert layout.tensor_group(9, outer) == (9, 13)
    assert layout.data_group(9, outer) == (8, 9, 10, 11)


def test_pipeline_neighbours():
    layout = RankLayout(8, 4)
    assert [layout.next_stage_rank(r) for r in range(8)] == [2, 3, 4, 5, 6, 7, None, None]
    assert [layout.previous_stage_rank(r) for r in range(8)] == [None, None, 0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("name", ["tp2-dp4", "dp4-tp2", "sdp8", "tp8", "dp2-tp2-sdp2", "tp2-z1dp4"])
def test_groups_partition_the_stage_and_shards_match_the_cost_model(name):
    strategy = Strategy.parse(name)
    layout = RankLayout(16, 2)
    for axes in (("tp",), ("dp", "z1dp", "z2dp", "sdp")):
        groups = {layout.group(rank, strategy, axes) for rank in range(16)}
        members = sorted(rank for group in groups for rank in group)
        assert members == list(range(16))  # a partition of all ranks
        assert all(layout.stage_of(min(g)) == layout.stage_of(max(g)) for g in groups)
    # the batch slices match the activation layouts the estimator prices transitions with
    assert tuple(layout.batch_shard(rank, strategy) for rank in range(8)) == activation_layout(strategy)
    # ranks of one TP group see the same samples; ranks of one data group see different ones
    for rank in range(16):
        assert len({layout.batch_shard(r, strategy) for r in layout.tensor_group(rank, strategy)}) == 1
        data = layout.data_group(rank, strategy)
        assert len({layout.batch_shard(r, strategy) for r in data}) == len(data)


def test_plan_group_pool_is_complete_and_deterministic():
    job = load_job("bert-huge-32_rtx-titan-x8")
    names = ["tp2-dp2"] * 10 + ["sdp4"] * 7 + ["sdp4+ckpt"] * 17
    plan = plan_from_strategy_names(job.model, 8, names, [17, 17], 16, 4)
    groups = plan_group_ranks(plan)
    assert groups == plan_group_ranks(plan) and len(groups) == len(set(groups))
    assert (0, 1) in groups and (0, 2) in groups and (4, 5, 6, 7) in groups and (0, 4) in groups
    assert (0, 1, 2, 3) in groups  # sdp4 on stage 0


def test_strategy_must_span_the_stage():
    with pytest.raises(PlanError, match=r"spans 4 devices but a stage has world_size\(16\) / pp\(2\) = 8"):
        RankLayout(16, 2).digits(0, Strategy.parse("tp4"))


def test_expert_groups_are_consecutive_data_parallel_indices_inside_the_data_parallel_group():
    """+epN (megatron-core's tp-ep-dp order): the EP group of a rank is the ep ranks of its TP index whose
    data-parallel indices differ only in the lowest ep-ary digit; the expert-data-parallel group holds the same
    experts (same position in their EP group). Both partition the stage and refine the data-parallel group."""
    layout = RankLayout(16, 2)
    strategy = Strategy.parse("tp2-dp4+ep2")
    assert layout.expert_group(9, strategy) == (9, 11)  # dp indices 0, 1 of TP index 1 on stage 1
    assert layout.expert_data_group(9, strategy) == (9, 13)  # dp indices 0, 2
    assert layout.expert_group(13, strategy) == (13, 15)
    assert layout.expert_group(0, Strategy.parse("dp8+ep8")) == tuple(range(8))
    assert layout.expert_data_group(0, Strategy.parse("dp8+ep8")) == (0,)
    assert layout.expert_group(3, Strategy.parse("tp2-dp4")) == (3,)
    for name in ("tp2-dp4+ep2", "dp4-tp2+ep4", "sdp8+ep2", "tp4-dp2+ep2"):
        strategy = Strategy.parse(name)
        for rank in range(16):
            ep, edp = layout.expert_group(rank, strategy), layout.expert_data_group(rank, strategy)
            assert len(ep) == strategy.ep and len(edp) == strategy.expert_data_parallel
            assert set(ep) | set(edp) <= set(layout.data_group(rank, strategy)) and set(ep) & set(edp) == {rank}
            assert all(layout.expert_group(member, strategy) == ep for member in ep)
            assert all(layout.expert_data_group(member, strategy) == edp for member in edp)


def test_plan_group_pool_has_the_expert_groups():
    job = load_job("bert-huge-32_rtx-titan-x8")
    plan = plan_from_strategy_names(job.model, 8, ["tp2-dp4+ep2"] * 34, [34], 16, 4)
    groups = plan_group_ranks(plan)
    assert (0, 2) in groups and (5, 7) in groups  # EP groups
    assert (0, 4) in groups and (3, 7) in groups  # expert-data-parallel groups


def test_ulysses_groups_share_every_digit_but_ulysses_and_gradients_span_data_and_ulysses_ranks():
    """tp2-ulysses2-dp2 on a stage of 8: local rank = tp + 2·ulysses + 4·dp; the Ulysses group of a rank holds the other
    parts of its samples (in part order), its gradient group is the data-parallel group of `gradient_view` (tp2-dp4)."""
    layout = RankLayout(16, 2)
    strategy = Strategy.parse("tp2-ulysses2-dp2")
    assert layout.ulysses_group(13, strategy) == (13, 15) and layout.ulysses_group(8, strategy) == (8, 10)
    assert layout.gradient_group(13, strategy) == (9, 11, 13, 15)
    assert layout.gradient_group(13, strategy) == layout.data_group(13, strategy.gradient_view)
    assert layout.ulysses_group(13, Strategy.parse("tp2-dp4")) == (13,)
    plan = plan_from_strategy_names(load_job("gpt-tiny_cpu-x4").model, 4,
                                    ["dp4", "tp2-ulysses2", "ulysses4", "ulysses4", "ulysses2-dp2", "dp4"], [6], 8, 2)
    groups = plan_group_ranks(plan)
    assert (0, 2) in groups and (1, 3) in groups and (0, 1, 2, 3) in groups  # ulysses of tp2-ulysses2, ulysses4
    assert (0, 1) in groups and (2, 3) in groups  # ulysses2-dp2's Ulysses groups


def test_whole_sample_transitions_equal_the_rank_by_rank_loop():
    """The vectorised transition fraction (no sequence axis: every rank holds whole samples) is the rank-by-rank
    loop's, float for float, for every ordered pair of trees over 16 devices (2,704 pairs: DP, ZeRO and TP mixed)."""
    import itertools

    from gbmw import ranks
    from gbmw.space.strategy import enumerate_strategies

    def rank_by_rank(previous, current):
        worst = 0.0
        for held, needed in zip(ranks.data_layout(Strategy(previous)), ranks.data_layout(Strategy(current))):
            overlap = ranks._overlap(held[0], held[1], needed[0], needed[1]) * ranks._overlap(0, 1, 0, 1)
            worst = max(worst, (ranks._held_fraction(needed) - overlap) + (ranks._held_fraction(held) - overlap))
        return worst

    trees = list(dict.fromkeys(s.dims for s in enumerate_strategies(16, axes=("dp", "z1dp", "sdp", "tp"),
                                                                    prune_dp_with_sdp=False)))
    pairs = list(itertools.product(trees, trees))
    assert len(pairs) > 2000
    assert all(ranks._whole_sample_transition_fraction(a, b) == rank_by_rank(a, b) for a, b in pairs)
