"""Context parallelism and Ulysses (issue 27): the sequence axes' rules, their costs against hand-computed values,
their transitions, and what each target offers."""

import numpy as np
import pytest
from conftest import make_cluster, make_layer, make_model

import gbmw
from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.layer_cost_batch import layer_costs
from gbmw.errors import PlanError
from gbmw.ranks import transition_fraction
from gbmw.space.strategy import Strategy, enumerate_strategies
from gbmw.space.sequence_split import sequence_split_problem
from gbmw.space.targets import get_target

# An attention block: 1000 parameters, 1e6 forward FLOPs a sample of which 2e5 are a flash attention core; one
# sample's queries are 40 bytes, its keys and values 80.
ATTENTION = dict(attention_heads=8, kv_heads=4, attention_query_bytes_per_sample=40.0,
                 attention_key_value_bytes_per_sample=80.0, attention_core_flops_per_sample=2e5,
                 forward_flash_attention_flops_per_sample=2e5)


def costs(name, layer, micro_batch=8, cluster=None):
    cluster = cluster or make_cluster()
    model = make_model([layer]).model_copy(update={"sequence_length": 64})
    return layer_costs(model, Strategy.parse(name), micro_batch, CostSettings(cluster, "fp32"), CommModel(cluster))


def test_one_sequence_axis_inside_the_data_parallel_one():
    assert Strategy.parse("tp2-cp2-z1dp4").gradient_view.name == "tp2-z1dp8"
    assert Strategy.parse("tp4-ulysses2").gradient_view.name == "tp4-dp2"
    assert Strategy.parse("cp2-dp4").data_parallel == 4 and Strategy.parse("cp2-dp4").sequence_parallel_degree == 2
    for bad in ("dp4-cp2", "cp2-tp2-dp2", "cp2-ulysses2"):
        with pytest.raises(PlanError, match="cp"):
            Strategy.parse(bad)
    names = {s.name for s in enumerate_strategies(8, axes=("tp", "cp", "dp"), ckpt=False)}
    assert {"cp8", "cp2-dp4", "tp2-cp4", "tp2-cp2-dp2"} <= names and not any(
        name.startswith("dp") and "cp" in name for name in names)


def test_a_sequence_split_layer_does_its_share_of_the_work_and_holds_the_same_weights_as_data_parallel():
    """cp2-dp4 on 8 samples: each rank has 1 sample's worth of tokens, as dp8 — same compute, stash and states
    (catches the work not divided by the sequence degree, or the weights not synchronised over the sequence ranks)."""
    layer = make_layer(**ATTENTION)
    for split in ("cp2-dp4", "ulysses2-dp4", "cp8", "ulysses8"):
        plain, other = costs("dp8", layer), costs(split, layer)
        assert other.forward_memory_bytes[0] == pytest.approx(plain.forward_memory_bytes[0])
        assert other.model_state_bytes[0] == pytest.approx(plain.model_state_bytes[0])
        assert other.optimizer_parameters[0] == pytest.approx(plain.optimizer_parameters[0])
        # the gradient synchronisation of the last micro-batch spans all 8 ranks in both
        gap_sync = other.time_s[0] - other.time_no_grad_sync_s[0]
        assert gap_sync == pytest.approx(plain.time_s[0] - plain.time_no_grad_sync_s[0], rel=1e-9)


def test_ulysses_all_to_alls_by_hand():
    """Forward: Q, K, V of the rank's tokens out (40 + 80 bytes a sample), the output back (40); backward the same:
    (u − 1)/u · M / B + (u − 1) · α each (catches a missing exchange or direction, or the wrong group)."""
    cluster = make_cluster(latency_us=5.0)
    layer = make_layer(**ATTENTION)
    u, samples = 4, 8 / 2 / 4  # ulysses4-dp2 on 8 samples: 1 sample per data rank, a quarter of its tokens
    one_byte = (u - 1) / u / 100e9
    expected = 2 * ((2 * 40 + 80) * samples * one_byte + 2 * (u - 1) * 5e-6)
    plain = costs("dp8", layer, cluster=cluster)  # the same tokens per rank, no exchange
    split = costs("ulysses4-dp2", layer, cluster=cluster)
    assert split.time_no_grad_sync_s[0] - plain.time_no_grad_sync_s[0] == pytest.approx(expected, rel=1e-9)


def test_the_ring_costs_what_the_attention_does_not_hide():
    """CP's c − 1 sends of a key/value chunk per pass, each hidden by 1/c of the rank's attention compute: on a slow
    link the excess shows, forward once and backward twice; on a fast one nothing does."""
    layer = make_layer(**ATTENTION)
    c, samples = 4, 8 / 2 / 4
    attention_s = 2e5 * samples / 1e12 / c  # the test device's attention rate: its sustained 1 TFLOP/s
    slow = make_cluster(intra_gb_per_s=1e-6, latency_us=1.0)
    send = 80 * samples / 1e-6 / 1e9 + 1e-6
    exposed = costs("cp4-dp2", layer, cluster=slow).time_no_grad_sync_s[0] - costs("dp8", layer, cluster=slow
                                                                                   ).time_no_grad_sync_s[0]
    assert exposed == pytest.approx((c - 1) * ((send - attention_s) + (2 * send - 2 * attention_s)), rel=1e-9)
    fast = make_cluster(intra_gb_per_s=1e6)
    assert costs("cp4-dp2", layer, cluster=fast).time_no_grad_sync_s[0] == pytest.approx(
        costs("dp8", layer, cluster=fast).time_no_grad_sync_s[0], rel=1e-12)


def test_transitions_between_sequence_layouts():
    # dp8 → cp2-dp4: a rank of cp2-dp4 needs half the tokens of 2 of the 8 slices (1/8 of the micro-batch) and holds
    # 1/8 of it before, of which it keeps 1/16: it receives 1/16, and sends back gradients of the other 1/16
    assert transition_fraction(Strategy.parse("dp8"), Strategy.parse("cp2-dp4")) == pytest.approx(1 / 16 + 1 / 16)
    assert transition_fraction(Strategy.parse("cp2-dp4"), Strategy.parse("cp2-dp4+ckpt")) == 0
    # cp2 holds chunks (0, 3) and (1, 2) of 4, ulysses2 the halves (0, 1) and (2, 3): each rank keeps one chunk of its
    # two — it receives 1/16 of the micro-batch and sends back gradients of 1/16 (the runtime's Slice-Gather moves that)
    assert transition_fraction(Strategy.parse("cp2-dp4"), Strategy.parse("ulysses2-dp4")) == pytest.approx(1 / 8)
    assert transition_fraction(Strategy.parse("cp4-dp2"), Strategy.parse("cp4-dp2+ckpt")) == 0
    # cp4 → cp2-dp2: rank j of cp4 (chunks j, 7 − j of 8) needs chunks (j', 3 − j') of 4 of half the samples
    assert transition_fraction(Strategy.parse("cp4"), Strategy.parse("cp2-dp2")) == pytest.approx(
        transition_fraction(Strategy.parse("cp2-dp2"), Strategy.parse("cp4")))


def test_sequence_pieces_are_megatron_cores_load_balanced_chunks():
    from gbmw.ranks import data_layout, sequence_pieces

    cp4, ulysses4 = Strategy.parse("tp2-cp4"), Strategy.parse("tp2-ulysses4")
    assert [sequence_pieces(local, cp4) for local in range(0, 8, 2)] == [((0, 8), (7, 8)), ((1, 8), (6, 8)),
                                                                        ((2, 8), (5, 8)), ((3, 8), (4, 8))]
    assert [sequence_pieces(local, ulysses4) for local in range(0, 8, 2)] == [((part, 4),) for part in range(4)]
    assert data_layout(Strategy.parse("dp2"))[1] == (1, 2, ((0, 1),))


def test_each_target_offers_its_own_sequence_axis_with_its_rules():
    core, deepspeed = get_target("megatron-core"), get_target("megatron-deepspeed")
    assert core.allows(Strategy.parse("tp2-cp4+sp"), 1) and not core.allows(Strategy.parse("ulysses2"), 1)
    assert deepspeed.allows(Strategy.parse("ulysses4-z1dp2"), 1) and not deepspeed.allows(Strategy.parse("cp2"), 1)
    assert not deepspeed.allows(Strategy.parse("tp2-ulysses2+sp"), 1)  # its initialize refuses both at once
    job = gbmw.load_job("llama3.1-8b-32k_h100-80g-x64")
    block = job.model.layers[1]
    assert sequence_split_problem(Strategy.parse("tp2-ulysses8"), block, job.model) is not None  # 8 kv heads
    assert sequence_split_problem(Strategy.parse("ulysses8"), block, job.model) is None
    standard = job.model.model_copy(update={"layers": tuple(layer.model_copy(
        update={"forward_flash_attention_flops_per_sample": 0.0}) for layer in job.model.layers)})
    assert "fused (flash)" in sequence_split_problem(Strategy.parse("cp2"), standard.layers[1], standard, core)
    runtime = get_target("runtime")  # ring attention without attention dropout or +sp
    assert runtime.allows(Strategy.parse("tp2-cp2-z1dp2"), 1) and not runtime.allows(Strategy.parse("tp2-cp2+sp"), 1)
    assert sequence_split_problem(Strategy.parse("cp2"), block, job.model, runtime) is None
    dropout = job.model.model_copy(update={"architecture": job.model.architecture.model_copy(update={"dropout": True})})
    assert "without attention dropout" in sequence_split_problem(Strategy.parse("cp2"), block, dropout, runtime)
    assert sequence_split_problem(Strategy.parse("cp2"), block, dropout, core) is None
    with pytest.raises(PlanError, match=r"--uniform tp=2, pp=4, cp=16: devices\(64\) % \(tp \* pp \* cp = 128\) != 0"):
        gbmw.uniform_plan(job, "tp=2,pp=4,cp=16,micro=1,target=megatron-core")


def test_a_plan_with_a_sequence_axis_round_trips_and_other_targets_refuse_it():
    job = gbmw.load_job("llama3.1-8b-32k_h100-80g-x64")
    plan = gbmw.uniform_plan(job, "tp=2,pp=2,zero=1,cp=4,sp=on,micro=1,target=megatron-core")
    assert gbmw.Plan.from_yaml(plan.to_yaml()) == plan
    assert np.isfinite(gbmw.estimate(job, plan).samples_per_s)
    with pytest.raises(PlanError, match="context parallelism \\(cp\\): megatron-deepspeed does not run it"):
        get_target("megatron-deepspeed").check(plan, job.model)


def test_sequence_parallel_rows_keep_every_other_rule():
    """+sp strategies' rows once overwrote the masks computed before them: tp2-cp2+sp was offered on blocks whose
    attention is not fused (megatron-core picked it for GPT-3 39B)."""
    job = gbmw.load_job("gpt3-39b_a100-80g-x32")  # standard attention
    allowed = get_target("megatron-core").layers_allowed(job.model, [Strategy.parse("tp2-cp2+sp"),
                                                                       Strategy.parse("tp2-cp2")])
    blocks = job.model.is_block
    assert not allowed[:, blocks].any() and allowed[:, ~blocks].all()
