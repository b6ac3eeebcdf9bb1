"""What will run a plan, defined once per target: the search's strategy filter, the expressibility check, the pipeline
partitions and the emitters' mappings (ZeRO stage ↔ data-parallel axis, partition method names) all derive from these
definitions (DESIGN.md, "Target"); where a sequence axis can split a layer is gbmw.space.sequence_split.

* `runtime` — gbmw's own hybrid runtime: any strategy per layer, any partition; Ulysses and CP (neither with +sp).
* `deepspeed` — ZeRO and DeepSpeed's pipeline engine: one layout for the whole model, no TP, one ZeRO stage
  (≤ 1 with a pipeline), the PipelineModule's `uniform` or `parameters` partitions.
* `megatron-deepspeed` — Megatron TP (innermost, consecutive ranks) inside DeepSpeed ZeRO (≤ 1 with a pipeline);
  GPTModelPipe's `type:transformer` partition (Megatron's even split of blocks); DeepSpeed-Ulysses.
* `megatron-core` — uniform TP and PP, plain DP or the distributed optimizer (ZeRO-1), an even split or uneven first
  and last stages (`--decoder-first/last-pipeline-num-layers`), interleaved 1F1B on an even split (every number of
  equal chunks per stage: `--num-layers-per-virtual-pipeline-stage`), context parallelism.

Stock frameworks recompute all Transformer blocks or none (never embeddings or heads) and run 1F1B. The
Megatron targets also run sequence parallelism (every layer with TP) and selective recomputation of the attention
core (Megatron-DeepSpeed only where attention is not flash). gbmw's runtime runs sequence parallelism per layer, in
Transformer blocks (not embeddings or heads: `sequence_parallel_blocks_only`), and selective recomputation of any
block (gbmw.adapters.runtime.attention_core_recompute) — but its search does not offer +sel (`search_offers_selective`).
The runtime's attention is fused (`fused_attention`): it keeps no s×s scores, so recomputing the core frees only the
fp32 log-sum-exp of each row, 4·a bytes a token (GPT-3 175B: 0.09 % of a block's stash), at s·d_head FLOPs per byte
freed against (24·h² + 4·s·h) / (32·h) for +ckpt (262 144 against 9 472 for GPT-3 175B at s = 2048): +sel could win
only within a few bytes a token of the budget's edge, on the estimate's noise, while a third recomputation level would
make every layer's strategy list half as long again. Plans that carry +sel (a Megatron target's, `--uniform
ckpt=selective`) still run, priced as the runtime runs them (gbmw.cost.activation_recompute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from gbmw.errors import GbmwError, PlanError
from gbmw.space.launch_settings import launch_settings_refusal
from gbmw.space.sequence_split import sequence_split_problem
from gbmw.space.stock_partitions import (PARTITION_RULES, RULE_DESCRIPTIONS, accounted_blocks_per_stage,
                                         is_first_last_split, interleaved_split)
from gbmw.space.strategy import DATA_PARALLEL_AXES, Strategy
from gbmw.space.technique_support import technique_problems
from gbmw.specs.files import shown
from gbmw.specs.model_spec import ModelSpec


class PlanLayout(Protocol):
    """What a target's checks read of a plan (gbmw.plan.Plan has it): the space sits below the Plan contract, so a
    target judges any plan-shaped object and never imports the contract."""

    strategies: tuple[Strategy, ...]
    partition: tuple[int, ...]
    pp: int
    num_micro_batches: int
    virtual_stages: int
    schedule: str

ZERO_STAGE_OF_AXIS = {"dp": 0, "z1dp": 1, "z2dp": 2, "sdp": 3}
"""The data-parallel axis of a strategy as a ZeRO stage: DDP, ZeRO-1 (Megatron's distributed optimizer),
ZeRO-2, ZeRO-3 (sharded data parallel)."""
AXIS_OF_ZERO_STAGE = {stage: axis for axis, stage in ZERO_STAGE_OF_AXIS.items()}


@dataclass(frozen=True)
class Target:
    name: str
    label: str
    """How plans and comparisons name the target's search space."""
    framework: str
    """What runs the plan, for what it keeps per parameter (gbmw.cost.model_states)."""
    axes: tuple[str, ...]
    """The axes its layouts may use, in the order the search enumerates them (of equally fast plans, the
    first found wins, so the order is part of the definition)."""
    per_layer: bool = False
    """Each layer may take its own strategy (gbmw's runtime); a stock framework configures one layout."""
    pipeline_max_zero_stage: int | None = None
    """The highest ZeRO stage its pipeline engine accepts when pp > 1 (DeepSpeed's: 1); None: any."""
    partition_methods: tuple[tuple[str, str], ...] = ()
    """(the framework's name for a pipeline partition method, the gbmw.space.stock_partitions rule it follows)."""
    pipeline_scatter_gather: bool = False
    """Its pipeline sends 1/t of an activation from each TP rank and all-gathers it on the receiving stage
    (Megatron's scatter-gather; DeepSpeed's `pipe_partitioned`, on by default with model parallelism)."""
    pipeline_blocking_p2p: bool = False
    """Its pipeline sends and receives each transfer as its own blocking call, so a stage waits for its receives as
    for its sends (DeepSpeed's engine: gbmw.cost.stage_cost.StageCosts.blocking_p2p); Megatron batches them in pairs."""
    interleaved_pipeline: bool = False
    """It runs interleaved 1F1B (virtual pipeline stages, Megatron's --num-layers-per-virtual-pipeline-stage)."""
    sequence_parallel: bool = False
    """It runs Megatron's sequence parallelism with TP (`--sequence-parallel`; Korthikanti et al. 2022 Sec. 4.2.2),
    for every layer with TP or none."""
    sequence_parallel_blocks_only: bool = False
    """Its sequence parallelism runs in Transformer blocks only (gbmw's runtime: embeddings and heads keep the whole
    sequence); the search offers +sp to blocks alone (`layers_allowed`)."""
    selective_recompute: str | None = None
    """It recomputes the attention core alone (`--recompute-granularity selective`; Korthikanti et al. Sec. 5):
    `any` attention, `standard` (not with flash attention: Megatron-DeepSpeed recomputes only its unfused core),
    or None."""
    search_offers_selective: bool = True
    """Its search offers +sel where it runs it (gbmw.space.spaces.SearchSpace.for_target); gbmw's runtime runs +sel but its
    search leaves it out: with fused attention it frees only the log-sum-exp (see the module docstring)."""
    sequence_axes: tuple[str, ...] = ()
    """The sequence axes it runs (gbmw.space.strategy): `cp` — ring context parallelism (megatron-core's
    --context-parallel-size, on fused attention only); `ulysses` — DeepSpeed-Ulysses (--ds-sequence-parallel-size)."""
    sequence_split_with_sequence_parallel: bool = True
    """Its sequence axis composes with Megatron's +sp (megatron-core: yes; Megatron-DeepSpeed refuses
    --sequence-parallel with --ds-sequence-parallel-size > 1, megatron/initialize.py)."""
    expert_parallel: bool = False
    """It splits a mixture-of-experts model's experts over data-parallel ranks (megatron-core's
    `--expert-model-parallel-size`, Megatron-DeepSpeed's `--moe-expert-parallel-size`, gbmw's runtime); a stock
    framework sets one EP degree, which its dense layers ignore."""
    expert_parallel_axes: tuple[str, ...] = ("dp", "z1dp", "z2dp", "sdp")
    """The data-parallel axes EP composes with: the ZeRO stages its framework shards expert states under over the
    expert-data-parallel group (gbmw's runtime: all four, its FSDP2 sharding the experts over that group,
    gbmw.adapters.runtime.expert_data_parallel)."""
    expert_parallel_sequence_axes: tuple[str, ...] = ()
    """The sequence axes its EP composes with, folding their ranks into EP and EDP (gbmw.space.strategy:
    megatron-core's expert grid for cp; gbmw's runtime for cp and ulysses, every rank routing its own tokens).
    Megatron-DeepSpeed's Ulysses beside DeepSpeed-MoE is not modelled: refused."""
    expert_tensor_parallel: bool = False
    """It runs the experts at a TP degree of their own (`+etpN`, gbmw.space.expert_tensor_parallel: megatron-core's
    --expert-tensor-parallel-size). Megatron-DeepSpeed's one alternative to the layer's TP, experts whole without
    --enable-expert-tensor-parallelism, keeps DeepSpeed's EP groups inside one TP rank's data-parallel ranks and drops
    the TP ranks' duplicate tokens (deepspeed/utils/groups.py, deepspeed/moe/sharded_moe.py): another layout, not
    costed. gbmw's runtime runs megatron-core's layout (gbmw.adapters.runtime.experts)."""
    expert_parallel_needs_sequence_parallel: bool = False
    """EP with TP needs sequence parallelism (megatron-core: "When using expert parallelism and tensor parallelism
    for training, sequence parallelism must be used", megatron/core/model_parallel_config.py)."""
    gradient_reduce_dtypes: tuple[str, ...] = ("fp32",)
    """The dtypes it accumulates and reduces a bf16 model's gradients in (gbmw.cost.model_states): megatron-core also
    bf16 (`--grad-reduce-in-bf16`)."""
    adam_moments_dtypes: tuple[str, ...] = ("fp32",)
    """The dtypes it keeps Adam's moments in: megatron-core also bf16 (its precision-aware optimizer)."""
    tp_comm_overlap: bool = False
    """It runs Transformer Engine's TP communication overlap (megatron-core's `--tp-comm-overlap`: userbuffers, the
    sequence-parallel collectives under the TP GEMMs; gbmw.cost.tp_comm_overlap)."""
    precisions: tuple[str, ...] = ("fp32", "fp16", "bf16")
    """The training precisions it runs: `fp8` only where its layers are Transformer Engine's (megatron-core); DeepSpeed,
    Megatron-DeepSpeed and gbmw's runtime do not run TE's FP8 linears. `tf32` only where gbmw runs the training loop
    (the runtime): a stock framework's configuration has no switch for torch's TF32 matmuls, the user's script does."""
    context_parallel_dropout: bool = True
    """Its ring attention (cp) runs attention dropout (gbmw's runtime's does not: its context_parallel.py)."""
    fused_attention: bool = False
    """Its attention is a fused kernel whatever the model declares (gbmw's runtime calls SDPA, whose flash /
    memory-efficient kernels keep no s×s scores: gbmw.adapters.runtime.attention); a stock framework runs the
    attention the model declares (`attention: standard | flash`)."""

    # ------------------------------------------------------------------ the search

    def allows(self, strategy: Strategy, pp: int) -> bool:
        """Whether a stock configuration can give every layer `strategy` at pipeline degree `pp`."""
        if strategy.sp and not self.sequence_parallel or strategy.selective and self.selective_recompute is None:
            return False
        if not self.runs_expert_parallel(strategy):
            return False
        if strategy.sequence_axis is not None and (
                strategy.sequence_axis not in self.sequence_axes
                or strategy.sp and not self.sequence_split_with_sequence_parallel):
            return False
        if self.per_layer:
            return True
        axes = [axis for axis, _ in strategy.dims]
        data_axes = [axis for axis in axes if axis in DATA_PARALLEL_AXES]
        if len(data_axes) > 1 or any(axis not in self.axes for axis in axes):
            return False
        if "tp" in axes[1:]:  # TP on consecutive ranks, data parallelism outside it
            return False
        return not (pp > 1 and self.pipeline_max_zero_stage is not None
                    and any(ZERO_STAGE_OF_AXIS[axis] > self.pipeline_max_zero_stage for axis in data_axes))

    def runs_expert_parallel(self, strategy: Strategy) -> bool:
        """Whether it runs `strategy`'s expert parallelism (always, for EP 1): EP at all, with the strategy's
        data-parallel axis, at its expert TP degree, and with +sp where EP meets TP if it needs that."""
        if strategy.ep == 1:
            return True
        return (self.expert_parallel
                and (strategy.sequence_axis is None or strategy.sequence_axis in self.expert_parallel_sequence_axes)
                and (strategy.expert_tp is None or self.expert_tensor_parallel)
                and all(axis not in DATA_PARALLEL_AXES or axis in self.expert_parallel_axes for axis, _ in strategy.dims)
                and not (self.expert_parallel_needs_sequence_parallel and strategy.tp > 1 and not strategy.sp))

    def layers_allowed(self, model: ModelSpec, strategies: Sequence[Strategy]) -> np.ndarray:
        """[strategy, layer]: where this target runs each strategy's expert parallelism (on mixture-of-experts layers
        whose experts the EP degree divides; a per-layer target leaves dense layers at EP 1, where +ep changes
        nothing) and sequence parallelism (every other pair: True).
        Sequence parallelism slices the sequence over the TP group, so the TP degree must divide it: Megatron's
        scatter to the sequence-parallel region asserts it (megatron.core.tensor_parallel.mappings, "First dimension
        of the tensor should be divisible by tensor parallel size"), and gbmw's runtime slices it the same way; gbmw's
        runtime runs it in Transformer blocks only."""
        allowed = np.ones((len(strategies), model.num_layers), bool)
        ep = np.array([strategy.ep for strategy in strategies])
        if (ep > 1).any():  # experts split whole over the EP group; a per-layer search leaves dense layers at EP 1
            experts = model.arrays.num_experts
            runs = np.array([self.runs_expert_parallel(strategy) for strategy in strategies], bool)
            allowed &= runs[:, None] & np.where(experts[None, :] > 0, experts[None, :] % ep[:, None] == 0,
                                                (ep[:, None] == 1) | (not self.per_layer))
        for index, strategy in enumerate(strategies):
            if strategy.sequence_axis is not None:
                allowed[index] &= [not sequence_split_problem(strategy, layer, model, self) for layer in model.layers]
        sp = np.array([strategy.sp for strategy in strategies], bool)
        if sp.any():
            divides = np.array([model.sequence_length % strategy.tp == 0 for strategy in strategies], bool)
            blocks = model.is_block if self.sequence_parallel_blocks_only else np.ones(model.num_layers, bool)
            allowed[sp] &= blocks[None, :] & divides[sp, None]
        return allowed

    def runs_recompute_of(self, strategy: Strategy, model: ModelSpec) -> bool:
        """Whether it runs `strategy`'s recomputation level on `model` (Megatron-DeepSpeed's selective recomputation
        needs the unfused attention core)."""
        if not strategy.selective:
            return True
        flash = model.architecture is not None and model.architecture.attention == "flash"
        return self.selective_recompute == "any" or (self.selective_recompute == "standard" and not flash)

    @property
    def partition_rules(self) -> tuple[str, ...]:
        return tuple(rule for _, rule in self.partition_methods)

    def partitions(self, model: ModelSpec, pp: int) -> dict[str, tuple[int, ...]]:
        """{the framework's method name: the one partition it gives `model` over `pp` stages}, for the methods
        that are fixed by the model (not megatron-core's free first/last stage sizes)."""
        result = {}
        for method, rule in self.partition_methods:
            candidates = PARTITION_RULES[rule](model, pp)
            if len(candidates) == 1 and rule != "first-last":
                result[method] = candidates[0]
        return result

    def partition_method(self, model: ModelSpec, partition: Sequence[int]) -> str | None:
        """The framework's method that gives `partition` (None: it cannot run that partition)."""
        partition = tuple(partition)
        for method, rule in self.partition_methods:
            if rule == "first-last" and is_first_last_split(model, partition):
                return method
            if partition in PARTITION_RULES[rule](model, len(partition)):
                return method
        return None

    # ------------------------------------------------------------------ expressibility

    def problems(self, plan: PlanLayout, model: ModelSpec) -> list[str]:
        """Why this target cannot run `plan` as it is (empty if it can)."""
        target = self.name
        problems = technique_problems(self, plan, model) + self._interleaving_problems(plan, model)
        if self.per_layer:
            return problems + self._sequence_parallel_layer_problems(plan, model)
        blocks = [layer.is_block for layer in model.layers]
        trees = {strategy.dims for strategy in plan.strategies}
        if len(trees) > 1:
            problems.append(f"{_describe_runs(plan)}; a {target} job has one parallel layout for every layer")
        if len({strategy.recompute for strategy, block in zip(plan.strategies, blocks) if block}) > 1:
            problems.append(f"some Transformer blocks recompute and others do not (or at another granularity); "
                            f"{target} recomputes all blocks the same way or none")
        if any(strategy.recompute != "none" for strategy, block in zip(plan.strategies, blocks) if not block):
            problems.append(f"an embedding or head layer recomputes; {target} recomputes Transformer blocks only")
        if len({(strategy.ep, strategy.expert_tensor_parallel) for strategy, layer in zip(plan.strategies, model.layers)
                if layer.num_experts}) > 1:
            problems.append(f"mixture-of-experts blocks with different expert-parallel (or expert TP) degrees; {target} "
                            "sets one EP and one expert TP degree for every MoE block")
        if len({strategy.sp for strategy in plan.strategies}) > 1:
            problems.append(f"some layers run sequence parallelism (+sp) and others do not; {target} runs it for "
                            "every layer or none")
        if plan.schedule != "1f1b":
            problems.append(f"schedule {plan.schedule}; {target} runs 1F1B")

        names = ", ".join(dict.fromkeys(strategy.layout_name for strategy in plan.strategies))
        data_axes = {axis for tree in trees for axis, _ in tree if axis in DATA_PARALLEL_AXES}
        for tree in trees:
            axes = [axis for axis, _ in tree]
            tree_data = [axis for axis in axes if axis in DATA_PARALLEL_AXES]
            if len(tree_data) > 1:
                problems.append(f"a layout mixes {' and '.join(tree_data)}; {target} has one ZeRO stage")
            if "tp" in axes and axes[0] != "tp":
                problems.append(f"a layout puts TP outside data parallelism; {target} places TP on consecutive "
                                "ranks")
        if "tp" not in self.axes and any(axis == "tp" for tree in trees for axis, _ in tree):
            problems.append(f"{names} uses TP; plain DeepSpeed has none — use --target megatron-deepspeed")
        limit = self.pipeline_max_zero_stage
        if limit is not None and plan.pp > 1 and any(ZERO_STAGE_OF_AXIS[axis] > limit for axis in data_axes):
            problems.append(f"{names} with pp={plan.pp}: DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 — use "
                            "ZeRO-1")
        if data_axes - set(self.axes):
            problems.append(f"{names}: {target} offers DP or its distributed optimizer (ZeRO-1) — use "
                            "megatron-deepspeed")
        if plan.pp > 1 and self.partition_method(model, plan.partition) is None:
            offered = []
            for _, rule in self.partition_methods:
                candidates = PARTITION_RULES[rule](model, plan.pp)
                shown = f" ({list(candidates[0])})" if len(candidates) == 1 and rule != "first-last" else ""
                offered.append(RULE_DESCRIPTIONS[rule] + (shown or " (none for this model)" * (not candidates)))
            problems.append(f"partition {list(plan.partition)} is not {' nor '.join(offered)}")
        return problems

    def _sequence_parallel_layer_problems(self, plan: PlanLayout, model: ModelSpec) -> list[str]:
        """Why this target cannot run `plan`'s +sp outside Transformer blocks (empty if it can)."""
        if not self.sequence_parallel_blocks_only:
            return []
        outside = [index for index, (strategy, layer) in enumerate(zip(plan.strategies, model.layers))
                   if strategy.sp and not layer.is_block]
        if not outside:
            return []
        return [f"layer(s) {outside} use sequence parallelism (+sp) outside the Transformer blocks; {self.name} runs "
                "it in Transformer blocks only"]

    def _interleaving_problems(self, plan: PlanLayout, model: ModelSpec) -> list[str]:
        """Why this target cannot interleave `plan`'s pipeline (empty for plain 1F1B)."""
        v = plan.virtual_stages
        if v == 1:
            return []
        if not self.interleaved_pipeline:
            return [f"virtual_stages {v}: {self.name} runs plain 1F1B, not interleaved — use --target megatron-core"]
        problems = []
        if plan.num_micro_batches % plan.pp:
            problems.append(f"virtual_stages {v} with {plan.num_micro_batches} micro-batches: interleaved 1F1B needs "
                            f"a multiple of pp={plan.pp}")
        ends = np.cumsum(plan.partition).tolist()
        blocks = [int(model.is_block[end - count:end].sum()) for count, end in zip(plan.partition, ends)]
        if not interleaved_split(blocks, v):  # megatron-core's v equal chunks per stage
            accounted = accounted_blocks_per_stage(sum(blocks), plan.pp)
            problems.append(f"virtual_stages {v}: the stages hold {blocks} Transformer blocks; interleaving builds {v} "
                            f"equal chunks per stage: an even split with a multiple of {v} blocks per stage, or the "
                            f"split counting the embedding and the loss as layers ({accounted or 'none for this model'}) "
                            f"with (blocks + 2) / pp a multiple of {v}")
        return problems

    def precision_refusal(self, precision: str, gradient_reduce_dtype: str = "fp32", tp_comm_overlap: bool = False,
                          adam_moments_dtype: str = "fp32") -> str | None:
        """Why this target cannot train with these job settings, in one line (gbmw.space.launch_settings), or None."""
        return launch_settings_refusal(self, TARGETS, precision, gradient_reduce_dtype, tp_comm_overlap,
                                       adam_moments_dtype)

    def check_precision(self, precision: str, gradient_reduce_dtype: str = "fp32", tp_comm_overlap: bool = False,
                        adam_moments_dtype: str = "fp32") -> None:
        """Raise GbmwError with `precision_refusal`'s line where this target cannot train with these settings."""
        refusal = self.precision_refusal(precision, gradient_reduce_dtype, tp_comm_overlap, adam_moments_dtype)
        if refusal is not None:
            raise GbmwError(refusal)

    def check(self, plan: PlanLayout, model: ModelSpec) -> None:
        """Raise PlanError with every reason this target cannot run `plan`."""
        problems = self.problems(plan, model)
        if problems:
            advised = self.per_layer or any("use --target" in problem for problem in problems)
            advice = "" if advised else f" — use --target runtime, or plan again with --target {self.name}"
            raise PlanError(f"{self.name} cannot run this plan: " + "; ".join(problems) + advice)


def _describe_runs(plan: PlanLayout) -> str:
    """`layers 0-11 use tp2-dp8 and 12-49 use sdp16` (runs across stage boundaries, first three)."""
    runs: list[list] = []
    for index, strategy in enumerate(plan.strategies):
        if runs and runs[-1][2] == strategy.name:
            runs[-1][1] = index
        else:
            runs.append([index, index, strategy.name])
    parts = [f"{a}-{b} use {name}" if b > a else f"{a} uses {name}" for a, b, name in runs]
    return "layers " + " and ".join(parts[:3]) + (" …" if len(parts) > 3 else "")


TARGETS: dict[str, Target] = {
    "runtime": Target("runtime", "gbmw runtime", "gbmw-runtime", ("dp", "z1dp", "z2dp", "sdp", "tp", "ulysses", "cp"),
                      per_layer=True, fused_attention=True, sequence_parallel=True, sequence_parallel_blocks_only=True,
                      selective_recompute="any", search_offers_selective=False, context_parallel_dropout=False,
                      expert_parallel=True, expert_tensor_parallel=True,
                      expert_parallel_sequence_axes=("ulysses", "cp"),
                      sequence_axes=("ulysses", "cp"), sequence_split_with_sequence_parallel=False,
                      precisions=("fp32", "tf32", "fp16", "bf16")),
    "deepspeed": Target(
        "deepspeed", "DeepSpeed (ZeRO + pipeline engine)", "deepspeed", ("dp", "z1dp", "z2dp", "sdp"),
        pipeline_max_zero_stage=1, pipeline_blocking_p2p=True,
        partition_methods=(("uniform", "uniform"), ("parameters", "parameters")),
    ),
    "megatron-deepspeed": Target(
        "megatron-deepspeed", "Megatron-DeepSpeed", "deepspeed", ("tp", "ulysses", "dp", "z1dp", "z2dp", "sdp"),
        pipeline_max_zero_stage=1, pipeline_blocking_p2p=True,
        partition_methods=(("type:transformer", "even"),),
        pipeline_scatter_gather=True, sequence_parallel=True, selective_recompute="standard", expert_parallel=True,
        expert_parallel_axes=("dp", "z1dp", "z2dp"), sequence_axes=("ulysses",),
        sequence_split_with_sequence_parallel=False,
    ),
    "megatron-core": Target(
        "megatron-core", "Megatron-Core", "megatron", ("tp", "cp", "dp", "z1dp"),
        partition_methods=(("even", "even"), ("first-last", "first-last"), ("accounted", "accounted")),
        pipeline_scatter_gather=True, interleaved_pipeline=True, sequence_parallel=True, selective_recompute="any",
        expert_parallel=True, expert_parallel_needs_sequence_parallel=True, expert_parallel_axes=("dp", "z1dp"),
        expert_tensor_parallel=True, expert_parallel_sequence_axes=("cp",),
        sequence_axes=("cp",), precisions=("fp32", "fp16", "bf16", "fp8"), gradient_reduce_dtypes=("fp32", "bf16"),
        adam_moments_dtypes=("fp32", "bf16"), tp_comm_overlap=True,
    ),
}
STOCK_TARGETS = tuple(name for name, target in TARGETS.items() if not target.per_layer)
"""The targets a stock framework runs (what `gbmw tune` rewrites configs for)."""
ALIASES = {"megatron-lm": "megatron-core"}
"""NVIDIA Megatron-LM's pretrain_gpt.py runs megatron-core's model."""


def get_target(name: str) -> Target:
    """The target `name` (or an alias of one); one GbmwError naming the known targets otherwise."""
    name = ALIASES.get(name, name)
    if name not in TARGETS:
        raise GbmwError(f"--target {shown(name)} is unknown; targets: {', '.join(TARGETS)}")
    return TARGETS[name]
