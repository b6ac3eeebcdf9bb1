"""The planner against an independent brute force over whole plans of the UNIFORM spaces — the stock targets and the
fixed baselines (tests/uniform_plan_oracle.py, issue 13).

Random tiny jobs — 2, 4 or 8 devices, 4–8 layers, tied and untied embeddings, encoder–decoder side inputs, uneven
layers, heads TP cannot always divide, fixed batches and batch sweeps up to 32, budgets from tight to loose and on a
plan's exact peak — in each uniform space. The exact mode must give the brute force's samples/s, or nothing fits for
both; the default mode must return a plan of the space that fits and is never faster, and nothing when nothing fits.
benchmarks/search_vs_brute_force.py --uniform runs the same comparison on seeded cases and prints a diagnosis per
disagreement.
"""

import itertools
import math

import numpy as np
import pytest
from conftest import make_cluster, make_job
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from uniform_plan_oracle import (UNIFORM_SPACES, UniformCase, UniformPlanOracle, check_uniform_planner,
                                 describe_uniform_plan, planner_arguments, random_uniform_case, space_layouts,
                                 space_pipeline_degrees)
from whole_plan_oracle import AGREE, MISSED, SLOWER, Choices, TinyJob, random_tiny_job

from gbmw.space.spaces import search_space
from gbmw.space.targets import get_target
from gbmw.specs.architectures import GPTArchitecture
from gbmw.specs.models import build_model

pytestmark = pytest.mark.unit

# No shrinking: each example runs a brute force, and the failing example's draws (printed) are enough to rebuild it.
CASES = dict(deadline=None, derandomize=True, database=None, phases=(Phase.explicit, Phase.generate),
             suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large))


def _tiny_gpt(layers: int = 6, heads: int = 4, attention: str = "standard", hidden: int = 48, sequence: int = 8,
              vocab: int = 64):
    arch = GPTArchitecture(name="gpt-tiny", family="gpt", num_layers=layers - 2, seq_length=sequence,
                           hidden_size=hidden, num_heads=heads, vocab_size=vocab, dropout=False, attention=attention,
                           tie_embeddings=False)
    return build_model(arch, "bf16")


def _planner_layouts(space_name: str, job, pp: int) -> set:
    """(block strategy, other layers' strategy) of every group gbmw.space.spaces gives the search at `pp`."""
    arguments = planner_arguments(space_name)
    space = search_space(arguments.get("variant", "gbmw"), arguments.get("target", "runtime"))
    target = get_target(space.target)
    model = job.model
    strategies = [s for s in space.strategies(job.cluster, pp) if target.runs_recompute_of(s, model)]
    block, other = int(np.argmax(model.is_block)), int(np.argmin(model.is_block))
    layouts = set()
    for mask in space.groups(strategies, model):
        assert (mask.sum(axis=0) == 1).all()  # one strategy per layer: the search needs no stage DP
        layouts.add((strategies[int(mask[:, block].argmax())], strategies[int(mask[:, other].argmax())]))
    return layouts


@pytest.mark.parametrize("space_name", UNIFORM_SPACES)
@pytest.mark.parametrize("devices, per_node", [(2, 2), (4, 4), (4, 1), (8, 8), (8, 4), (8, 2)])
@pytest.mark.parametrize("attention", ["standard", "flash"])
def test_oracle_enumerates_the_spaces_layouts(space_name, devices, per_node, attention):
    """The oracle's hand-written pipeline degrees and layouts are gbmw.space.spaces' (targets and baselines)."""
    job = make_job(_tiny_gpt(layers=10, attention=attention), make_cluster(nodes=devices // per_node,
                                                                            devices_per_node=per_node))
    arguments = planner_arguments(space_name)
    space = search_space(arguments.get("variant", "gbmw"), arguments.get("target", "runtime"))
    degrees = [pp for pp in space.pipeline_degrees(job.cluster, None) if pp <= job.model.num_layers]
    assert space_pipeline_degrees(space_name, job) == degrees
    for pp in degrees:
        found = [(layout.block, layout.other) for layout in space_layouts(space_name, job, pp)]
        assert len(set(found)) == len(found)
        assert set(found) == _planner_layouts(space_name, job, pp), (space_name, pp)


def test_oracle_counts_megatron_cores_layouts():
    # 8 devices, pp = 1: tp8, dp8, z1dp8, tp2-dp4, tp4-dp2, tp2-z1dp4, tp4-z1dp2 (7 trees, 5 with TP), and with
    # context parallelism cp8, tp2-cp4, tp4-cp2, cp2-dp4, cp4-dp2, cp2-z1dp4, cp4-z1dp2, tp2-cp2-dp2, tp2-cp2-z1dp2
    # (9 trees, 4 with TP); those with TP also with +sp; each with no, full and selective recomputation
    job = make_job(_tiny_gpt(heads=8), make_cluster(nodes=1, devices_per_node=8))
    assert len(space_layouts("megatron-core", job, 1)) == (7 + 5 + 9 + 4) * 3


@settings(max_examples=160, **CASES)
@given(st.data())
def test_exact_search_equals_brute_force_in_uniform_spaces(data):
    case = random_uniform_case(Choices(data.draw))
    verdict = check_uniform_planner(case, exact=True)
    oracle = "nothing fits" if verdict.oracle is None else describe_uniform_plan(verdict.oracle.plan)
    planner = "nothing fits" if verdict.plan is None else describe_uniform_plan(verdict.plan)
    assert verdict.kind == AGREE, f"{verdict.kind}: {case.summary}\nbrute force: {oracle}\nplanner: {planner}"


@settings(max_examples=60, **CASES)
@given(st.data())
def test_default_search_in_uniform_spaces_fits_and_is_never_faster(data):
    """The default mode's guarantee: a plan of the space that fits, no faster than the brute force's (in a batch
    sweep it skips the interleaved pipeline's m = pp and GPipe's largest count, so it may be slower); nothing where
    nothing fits."""
    case = random_uniform_case(Choices(data.draw))
    verdict = check_uniform_planner(case, exact=False)
    assert verdict.kind in (AGREE, SLOWER, MISSED), f"{verdict.kind}: {case.summary}"


def _interleaving_case_job():
    """8 devices, a GPT of 8 blocks, a batch sweep up to 12: at pp = 2 and b = 4 the largest count, 3, is no
    multiple of pp, and m = 2 interleaves (v = 2 or 4) with the stash of plain 1F1B."""
    model = _tiny_gpt(layers=10, heads=3, hidden=768, sequence=128, vocab=8192)
    job = make_job(model, make_cluster(nodes=1, devices_per_node=8), precision="bf16")
    return job.model_copy(update={"global_batch": None, "max_global_batch": 12})


def test_exact_search_finds_the_interleaved_pipeline_at_m_equal_to_pp():
    """On every boundary budget of this job the exact mode gives the brute force's answer; on some the brute force's
    plan is interleaved with m = pp, which the default mode's sweep (m < pp and the largest) does not try: the
    disagreement the uniform oracle found (×0.88 at its worst)."""
    job = _interleaving_case_job()
    oracle = UniformPlanOracle(job, "megatron-core")
    tiny = TinyJob(job, "gpt, 8 blocks, 8 devices, sweep ≤ 12")
    interleaved_at_pp = 0
    for peak in oracle.peaks():
        for budget in (math.ceil(peak), math.ceil(peak) - 1):
            case = UniformCase(tiny, "megatron-core", budget, "boundary", oracle)
            verdict = check_uniform_planner(case, exact=True)
            assert verdict.kind == AGREE, f"{verdict.kind}: budget {budget} B"
            best = verdict.oracle.plan if verdict.oracle is not None else None
            interleaved_at_pp += best is not None and best.virtual_stages > 1 and best.num_micro_batches == best.pp
    assert interleaved_at_pp > 0


def test_exact_search_interleaves_the_accounted_split():
    """A GPT of 6 blocks on 8 devices: on 4 stages no even split exists, but 6 blocks + the embedding + the loss = 8
    layers make megatron-core's accounted split [1, 2, 2, 1] blocks, in v = 2 chunks of one layer. On every boundary
    budget the exact mode gives the brute force's answer, and somewhere the brute force's best plan is that
    interleaved pipeline (the planner must offer it)."""
    from gbmw.space.stock_partitions import blocks_per_stage

    model = _tiny_gpt(layers=8, heads=3, hidden=768, sequence=128, vocab=8192)
    job = make_job(model, make_cluster(nodes=1, devices_per_node=8), precision="bf16")
    job = job.model_copy(update={"global_batch": None, "max_global_batch": 16})
    oracle = UniformPlanOracle(job, "megatron-core")
    tiny = TinyJob(job, "gpt, 6 blocks, 8 devices, sweep ≤ 16")
    accounted = 0
    for peak in oracle.peaks():
        for budget in (math.ceil(peak), math.ceil(peak) - 1):
            verdict = check_uniform_planner(UniformCase(tiny, "megatron-core", budget, "boundary", oracle), exact=True)
            assert verdict.kind == AGREE, f"{verdict.kind}: budget {budget} B"
            best = verdict.oracle.plan if verdict.oracle is not None else None
            accounted += best is not None and best.virtual_stages > 1 and blocks_per_stage(
                job.model, best.partition) == [1, 2, 2, 1]
    assert accounted > 0


@pytest.mark.parametrize("space_name, seed", list(itertools.product(UNIFORM_SPACES, range(2))))
def test_exact_search_on_every_boundary_budget_in_uniform_spaces(space_name, seed):
    """On every budget where the brute-force answer changes — each frontier plan's exact peak, and one byte under
    it — the exact mode gives the brute force's samples/s (or nothing, where nothing fits)."""
    import random

    choose = Choices(random.Random(2000 + seed))
    tiny = random_tiny_job(choose, "1f1b+bi-obj", 4000)
    job = tiny.job.model_copy(update={"global_batch": 16})  # data parallelism over 8 devices, m ≥ pp
    tiny = TinyJob(job, tiny.summary + " (batch 16)")
    oracle = UniformPlanOracle(job, space_name)
    for peak in oracle.peaks():
        for budget in (math.ceil(peak), math.ceil(peak) - 1):
            verdict = check_uniform_planner(UniformCase(tiny, space_name, budget, "boundary", oracle), exact=True)
            assert verdict.kind == AGREE, f"{verdict.kind}: {tiny.summary}, budget {budget} B"


@pytest.mark.parametrize("seed", [596, 679])
def test_exact_gpipe_sweep_tries_the_largest_micro_batch_count(seed):
    """GPipe's sweep tries every power of two m; the exact mode tries the largest count (24 here) too: the cases of
    benchmarks/search_vs_brute_force.py --uniform where it was slower (×0.984, ×0.994) before it did."""
    import random

    case = random_uniform_case(random.Random(seed))
    verdict = check_uniform_planner(case, exact=True)
    assert case.space == "gpipe" and case.tiny.job.max_global_batch == 24, case.summary
    assert verdict.kind == AGREE and verdict.plan.num_micro_batches * verdict.plan.micro_batch == 24, case.summary
