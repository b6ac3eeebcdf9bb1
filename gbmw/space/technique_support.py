"""Which techniques a stock or gbmw target runs beyond its layout — sequence parallelism (+sp), context and
Ulysses parallelism, expert parallelism, selective recomputation — and why it cannot run a plan's (the problems
gbmw.space.targets.Target.problems reports). `plan` is any plan-shaped object (gbmw.space.targets.PlanLayout)."""

from __future__ import annotations

from gbmw.space.sequence_split import sequence_split_problem
from gbmw.space.strategy import DATA_PARALLEL_AXES
from gbmw.specs.model_spec import ModelSpec


def technique_problems(target, plan, model: ModelSpec) -> list[str]:
    """Why `target` (a gbmw.space.targets.Target) cannot run `plan`'s sequence parallelism or selective recomputation (empty if it can)."""
    problems = []
    if not target.sequence_parallel and any(strategy.sp for strategy in plan.strategies):
        problems.append(f"sequence parallelism (+sp): {target.name} does not run it — use --target megatron-core "
                        "or megatron-deepspeed")
    indivisible = sorted({strategy.tp for strategy in plan.strategies
                          if strategy.sp and model.sequence_length % strategy.tp})
    if indivisible:
        problems.append(f"sequence parallelism (+sp) with TP {indivisible[0]}: the sequence of "
                        f"{model.sequence_length} tokens is sliced over the TP group, so TP must divide it — use a "
                        "sequence length TP divides, or no +sp there")
    for axis in sorted({strategy.sequence_axis for strategy in plan.strategies} - {None}):
        if axis not in target.sequence_axes:
            runs = {"cp": "megatron-core", "ulysses": "megatron-deepspeed"}[axis]
            problems.append(f"{'context parallelism (cp)' if axis == 'cp' else 'Ulysses (ulysses)'}: {target.name} "
                            f"does not run it — use --target {runs}")
        elif not target.sequence_split_with_sequence_parallel and any(
                strategy.sequence_axis == axis and strategy.sp for strategy in plan.strategies):
            problems.append(f"{axis} with +sp: {target.name} runs one or the other")
    for strategy, layer in zip(plan.strategies, model.layers):
        problem = sequence_split_problem(strategy, layer, model, target) if strategy.sequence_axis else None
        if problem:
            problems.append(f"layer {layer.name} ({strategy.name}): {problem}")
            break
    expert_degrees = sorted({strategy.ep for strategy in plan.strategies if strategy.ep > 1})
    if expert_degrees and not target.expert_parallel:
        problems.append(f"expert parallelism (+ep{expert_degrees[0]}): {target.name} does not split experts over "
                        "ranks — use --target megatron-core, megatron-deepspeed or runtime")
    elif target.expert_parallel_needs_sequence_parallel and any(
            strategy.ep > 1 and strategy.tp > 1 and not strategy.sp for strategy in plan.strategies):
        problems.append(f"expert parallelism with TP but no sequence parallelism: {target.name} needs +sp there")
    expert_tp = next((strategy for strategy in plan.strategies if strategy.expert_tp is not None), None)
    if expert_tp is not None and target.expert_parallel and not target.expert_tensor_parallel:
        problems.append(f"experts at TP {expert_tp.expert_tp} beside the layers' TP {expert_tp.tp} (+etp"
                        f"{expert_tp.expert_tp}): {target.name} runs the experts at the layer's TP degree — use --target "
                        "megatron-core")
    sharded = sorted({axis for strategy in plan.strategies if strategy.ep > 1 for axis, _ in strategy.dims
                      if axis in DATA_PARALLEL_AXES and axis not in target.expert_parallel_axes})
    if expert_degrees and target.expert_parallel and sharded:
        problems.append(f"expert parallelism with {sharded[0]}: {target.name} composes EP with "
                        f"{' or '.join(target.expert_parallel_axes)} only")
    if any(strategy.selective for strategy in plan.strategies):
        if target.selective_recompute is None:
            problems.append(f"selective recomputation (+sel): {target.name} does not run it — use --target "
                            "megatron-core")
        elif not all(target.runs_recompute_of(strategy, model) for strategy in plan.strategies):
            problems.append(f"selective recomputation (+sel) with flash attention: {target.name} recomputes only "
                            "its unfused attention core — use --target megatron-core, or full recomputation")
    return problems
