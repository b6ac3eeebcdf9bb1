"""The estimator against hand-computed values, and its properties."""


import numpy as np
import pytest
from conftest import make_cluster, make_job, make_layer, make_model, with_timings
from hypothesis import given, settings
from hypothesis import strategies as st

from gbmw.cost.comm import CommModel
from gbmw.cost.estimate import estimate_plan, plan_stage_estimates
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.layer_cost_batch import layer_costs
from gbmw.cost.model_states import state_bytes
from gbmw.cost.pipeline_schedules import pipeline_time_s
from gbmw.cost.stage_cost import StageCosts, stage_estimate, strategy_tables
from gbmw.plan import plan_from_strategy_names
from gbmw.ranks import transition_fraction
from gbmw.space.strategy import Strategy, enumerate_strategies


def costs(name, micro_batch=8, precision="fp32", layer=None, cluster=None, framework="gbmw-runtime"):
    cluster = cluster or make_cluster()
    model = make_model([layer or make_layer()], precision)
    settings = CostSettings(cluster, precision, framework=framework)
    return layer_costs(model, Strategy.parse(name), micro_batch, settings, CommModel(cluster))


# Layer: 1000 parameters (800 split by TP), boundary 100 B, intermediate 50 B whole + 200 B split, per sample. The
# runtime's backward holds the gradients of the layer's output and input (100 B each per sample: W = 200 B × samples)
# and, sharded, its gathered copies and gradients and a flat all-gather buffer of its size (gbmw.cost.framework_memory).
@pytest.mark.parametrize(
    "name, states, forward, backward",
    [
        # fp32 Adam: 4 + 4 + 8 = 16 bytes per parameter.
        ("dp8", 1000 * 16, 1 * (100 + 50 + 200), 200),
        # 7/8 of the weights gathered with their gradients (4 + 4 B), the whole layer's flat buffer (4 B), W
        ("sdp8", 1000 * 16 / 8, 1 * (100 + 50 + 200), 3500 + 3500 + 4000 + 200),
        ("tp8", (800 / 8 + 200) * 16, 8 * (100 + 50 + 200 / 8), 8 * 200),
        ("tp2-dp4", (800 / 2 + 200) * 16, 2 * (100 + 50 + 200 / 2), 2 * 200),
        ("dp4-tp2", (800 / 2 + 200) * 16, 2 * (100 + 50 + 200 / 2), 2 * 200),
        ("dp8+ckpt", 1000 * 16, 1 * 100, 1 * (50 + 200) + 200),
        # 4 samples: the rebuilt stash 4 · (50 + 200/4), half of 400 TP-local parameters gathered, their buffer, W
        ("tp4-sdp2+ckpt", (800 / 4 + 200) * 16 / 2, 4 * 100,
         4 * (50 + 200 / 4) + 400 * 8 / 2 + 400 * 4 + 4 * 200),
        # ZeRO-1/2 in the runtime: whole weights and the layer's own 1/8 shard beside them; the gather buffer
        ("z1dp8", 1000 * (4 + 4 + 8 / 8 + 4 / 8), 350, 1000 * 4 + 200),
        ("z2dp8", 1000 * (4 + 4 / 8 + 8 / 8 + 4 / 8), 350, 1000 * 4 + 200),
        # recomputing, ZeRO-1/2 gathers nothing in backward and reduce-scatters after the rebuilt stash (50 + 200) and
        # W are freed: the larger of the buffer and them, not their sum (4450 B: catches the sum)
        ("z2dp8+ckpt", 1000 * (4 + 4 / 8 + 8 / 8 + 4 / 8), 100, max(1000 * 4, 250 + 200)),
        ("z1dp8+ckpt", 1000 * (4 + 4 + 8 / 8 + 4 / 8), 100, max(1000 * 4, 250 + 200)),
    ],
)
def test_single_layer_memory_by_hand(name, states, forward, backward):
    result = costs(name)
    assert result.model_state_bytes[0] == pytest.approx(states)
    assert result.forward_memory_bytes[0] == pytest.approx(forward)
    assert result.backward_memory_bytes[0] == pytest.approx(backward)


def test_a_zero3_heads_own_gather_buffer_is_gone_before_its_backward_computes():
    """A ZeRO-3 head is the first layer of its stage's backward: its own flat buffer (4 B × 1000) is freed before it
    computes, so beside its 7/8 gathered weights (3500 B) it holds the larger of the buffer and what it computes —
    the gathered gradients (3500 B) and its output's gradient (100 B per sample; a head sends none on). A ZeRO-1 head
    gathers in forward beside its loss and keeps the sum. Catches the buffer added to a ZeRO-3 head's backward as to
    a block's (11,100 B), or dropped from a ZeRO-1 head's."""
    head = make_layer(kind="head")
    assert costs("sdp8", layer=head).backward_memory_bytes[0] == pytest.approx(3500 + max(4000, 3500 + 100))
    assert costs("z1dp8", layer=head).backward_memory_bytes[0] == pytest.approx(4000 + 100)


@pytest.mark.parametrize("framework, name, bytes_per_parameter", [
    # gbmw's runtime trains bf16 under autocast: fp32 weights, fp32 gradients, Adam's fp32 moments (ZeRO-1 keeps
    # its own weight shard beside the gathered weights: FSDP2 without resharding after forward)
    ("gbmw-runtime", "dp8", 4 + 4 + 8), ("gbmw-runtime", "z1dp8", 4 + 4 + 8 / 8 + 4 / 8),
    ("gbmw-runtime", "sdp8", 16 / 8),
    # Megatron-LM's "Distributed Optimizer" docs: bf16 parameters with fp32 main gradients: 18, and 6 + 12/d
    ("megatron", "dp8", 18), ("megatron", "z1dp8", 6 + 12 / 8),
    # DeepSpeed's estimate_zero2_model_states_mem_needs: 2 + 18/d with ZeRO-2 (16-bit weights kept whole)
    ("deepspeed", "z2dp8", 2 + 18 / 8), ("deepspeed", "z1dp8", 2 + 2 + 16 / 8), ("deepspeed", "sdp8", 20 / 8),
])
def test_mixed_precision_model_states_are_what_each_framework_keeps(framework, name, bytes_per_parameter):
    result = costs(name, precision="bf16", framework=framework)
    assert result.model_state_bytes[0] == pytest.approx(1000 * bytes_per_parameter)


def test_single_layer_time_by_hand():
    # 1 sample per device, 1e6 FLOPs at 1 TFLOP/s: forward 1 us, backward 2 us.
    # DP all-reduce of 1000 fp32 gradients over 8 ranks at 100 GB/s: 2 * 7/8 * 4000 / 1e11 = 70 ns,
    # overlapped with the 2 us backward and slowed by 1.3: + 0.3 * 70 ns.
    result = costs("dp8")
    assert result.time_no_grad_sync_s[0] == pytest.approx(3e-6)
    assert result.time_s[0] == pytest.approx(3e-6 + 0.3 * 7e-8)
    # CKPT recomputes the forward.
    assert costs("dp8+ckpt").time_s[0] == pytest.approx(4e-6 + 0.3 * 7e-8)
    # TP8 over the full micro-batch of 8: compute 8 us / 8; two all-reduces of 8 * 100 B in forward and backward.
    allreduce = 2 * 7 / 8 * 800 / 1e11
    assert costs("tp8").time_s[0] == pytest.approx(3e-6 + 2 * allreduce)
    # SDP8: all-gather (7/8 * 4000 B) before forward and before backward, reduce-scatter after, every micro-batch.
    gather = 7 / 8 * 4000 / 1e11
    sdp = costs("sdp8")
    assert sdp.time_no_grad_sync_s[0] == pytest.approx(1e-6 + gather + 2e-6 + 0.3 * 2 * gather)
    assert sdp.time_s[0] == pytest.approx(sdp.time_no_grad_sync_s[0])


def test_overlap_when_communication_dominates():
    # A slow link: the all-reduce takes longer than backward compute: max(c, g) + (f - 1) * min(c, g).
    slow = make_cluster(intra_gb_per_s=0.001)
    result = costs("dp8", cluster=slow)
    communication = 2 * 7 / 8 * 4000 / 1e6
    assert result.time_s[0] == pytest.approx(1e-6 + communication + 0.3 * 2e-6)


def test_cross_node_group_shares_the_nics():
    cluster = make_cluster(nodes=2, devices_per_node=4, intra_gb_per_s=100, inter_gb_per_s=8)
    comm = CommModel(cluster)
    # 8 ranks over 2 nodes, 4 per node: all devices of a node take part: the level's full bandwidth.
    assert comm.allreduce_s(1e9, 8, 1) == pytest.approx(2 * 7 / 8 * 1e9 / 8e9)
    # 2 ranks 4 apart (one per node): 4 such groups share each node's links: a quarter each.
    assert comm.allreduce_s(1e9, 2, 4) == pytest.approx(2 * 1 / 2 * 1e9 / 2e9)
    # Inside a node: the intra-node level.
    assert comm.allreduce_s(1e9, 4, 1) == pytest.approx(2 * 3 / 4 * 1e9 / 100e9)


def test_transition_fractions():
    same = [("tp2-dp4", "tp2-sdp4"), ("dp8", "dp8+ckpt"), ("dp8", "sdp8")]
    for a, b in same:
        assert transition_fraction(Strategy.parse(a), Strategy.parse(b)) == 0.0
    # dp8 -> tp8: every device lacks 7/8 of the batch forward; backward it only slices.
    assert transition_fraction(Strategy.parse("dp8"), Strategy.parse("tp8")) == pytest.approx(7 / 8)
    assert transition_fraction(Strategy.parse("tp8"), Strategy.parse("dp8")) == pytest.approx(7 / 8)
    # tp2-dp4 and dp4-tp2 split the batch over different devices: some device holds a disjoint quarter.
    assert transition_fraction(Strategy.parse("tp2-dp4"), Strategy.parse("dp4-tp2")) == pytest.approx(0.5)


def stage_of(model, names, first_layer, stage_index, pp, micro_batch, num_micro_batches, cluster):
    """stage_estimate of one stage whose layers use the strategies `names`."""
    comm = CommModel(cluster)
    strategies = [Strategy.parse(name) for name in names]
    distinct = list(dict.fromkeys(strategies))
    tables = strategy_tables(model, distinct, micro_batch, CostSettings(cluster, "fp32"), comm)
    costs = StageCosts(model, tables, pp, num_micro_batches, "1f1b", comm)
    return stage_estimate(costs, stage_index, first_layer, [distinct.index(strategy) for strategy in strategies])


def test_one_f_one_b_stage_memory_and_pipeline_time():
    cluster = make_cluster()
    model = make_model([make_layer(f"l{i}") for i in range(4)])
    first = stage_of(model, ["dp4"] * 2, 0, 0, 2, 8, 4, cluster)
    last = stage_of(model, ["dp4"] * 2, 2, 1, 2, 8, 4, cluster)
    per_layer_f = 2 * 350  # 2 samples per device
    gradients_in_out = 2 * 2 * 100  # the running layer's output and input gradients (the runtime's backward)
    assert first.in_flight_micro_batches == 2 and last.in_flight_micro_batches == 1
    assert first.activation_bytes == pytest.approx(2 * 2 * per_layer_f + gradients_in_out)
    assert last.activation_bytes == pytest.approx(2 * per_layer_f + gradients_in_out)
    assert first.model_state_bytes == pytest.approx(2 * 16000)
    stages = [first, last]
    # fill and drain through both stages, 3 more micro-batches at the slowest stage's pace, then the slowest
    # stage's gradient synchronisation and optimizer step (the stages run theirs at the same time)
    assert pipeline_time_s(stages, 4) == pytest.approx(
        3 * max(s.time_no_grad_sync_s for s in stages) + sum(s.time_no_grad_sync_s for s in stages)
        + max(s.time_s - s.time_no_grad_sync_s for s in stages) + max(s.optimizer_time_s for s in stages)
    )
    assert first.time_s > first.time_no_grad_sync_s and first.optimizer_time_s > 0


def test_ckpt_backward_extra_counts_at_the_peak_layer_only():
    cluster = make_cluster()
    model = make_model([make_layer(f"l{i}") for i in range(3)])
    stage = stage_of(model, ["dp8+ckpt"] * 3, 0, 0, 1, 8, 1, cluster)
    # stash 3 boundaries (100 B each) + one layer's recomputed intermediates (250 B) and its output and input
    # gradients (100 B each) at its backward
    assert stage.activation_bytes == pytest.approx(3 * 100 + 250 + 2 * 100)


def test_estimate_plan_end_to_end_and_tied_layers_counted_once():
    cluster = make_cluster()
    layers = [make_layer("embedding", kind="embedding"), make_layer("l1"),
              make_layer("head", kind="head", tied_to="embedding", tied_parameter_count=600)]
    model = make_model(layers)
    job = make_job(model, cluster)
    one_stage = plan_from_strategy_names(model, 8, ["dp8"] * 3, [3], 16, 2)
    two_stage = plan_from_strategy_names(model, 8, ["dp4"] * 3, [2, 1], 16, 2)
    assert estimate_plan(job, one_stage).stage_model_state_bytes[0] == pytest.approx(3 * 16000 - 600 * 16)
    estimate = estimate_plan(job, two_stage)
    assert estimate.stage_model_state_bytes == pytest.approx((2 * 16000, 16000))
    assert model.parameter_count == 3000 - 600
    assert estimate.samples_per_s == pytest.approx(16 / estimate.iteration_time_s)
    assert estimate.fits
    assert estimate.model_tflops_per_device == pytest.approx(3 * 3e6 * 16 / estimate.iteration_time_s / 8 / 1e12)


# ------------------------------------------------------------------ properties over random specs

layer_fields = st.fixed_dictionaries({
    "parameter_count": st.integers(0, 10**9),
    "split_share": st.floats(0, 1),
    "forward_flops_per_sample": st.floats(1e3, 1e13),
    "boundary_activation_bytes_per_sample": st.floats(0, 1e9),
    "intermediate_activation_bytes_per_sample": st.floats(0, 1e9),
    "intermediate_tp_split_activation_bytes_per_sample": st.floats(0, 1e9),
    "tp_allreduce_bytes_per_sample": st.floats(0, 1e9),
})


def random_layer(values, index=0):
    values = dict(values)
    share = values.pop("split_share")
    return make_layer(f"l{index}", tp_split_parameter_count=int(values["parameter_count"] * share), **values)


@settings(max_examples=60, deadline=None)
@given(values=layer_fields, precision=st.sampled_from(["fp32", "bf16"]), micro_batch=st.sampled_from([8, 16, 64]))
def test_more_tp_or_sdp_never_raises_model_states_and_ckpt_never_raises_stash(values, precision, micro_batch):
    cluster = make_cluster(nodes=2, devices_per_node=4)
    model = make_model([random_layer(values)], precision)
    settings_, comm = CostSettings(cluster, precision), CommModel(cluster)
    by_name = {s.name: layer_costs(model, s, micro_batch, settings_, comm) for s in enumerate_strategies(8, prune_dp_with_sdp=False)}
    for name, result in by_name.items():
        strategy = Strategy.parse(name)
        assert np.all(result.time_s >= 0) and np.all(result.time_no_grad_sync_s >= 0)
        assert np.all(result.time_s >= result.time_no_grad_sync_s - 1e-15)
        if strategy.ckpt:
            plain = by_name[strategy.with_ckpt(False).name]
            assert result.forward_memory_bytes[0] <= plain.forward_memory_bytes[0] + 1e-6
            assert result.time_s[0] >= plain.time_s[0] - 1e-12
    # Replacing a dp factor by tp or sdp of the same degree never raises model states.
    pairs = [("dp8", "sdp8"), ("dp8", "tp8"), ("tp2-dp4", "tp2-sdp4"), ("tp2-dp4", "tp8"), ("dp2-tp4", "tp8"),
             ("dp4-tp2", "sdp4-tp2"), ("dp8", "dp2-sdp4"), ("tp2-dp4", "tp4-dp2")]
    for lower, higher in pairs:
        assert by_name[higher].model_state_bytes[0] <= by_name[lower].model_state_bytes[0] + 1e-6


@settings(max_examples=30, deadline=None)
@given(layers=st.lists(layer_fields, min_size=2, max_size=6), pp=st.sampled_from([1, 2]),
       micro_batches=st.sampled_from([1, 2, 4]), data=st.data())
def test_random_plans_cost_at_least_their_compute_and_model_states(layers, pp, micro_batches, data):
    """However a random plan splits the work, an iteration takes at least the forward and backward compute (3 × the
    forward FLOPs) of the global batch spread evenly over all 8 devices at their sustained rate, and the devices
    together hold at least one copy of every parameter's model states (16 bytes per parameter in fp32 with Adam)."""
    cluster = make_cluster()
    model = make_model([random_layer(values, i) for i, values in enumerate(layers)])
    job = make_job(model, cluster)
    candidates = [s.name for s in enumerate_strategies(8 // pp)]
    names = [data.draw(st.sampled_from(candidates)) for _ in layers]
    cut = data.draw(st.integers(1, len(layers) - 1)) if pp == 2 else None
    partition = [len(layers)] if pp == 1 else [cut, len(layers) - cut]
    plan = plan_from_strategy_names(model, 8, names, partition, 8 * micro_batches, micro_batches)
    estimate = estimate_plan(job, plan)
    compute_floor_s = 3 * model.forward_flops_per_sample * plan.global_batch / (8 * cluster.sustained_flops("fp32"))
    assert estimate.iteration_time_s >= compute_floor_s * (1 - 1e-9)  # 1e-9: sums of ≤ 6 layers reordered
    held_by_all_devices = sum(states * (8 // pp) for states in estimate.stage_model_state_bytes)
    assert held_by_all_devices >= model.parameter_count * state_bytes("gbmw-runtime", "fp32", "adam").total * (1 - 1e-9)
    stages = plan_stage_estimates(job, plan)
    for peak, states, activations, stage in zip(estimate.stage_peak_memory_bytes, estimate.stage_model_state_bytes,
                                                estimate.stage_activation_bytes, stages):
        # forward/backward (states + activations) and the reserve for the runtime's Adam step: √v, 4 bytes of the
        # 16 per parameter it steps (fewer than a chunk here)
        assert states + activations <= peak <= states * 1.25 + activations + 1e-6
        assert stage.forward_backward_peak_bytes == pytest.approx(states + activations, rel=1e-12)
    assert estimate.fits == all(m <= job.memory_budget_bytes for m in estimate.stage_peak_memory_bytes)


def test_profiled_overheads_and_optimizer_step_add_exactly():
    """A measured per-call overhead adds to every layer call (backward = 2 × forward when unmeasured), and a
    measured optimizer step adds once per iteration for the stage's parameters (the tied copy counted once)."""
    from gbmw.cost.estimate import estimate_plan
    from gbmw.cost.layer_cost import tp_local_parameters
    from gbmw.plan import plan_from_strategy_names
    from gbmw.specs.jobs import load_job
    from gbmw.specs.model_spec import ModelTimings

    job = load_job("gpt-tiny_cpu-x4")
    # TP only: its all-reduces block (no overlap with compute), so added compute adds exactly.
    plan = plan_from_strategy_names(job.model, 4, ["tp4"] * job.model.num_layers, [job.model.num_layers], 16, 1)
    flops_per_s = job.cluster.sustained_flops(job.precision)

    def profiled(overhead_s: float, per_parameter_s: float):
        layers = tuple(with_timings(layer, forward_time_per_sample_s=layer.forward_flops_per_sample / flops_per_s,
                                    forward_overhead_s=overhead_s) for layer in job.model.layers)
        model = job.model.model_copy(update={
            "layers": layers, "timings": ModelTimings(optimizer_step_s_per_parameter=per_parameter_s)})
        return job.model_copy(update={"model": model})

    base_per_parameter_s, overhead_s, per_parameter_s = 1e-12, 1e-3, 1e-9
    base = estimate_plan(profiled(0.0, base_per_parameter_s), plan).iteration_time_s
    tied_copy = job.model.layers[-1].tied_parameter_count / 4  # the head shares the embedding's slice
    stage_parameters = tp_local_parameters(job.model, 4).sum() - tied_copy
    expected = (base + job.model.num_layers * 3 * overhead_s
                + stage_parameters * (per_parameter_s - base_per_parameter_s))
    assert estimate_plan(profiled(overhead_s, per_parameter_s), plan).iteration_time_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("strategy, field", [("tp2", "tp2_time_s"), ("sdp2", "sdp2_time_s"), ("dp2+ckpt", "ckpt_time_s")])
def test_profiled_call_timings_add_what_compute_and_collectives_leave_out(strategy, field):
    """A layer profiled at batch b under TP 2 / FSDP2 over 2 / checkpointing is charged, per call, exactly
    what that timing shows beyond the compute and modelled collectives of the same call (and nothing when
    the timing is fully explained)."""
    from gbmw.cost.comm import CommModel
    from gbmw.cost.layer_cost import CostSettings, collective_time_s
    from gbmw.cost.layer_cost_batch import layer_costs
    from gbmw.specs.jobs import load_job

    job = load_job("gpt-tiny_cpu-x4")
    settings, comm = CostSettings(job.cluster, job.precision, job.optimizer), CommModel(job.cluster)
    batch, forward_s, backward_s, extra_s = 8, 1e-4, 2e-4, 3e-3
    forward_call_s, backward_call_s = 5e-5, 7e-5  # per-call intercepts: TP does not divide them
    parameter_bytes, gradient_bytes = settings.states.weights, settings.states.gradients
    layers = []
    for layer in job.model.layers:
        compute = (forward_s + backward_s) * batch + forward_call_s + backward_call_s
        explained = {
            "tp2_time_s": (forward_s + backward_s) * batch / 2 + forward_call_s + backward_call_s
            + 2 * collective_time_s(comm.allreduce_s, np.array([layer.tp_allreduce_bytes_per_sample * batch]), 2, 1)[0],
            "sdp2_time_s": compute + 2 * collective_time_s(comm.allgather_s, np.array([layer.parameter_count * parameter_bytes]), 2, 1)[0]
            + collective_time_s(comm.reduce_scatter_s, np.array([layer.parameter_count * gradient_bytes]), 2, 1)[0],
            "ckpt_time_s": compute + forward_s * batch + forward_call_s,
        }[field]
        layers.append(with_timings(layer, forward_time_per_sample_s=forward_s, backward_time_per_sample_s=backward_s,
                                   profiled_batch=batch, forward_overhead_s=forward_call_s,
                                   backward_overhead_s=backward_call_s, **{field: explained}))
    exact = job.model.model_copy(update={"layers": tuple(layers)})
    slower = exact.model_copy(update={"layers": tuple(with_timings(layer, **{field: getattr(layer.timings, field) + extra_s})
                                                      for layer in layers)})
    plain_model = exact.model_copy(update={"layers": tuple(with_timings(layer, **{field: None}) for layer in layers)})
    parsed = Strategy.parse(strategy)
    base = layer_costs(plain_model, parsed, batch * 2, settings, comm).time_no_grad_sync_s
    assert layer_costs(exact, parsed, batch * 2, settings, comm).time_no_grad_sync_s == pytest.approx(base, abs=1e-12)
    assert layer_costs(slower, parsed, batch * 2, settings, comm).time_no_grad_sync_s == pytest.approx(base + extra_s)


def test_a_checkpointed_tp_layer_repeats_its_forward_framework_cost():
    """tp2+ckpt recomputes the forward, so it pays the profiled TP forward's unexplained cost twice; tp2 and
    dp2+ckpt are unaffected by tp2_forward_time_s."""
    from gbmw.cost.comm import CommModel
    from gbmw.cost.layer_cost import CostSettings, collective_time_s
    from gbmw.cost.layer_cost_batch import layer_costs
    from gbmw.specs.jobs import load_job

    job = load_job("gpt-tiny_cpu-x4")
    settings, comm = CostSettings(job.cluster, job.precision, job.optimizer), CommModel(job.cluster)
    batch, forward_s, extra_s = 8, 1e-4, 2e-3
    layers = []
    for layer in job.model.layers:
        allreduce = collective_time_s(comm.allreduce_s, np.array([layer.tp_allreduce_bytes_per_sample * batch]), 2, 1)[0]
        layers.append(with_timings(
            layer, forward_time_per_sample_s=forward_s, backward_time_per_sample_s=2 * forward_s,
            forward_overhead_s=1e-5, backward_overhead_s=2e-5, profiled_batch=batch,
            tp2_time_s=0.05, tp2_forward_time_s=forward_s * batch / 2 + 1e-5 + allreduce + extra_s))
    profiled = job.model.model_copy(update={"layers": tuple(layers)})
    without = profiled.model_copy(update={"layers": tuple(with_timings(layer, tp2_forward_time_s=None)
                                                          for layer in layers)})

    def cost(model, name):
        return layer_costs(model, Strategy.parse(name), batch, settings, comm).time_no_grad_sync_s

    assert cost(profiled, "tp2+ckpt") == pytest.approx(cost(without, "tp2+ckpt") + extra_s)
    assert cost(profiled, "tp2") == pytest.approx(cost(without, "tp2"))
    assert cost(profiled, "dp2+ckpt") == pytest.approx(cost(without, "dp2+ckpt"))
