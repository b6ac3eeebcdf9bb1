"""gbmw.cost.layer_cost_batch: the tables of many strategies at once are `layer_costs`' own, bit for bit, on every
kind of model, search space, target, precision and FP8 recipe the searches cost."""

import numpy as np
import pytest
from conftest import with_timings

from layer_cost_reference import reference_layer_costs as layer_costs
from gbmw.cost.layer_cost_batch import layer_costs_of_strategies
from gbmw.cost.stage_cost import strategy_tables
from gbmw.search.planner import Planner
from gbmw.space.strategy import Strategy
from gbmw.specs.jobs import load_job
from gbmw.specs.models import build_model

pytestmark = pytest.mark.unit

FIELDS = ("time_s", "time_no_grad_sync_s", "forward_memory_bytes", "backward_memory_bytes", "model_state_bytes",
          "optimizer_parameters")

CASES = [  # (job, variant, target, a change to the job: precision and FP8 recipe, or measured layer timings)
    ("gpt3-65b_h100-80g-x64", "gbmw", "runtime", None),  # GPT, bf16 under autocast, ZeRO-1/2 in the space
    ("gpt3-65b_h100-80g-x64", "gbmw", "megatron-core", ("fp8", "current")),  # FP8 casts and amax all-reduces
    ("gpt3-65b_h100-80g-x64", "bmw", "megatron-core", ("fp8", "delayed")),
    ("llama-7b_a100-80g-x8", "gbmw", "deepspeed", None),  # LLaMA, the stock DeepSpeed target
    ("llama-7b_a100-80g-x8", "fsdp", "runtime", None),  # a baseline: SDP only
    ("llama3.1-8b-32k_h100-80g-x64", "gbmw+cp", "runtime", None),  # ring context parallelism
    ("llama3.1-8b-32k_h100-80g-x64", "gbmw+ulysses", "runtime", None),  # Ulysses
    ("mixtral-8x7b_h100-80g-x64", "gbmw", "runtime", None),  # MoE: expert parallelism, expert-data-parallel sync
    # MoE with shared experts, latent attention; megatron-core's space offers the experts whole (+etp1) too
    ("deepseek-v2-lite_h100-80g-x64", "gbmw", "megatron-core", None),
    ("mixtral-8x7b_h100-80g-x64", "gbmw", "megatron-core", ("fp8", "current")),  # +etp1 with FP8 expert weights
    ("t5-512-4-32_rtx-titan-x8", "gbmw", "runtime", None),  # T5
    ("bert-huge-32_rtx-titan-x8", "gbmw", "runtime", None),  # BERT
    ("bert-huge-32_rtx-titan-x8", "gbmw", "runtime", "profiled"),  # measured times and framework overheads
    ("bert-huge-32_rtx-titan-x8", "deepspeed-3d", "runtime", None),
    ("swin-huge-32_rtx-titan-x8", "galvatron", "runtime", None),
    ("gpt-tiny_cpu-x4", "gbmw", "runtime", ("fp32", "delayed")),  # fp32, a CPU without a multiprocessor count
]


def _profiled(model):
    """`model` with timings as `gbmw profile model` gives them: every other block measured in full (backward, TP-2,
    SDP-2 and checkpointed calls whose framework overheads are positive), the others forward only, the embedding
    and the head not at all; a layer list as a profile gives it, without the architecture it would be rebuilt from."""
    layers = list(model.layers)
    for index in range(1, len(layers) - 1):
        forward_s = layers[index].forward_flops_per_sample / 4e12
        full = dict(backward_time_per_sample_s=2.5 * forward_s, backward_overhead_s=2e-4, profiled_batch=4,
                    tp2_time_s=4 * 4 * forward_s, tp2_forward_time_s=4 * 1.5 * forward_s, sdp2_time_s=4 * 5 * forward_s,
                    ckpt_time_s=4 * 6 * forward_s)
        layers[index] = with_timings(layers[index], forward_time_per_sample_s=forward_s, forward_overhead_s=1e-4,
                                     **(full if index % 2 else {}))
    return model.model_copy(update={"layers": tuple(layers), "architecture": None})


def _search_inputs(name, variant, target, change):
    """The model, settings, collectives and strategies a search of the case costs (the first and the last pipeline
    degree: the most and the fewest devices per stage)."""
    job = load_job(name)
    if change == "profiled":
        job = job.model_copy(update={"model": _profiled(job.model)})
    elif change is not None:
        job = job.model_copy(update={"precision": change[0], "fp8_recipe": change[1],
                                     "model": build_model(job.model.architecture, change[0])})
    planner = Planner(job, variant=variant, target=target, explain_failure=False)
    model, cluster = planner.job.model, planner.job.cluster
    degrees = [pp for pp in planner.spec.pipeline_degrees(cluster, None) if pp <= model.num_layers]
    strategies = {}
    for pp in (degrees[0], degrees[-1]):
        for strategy in planner.spec.strategies(cluster, pp, experts=model.is_mixture_of_experts):
            strategies[strategy] = None
    return model, planner.settings, planner.comm, list(strategies)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name, variant, target, change", CASES)
def test_batched_costs_are_layer_costs_bit_for_bit(name, variant, target, change):
    model, settings, comm, strategies = _search_inputs(name, variant, target, change)
    assert strategies
    for micro_batch in (1, 3, 8):
        batched = layer_costs_of_strategies(model, strategies, micro_batch, settings, comm)
        assert len(batched) == len(strategies)
        for strategy, costs in zip(strategies, batched):
            reference = layer_costs(model, strategy, micro_batch, settings, comm)
            assert costs.samples_per_device == reference.samples_per_device, strategy.name
            for field in FIELDS:
                assert _same_bits(getattr(costs, field), getattr(reference, field)), (strategy.name, micro_batch, field)


def test_the_cases_cover_every_branch_of_layer_costs():
    """The cases above reach every kind of term: without this, a case list that lost e.g. its MoE job would still
    pass."""
    seen = set()
    for case in CASES:
        model, settings, _, strategies = _search_inputs(*case)
        seen |= {("precision", settings.precision), ("framework", settings.framework),
                 ("recipe", settings.fp8_recipe if settings.precision == "fp8" else None),
                 ("experts", model.is_mixture_of_experts), ("profiled", bool(model.arrays.has_measured_time.any())),
                 ("waves", settings.cluster.device.multiprocessors is not None)}
        for strategy in strategies:
            seen |= {("axis", axis) for axis, _ in strategy.gradient_view.dims}
            seen |= {("ep", strategy.ep > 1), ("sp", strategy.sp), ("recompute", strategy.recompute),
                     ("sequence", strategy.sequence_axis), ("expert_tp", strategy.expert_tp is not None)}
    wanted = ({("precision", p) for p in ("fp32", "bf16", "fp8")} | {("recipe", r) for r in ("delayed", "current")}
              | {("framework", f) for f in ("gbmw-runtime", "megatron", "deepspeed")}
              | {("experts", True), ("profiled", True), ("profiled", False), ("waves", True), ("waves", False)}
              | {("axis", a) for a in ("dp", "z1dp", "z2dp", "sdp", "tp")} | {("ep", True), ("sp", True)}
              | {("expert_tp", True)}
              | {("recompute", r) for r in ("none", "full", "selective")}
              | {("sequence", s) for s in (None, "cp", "ulysses")})
    assert wanted <= seen, wanted - seen


@pytest.mark.parametrize("precision", [None, ("fp8", "current")])
def test_expert_tp_degrees_no_search_offers_are_layer_costs_bit_for_bit(precision):
    """The searches offer +etp1 only; an ETP between 1 and TP (its own all-reduce group) and mixed data-parallel
    flavours, costed in one list with the layer's-TP strategies of the same trees."""
    model, settings, comm, _ = _search_inputs("mixtral-8x7b_h100-80g-x64", "gbmw", "megatron-core", precision)
    names = ("tp4-z1dp4+ep2+etp2+sp", "tp4-z1dp4+ep2+sp", "tp8-dp2+ep4+etp2+sp+ckpt", "tp8-dp2+ep2+sp+ckpt",
             "tp2-z1dp8+ep8+etp1+sp+sel", "tp4-sdp4+ep8+etp1+sp", "tp16+ep8+etp2+sp", "tp4-z2dp4+ep4+etp1+sp")
    strategies = [Strategy.parse(name) for name in names]
    for micro_batch in (1, 4):
        for strategy, costs in zip(strategies, layer_costs_of_strategies(model, strategies, micro_batch, settings,
                                                                         comm)):
            reference = layer_costs(model, strategy, micro_batch, settings, comm)
            for field in FIELDS:
                assert _same_bits(getattr(costs, field), getattr(reference, field)), (strategy.name, field)


def test_repeated_and_reordered_strategies_get_their_own_rows():
    model, settings, comm, strategies = _search_inputs("mixtral-8x7b_h100-80g-x64", "gbmw", "runtime", None)
    strategies = [s for s in strategies if s.group_size == strategies[0].group_size]  # one stage's
    picked = [strategies[-1], strategies[0], strategies[-1], strategies[len(strategies) // 2]]
    tables = strategy_tables(model, picked, 4, settings, comm)
    for row, strategy in enumerate(picked):
        reference = layer_costs(model, strategy, 4, settings, comm)
        for field in FIELDS:
            assert _same_bits(getattr(tables, field)[row], getattr(reference, field)), (strategy.name, field)
    assert layer_costs_of_strategies(model, [], 4, settings, comm) == []
