"""Transformer Engine's TP communication overlap (megatron-core's `--tp-comm-overlap`, NeMo's `ub_tp_comm_overlap`):
a +sp layer's TP collectives priced beside its GEMMs by the cluster's overlap rule (gbmw.cost.tp_comm_overlap), the
job field's refusals, YAML round trip and Megatron round trip."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gbmw
from gbmw.adapters.megatron import megatron_args_to_plan, plan_to_megatron_args
from gbmw.cost.comm import CommModel
from gbmw.cost.estimate import estimate_plan
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.layer_cost_batch import layer_costs_of_strategies
from gbmw.cost.tp_comm_overlap import exposed_tp_communication_s
from gbmw.errors import GbmwError, PlanError
from gbmw.plan import Plan
from gbmw.space.strategy import Strategy

OVERLAP_JOB = "model: gpt3-15b\ncluster: h100-80g-x64\nprecision: bf16\ntp_comm_overlap: true\nglobal_batch: 512\n"


def _job(tmp_path, text=OVERLAP_JOB, name="gpt3-15b-tpoverlap_h100-80g-x64"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return gbmw.load_job(path)


def _block_times(job, strategy: str, slowdown: float, overlap: bool) -> np.ndarray:
    """time_no_grad_sync_s of the model's blocks under `strategy` (megatron-core's framework, micro-batch 4)."""
    cluster = job.cluster.model_copy(update={"overlap_slowdown": slowdown})
    settings = CostSettings(cluster, "bf16", "adam", "megatron", tp_comm_overlap=overlap)
    costs = layer_costs_of_strategies(job.model, [Strategy.parse(strategy)], 4, settings, CommModel(cluster))[0]
    return costs.time_no_grad_sync_s[np.asarray(job.model.is_block)]


def test_the_exposed_part_follows_the_overlap_rule():
    compute, communication = np.array([4.0, 1.0]), np.array([1.0, 4.0])
    # shorter than the compute: (f − 1)·g; longer: what exceeds the compute, plus (f − 1)·c
    assert exposed_tp_communication_s(compute, communication, 1.3) == pytest.approx([0.3, 3.3])
    assert exposed_tp_communication_s(compute, communication, 1.0) == pytest.approx([0.0, 3.0])


def test_an_sp_layer_pays_its_tp_collectives_at_the_overlap_factor_forward_and_backward(tmp_path):
    job = _job(tmp_path)
    off = _block_times(job, "tp4+sp", 1.3, overlap=False)
    hidden = off - _block_times(job, "tp4+sp", 1.0, overlap=True)  # f = 1: the collectives vanish under the GEMMs
    assert np.all(hidden > 0)
    # at f = 1.3 each of the two passes keeps 0.3 of its collectives: 0.7 of what f = 1 hides (catches the overlap
    # applied to one pass only, or a factor other than the cluster's)
    assert off - _block_times(job, "tp4+sp", 1.3, overlap=True) == pytest.approx(0.7 * hidden, rel=1e-9)


@pytest.mark.parametrize("strategy", ["tp4", "dp4", "tp4+sp+ckpt"])
def test_layers_without_sp_are_unchanged_and_a_recomputed_one_hides_its_recomputation_too(tmp_path, strategy):
    job = _job(tmp_path)
    off, on = _block_times(job, strategy, 1.3, False), _block_times(job, strategy, 1.3, True)
    if "+sp" not in strategy:  # Megatron overlaps only with sequence parallelism (it asserts it)
        assert np.array_equal(off, on)
    else:  # forward, the recomputed forward and backward each keep 0.3 of their collectives
        hidden = off - _block_times(job, strategy, 1.0, True)
        assert np.all(hidden > 0) and off - on == pytest.approx(0.7 * hidden, rel=1e-9)


@pytest.mark.parametrize("target", ["runtime", "deepspeed", "megatron-deepspeed"])
def test_targets_without_transformer_engine_overlap_refuse_in_one_line(tmp_path, target):
    with pytest.raises(GbmwError, match=f"^tp_comm_overlap: --target {target} does not run Transformer Engine's TP "
                                        "communication overlap .*; plan it for --target megatron-core, or drop the "
                                        "job's tp_comm_overlap$"):
        gbmw.Planner(_job(tmp_path), target=target, explain_failure=False).run()


def test_a_megatron_core_plan_is_faster_with_the_overlap_and_its_yaml_takes_only_a_flag(tmp_path):
    """(Written only when true and checked against the job: tests/test_plan_launch_settings.py.)"""
    job = _job(tmp_path)
    plan = gbmw.uniform_plan(job, "tp=4,pp=2,zero=1,sp=on,micro=1,target=megatron-core")
    assert plan.tp_comm_overlap
    plain_job = job.model_copy(update={"tp_comm_overlap": False})
    plain = gbmw.uniform_plan(plain_job, "tp=4,pp=2,zero=1,sp=on,micro=1,target=megatron-core")
    assert estimate_plan(job, plan).iteration_time_s < estimate_plan(plain_job, plain).iteration_time_s
    with pytest.raises(PlanError, match="field `tp_comm_overlap`: value 'yes' — must be true or false"):
        Plan.from_yaml(plan.to_yaml().replace("tp_comm_overlap: true", "tp_comm_overlap: 'yes'"))


def test_megatron_emits_tp_comm_overlap_with_sequence_parallelism_and_reads_it_back(tmp_path):
    job = _job(tmp_path)
    plan = gbmw.uniform_plan(job, "tp=4,pp=2,zero=1,sp=on,micro=1,target=megatron-core")
    args = plan_to_megatron_args(plan, job, "megatron-core")
    assert args.count("--tp-comm-overlap") == 1 and args.count("--sequence-parallel") == 1
    assert megatron_args_to_plan(args, job, "megatron-core") == dataclasses.replace(plan, estimate=None)
    without = [arg for arg in args if arg != "--tp-comm-overlap"]
    with pytest.raises(GbmwError, match="^Megatron arguments do not give --tp-comm-overlap but job "
                                        "gpt3-15b-tpoverlap_h100-80g-x64 has tp_comm_overlap true$"):
        megatron_args_to_plan(without, job, "megatron-core")
    no_sp = [arg for arg in args if arg != "--sequence-parallel"]
    with pytest.raises(GbmwError, match="^Megatron arguments: --tp-comm-overlap without --sequence-parallel"):
        megatron_args_to_plan(no_sp, job, "megatron-core")
    # a plan without sequence parallelism has nothing to overlap, and Megatron would refuse the flag without it
    no_sp_plan = gbmw.uniform_plan(job, "tp=4,pp=2,zero=1,sp=off,micro=1,target=megatron-core")
    assert "--tp-comm-overlap" not in plan_to_megatron_args(no_sp_plan, job, "megatron-core")
