"""A whole plan's estimate: per-stage time and peak memory (gbmw.cost.stage_cost), the iteration time (Eq. (9) as
gbmw.cost.pipeline_schedules states it), samples/s, model TFLOP/s per device and MFU, and whether every stage fits
the memory budget."""

from __future__ import annotations

from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.pipeline_schedules import pipeline_time_s
from gbmw.cost.stage_cost import StageCosts, StageEstimate, stage_estimate, strategy_tables
from gbmw.errors import PlanError
from gbmw.plan import Estimate, Plan
from gbmw.space.launch_settings import adam_moments_layout_problem
from gbmw.space.targets import get_target
from gbmw.specs.jobs import JobSpec
from gbmw.specs.models import model_as_run


def plan_stage_estimates(job: JobSpec, plan: Plan, fused_elementwise: bool = False,
                         attention_as_declared: bool = False) -> list[StageEstimate]:
    """Every stage of `plan` costed by the stage model the search uses, over the plan's own strategies
    (`fused_elementwise`: gbmw.cost.layer_cost.CostSettings.fused_elementwise; `attention_as_declared`: the model's
    own attention even where the target fuses it, as gbmw.search.planner.Planner.attention_as_declared searches)."""
    plan.check_against(job.model, job.cluster.num_devices)
    comm = CommModel(job.cluster)
    strategies = list(dict.fromkeys(plan.strategies))
    target = get_target(plan.target)
    target.check_precision(job.precision, plan.gradient_reduce_dtype, plan.tp_comm_overlap, plan.adam_moments_dtype)
    layout_problem = adam_moments_layout_problem(strategies, plan.adam_moments_dtype)
    if layout_problem:
        raise PlanError(f"{target.name} cannot run this plan: {layout_problem}")
    settings = CostSettings(job.cluster, job.precision, job.optimizer, target.framework, plan.fp8_recipe,
                            gradient_reduce_dtype=plan.gradient_reduce_dtype, adam_moments_dtype=plan.adam_moments_dtype,
                            tp_comm_overlap=plan.tp_comm_overlap, fused_elementwise=fused_elementwise)
    model = model_as_run(job.model, target.fused_attention and not attention_as_declared)
    tables = strategy_tables(model, strategies, plan.micro_batch, settings, comm)
    costs = StageCosts(model, tables, plan.pp, plan.num_micro_batches, plan.schedule, comm,
                       virtual_stages=plan.virtual_stages, scatter_gather=target.pipeline_scatter_gather,
                       blocking_p2p=target.pipeline_blocking_p2p)
    index = {strategy: position for position, strategy in enumerate(strategies)}
    return [stage_estimate(costs, stage, first, [index[strategy] for strategy in plan.stage_strategies(stage)])
            for stage, (first, _) in enumerate(plan.stage_bounds)]


def estimate_plan(job: JobSpec, plan: Plan, memory_budget_bytes: float | None = None,
                  fused_elementwise: bool = False, attention_as_declared: bool = False) -> Estimate:
    """Iteration time (Eq. (9)), throughput, per-stage time and peak memory of `plan` for `job`
    (`fused_elementwise`, `attention_as_declared`: as plan_stage_estimates)."""
    stages = plan_stage_estimates(job, plan, fused_elementwise, attention_as_declared)
    iteration_s = pipeline_time_s(stages, plan.num_micro_batches, plan.virtual_stages)
    if iteration_s <= 0:
        raise PlanError(
            f"model {job.model.name}: the estimated iteration time is 0 — its layers have no FLOPs, measured "
            "times or communication; check forward_flops_per_sample in the model spec"
        )
    budget = float(memory_budget_bytes if memory_budget_bytes is not None else job.memory_budget_bytes)
    model_flops = 3.0 * job.model.forward_flops_per_sample * plan.global_batch
    tflops_per_device = model_flops / iteration_s / plan.num_devices / 1e12
    return Estimate(
        iteration_time_s=iteration_s,
        samples_per_s=plan.global_batch / iteration_s,
        stage_time_s=tuple(stage.time_s for stage in stages),
        stage_peak_memory_bytes=tuple(stage.peak_memory_bytes for stage in stages),
        stage_model_state_bytes=tuple(stage.model_state_bytes for stage in stages),
        stage_activation_bytes=tuple(stage.activation_bytes for stage in stages),
        memory_budget_bytes=budget,
        fits=all(stage.peak_memory_bytes <= budget for stage in stages),
        model_tflops_per_device=tflops_per_device,
        mfu=tflops_per_device * 1e12 / job.cluster.peak_flops(job.precision),
    )
