"""An independent brute force over whole plans of the UNIFORM spaces — the stock targets and the fixed baselines —
to check that `Planner(exact=True)` is exact there too (issue 13).

A uniform space gives every layer one parallel layout (a strategy tree, with or without sequence parallelism)
and recomputes all Transformer blocks the same way or none (embeddings and heads never), on partitions its
framework can express. `UniformPlanOracle` enumerates, by plain loops restated from the targets' and baselines'
definitions (gbmw.space.targets, gbmw.space.spaces) rather than read from the search:

* pipeline degrees: targets — every power of two P dividing the device count N with P ≤ the number of layers L;
  `ddp`, `megatron-tp`, `fsdp` — P = 1; `gpipe` — P = N (one device per stage); `deepspeed-3d` — the P its
  fixed layout leaves (2-way ZeRO-1 DP × TP × PP, TP the square-root share of N / 2 capped at a node);
* micro-batch size b and count m: as tests/whole_plan_oracle.py states for the planner (every divisor b of a fixed
  global batch; in a sweep every b in {2^e, 3·2^e} and EVERY power of two m up to the limit, plus the largest);
* layouts: targets — every tree over N / P devices of the target's axes with at most one data-parallel axis, TP
  innermost (first), DeepSpeed's pipeline refusing ZeRO-2/3 when P > 1; with and without +sp for trees with TP on
  the Megatron targets; recomputation none, full, and selective (megatron-core always, Megatron-DeepSpeed only
  where the attention is not flash); on megatron-core a job keeping Adam's moments in bf16 (its precision-aware
  optimizer, which Megatron runs under the distributed optimizer only) no tree with plain dp of degree > 1;
  baselines — their one tree, GPipe recomputing every block. A layout is used
  when its TP degree divides every layer's attention and key/value heads (and, with +sp, the sequence length:
  Megatron's scatter to the sequence-parallel region asserts it) and its data-parallel degree divides b;
* partitions: pp = 1 — all layers; otherwise the space's rules. The closed-form rules of gbmw.space.stock_partitions
  (`uniform`, `parameters`, `even`, `first-last`) ARE the space's definition, so the oracle calls them (it does not
  re-derive DeepSpeed's or Megatron's splits). GPipe's rule is the time-balanced split (gbmw.search.balance, the paper's
  GPipe baseline): the oracle calls it too, and checks by brute force over every composition that no split has
  a smaller slowest-stage time;
* megatron-core's interleaved 1F1B: v = 1, and every v ≥ 2 dividing the even share of blocks per stage on the even
  split, when m is a multiple of P (gbmw.space.targets' `_interleaving_problems`).

The objective is estimate_plan's samples/s on the whole Plan (`literal`: every plan priced by gbmw.cost.estimate, no
stage-wise shortcut), and a plan fits when every stage peak is at most the budget (`Estimate.fits`). Nothing here
calls the search (planner, stage_search, pareto, bounds, search_units).
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np
from whole_plan_oracle import (AGREE, FASTER, INVENTED, MISSED, OUTSIDE, OVER_BUDGET, PLACEHOLDER_BUDGET_BYTES, SLOWER,
                               Case, Choices, Setting, TinyJob, Verdict, compositions, draw_budget, oracle_settings,
                               random_tiny_job, with_budget)

from gbmw.cost.comm import CommModel
from gbmw.cost.estimate import estimate_plan
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.stage_cost import strategy_tables
from gbmw.plan import Plan
from gbmw.search.balance import time_balanced_partition
from gbmw.space.stock_partitions import PARTITION_RULES
from gbmw.space.strategy import Strategy
from gbmw.space.targets import get_target
from gbmw.specs.jobs import JobSpec
from gbmw.specs.models import model_as_run

TARGET_SPACES = ("deepspeed", "megatron-deepspeed", "megatron-core")
BASELINE_SPACES = ("ddp", "megatron-tp", "fsdp", "gpipe", "deepspeed-3d")
UNIFORM_SPACES = TARGET_SPACES + BASELINE_SPACES


@dataclass(frozen=True)
class TargetRules:
    """A stock target's configurable space, written out by hand from gbmw.space.targets' definitions."""

    axes: tuple[str, ...]
    pipeline_max_zero_stage: int | None
    partition_rules: tuple[str, ...]
    sequence_parallel: bool
    selective: str | None
    """`any`, `standard` (not with flash attention) or None."""
    interleaved: bool = False
    sequence_axis: str | None = None
    """`cp` (megatron-core: sequence divisible by 2·cp, flash attention) or `ulysses` (Megatron-DeepSpeed: tp·u
    divides every layer's heads, u the sequence; never with +sp); placed just inside the data-parallel axis."""
    expert_axes: tuple[str, ...] = ()
    """The data-parallel axes expert parallelism composes with (an MoE model: every power of two EP dividing the
    data-parallel degree and every layer's experts)."""
    expert_with_sequence: bool = False
    """EP also beside the sequence axis, over its ranks and the data-parallel ones (every power of two dividing their
    product: megatron-core's expert grid folds cp into EP); without it, none with a sequence axis."""
    expert_needs_sp_with_tp: bool = False
    experts_whole: bool = False
    """An MoE model may also run its experts whole (+epN+etp1) where TP is the innermost axis, at least 2 and inside a
    node, with +sp and at most one data-parallel axis (a cp axis beside them: the expert grid takes the TP · CP · DP
    ranks as they are): every power of two EP from 2 to the stage's devices (megatron-core's
    --expert-tensor-parallel-size 1)."""


TARGET_RULES = {
    "deepspeed": TargetRules(("dp", "z1dp", "z2dp", "sdp"), 1, ("uniform", "parameters"), False, None),
    "megatron-deepspeed": TargetRules(("tp", "ulysses", "dp", "z1dp", "z2dp", "sdp"), 1, ("even",), True, "standard",
                                      sequence_axis="ulysses", expert_axes=("dp", "z1dp", "z2dp")),
    "megatron-core": TargetRules(("tp", "cp", "dp", "z1dp"), None, ("even", "first-last", "accounted"), True, "any",
                                 interleaved=True,
                                 sequence_axis="cp", expert_axes=("dp", "z1dp"), expert_needs_sp_with_tp=True,
                                 experts_whole=True, expert_with_sequence=True),
}
SEQUENCE = ("cp", "ulysses")
ZERO_STAGE = {"dp": 0, "z1dp": 1, "z2dp": 2, "sdp": 3}


def planner_arguments(space: str) -> dict:
    """How `Planner` names the space: a target, or a baseline variant on the runtime target."""
    return {"target": space} if space in TARGET_SPACES else {"variant": space}


def _trees(axes: tuple[str, ...], group: int) -> list[tuple]:
    """Every tree over `group` devices: each axis at most once, power-of-two degrees ≥ 2, every order."""
    degrees = [2**e for e in range(1, group.bit_length()) if 2**e <= group]
    trees: list[tuple] = [()] if group == 1 else []
    for count in range(1, len(axes) + 1):
        for chosen_axes in itertools.permutations(axes, count):
            for chosen in itertools.product(degrees, repeat=count):
                if math.prod(chosen) == group:
                    trees.append(tuple(zip(chosen_axes, chosen)))
    return trees


def _target_trees(rules: TargetRules, group: int, pp: int) -> list[tuple]:
    result = []
    for tree in _trees(rules.axes, group):
        axes = [axis for axis, _ in tree]
        data = [axis for axis in axes if axis != "tp" and axis not in SEQUENCE]
        sequence = [index for index, axis in enumerate(axes) if axis in SEQUENCE]
        if len(data) > 1 or ("tp" in axes and axes[0] != "tp"):
            continue
        if sequence and sequence[0] != (axes.index(data[0]) - 1 if data else len(axes) - 1):
            continue  # the sequence axis goes just inside the data-parallel one, or outermost
        if pp > 1 and rules.pipeline_max_zero_stage is not None and any(
                ZERO_STAGE[axis] > rules.pipeline_max_zero_stage for axis in data):
            continue
        result.append(tree)
    return result


def _deepspeed_3d(devices: int, devices_per_node: int) -> tuple[int, tuple] | None:
    """(pp, tree) of the DeepSpeed 3D baseline: 2-way DP, TP the square-root share of the rest (rounded up to a power
    of two, capped at a node), PP what is left."""
    if devices < 4:
        return None
    rest = devices // 2
    tp = min(devices_per_node, 2 ** math.ceil(math.log2(rest) / 2))
    return rest // tp, ((("tp", tp),) if tp > 1 else ()) + (("z1dp", 2),)


@dataclass(frozen=True)
class Layout:
    """One uniform choice: the Transformer blocks' strategy and the other layers' (same tree and +sp, no
    recomputation)."""

    block: Strategy
    other: Strategy


def space_layouts(space: str, job: JobSpec, pp: int) -> list[Layout]:
    """Every layout of the space at pipeline degree `pp` (before the head and batch divisibility checks)."""
    devices = job.cluster.num_devices
    if space in TARGET_RULES:
        rules = TARGET_RULES[space]
        architecture = job.model.architecture
        flash = architecture is not None and architecture.attention == "flash"
        levels = ["none", "full"] + (["selective"] if rules.selective == "any" or (
            rules.selective == "standard" and not flash) else [])
        layouts = []
        moe = job.model.is_mixture_of_experts
        for tree in _target_trees(rules, devices // pp, pp):
            if job.adam_moments_dtype == "bf16" and any(axis == "dp" and degree > 1 for axis, degree in tree):
                continue  # Megatron's precision-aware optimizer runs under its distributed optimizer only
            has_tp = any(axis == "tp" for axis, _ in tree)
            has_sequence = any(axis in SEQUENCE for axis, _ in tree)
            data = [(axis, degree) for axis, degree in tree if axis != "tp" and axis not in SEQUENCE]
            other_tokens = math.prod(degree for axis, degree in tree if axis != "tp")  # sequence and data ranks
            splits = moe and (not has_sequence or rules.expert_with_sequence) and (
                data[0][0] in rules.expert_axes if data else has_sequence)
            eps = [1] + ([2**e for e in range(1, other_tokens.bit_length()) if other_tokens % 2**e == 0]
                         if splits else [])
            for sp in ((False, True) if rules.sequence_parallel and has_tp else (False,)):
                if sp and rules.sequence_axis == "ulysses" and has_sequence:
                    continue  # Megatron-DeepSpeed's initialize refuses --sequence-parallel beside Ulysses
                whole = (moe and rules.experts_whole and sp and tree[0][0] == "tp"
                         and tree[0][1] <= job.cluster.devices_per_node and len(data) <= 1)
                expert_layouts = [(ep, None) for ep in eps] + (
                    [(2**e, 1) for e in range(1, (devices // pp).bit_length())] if whole else [])
                for ep, expert_tp in expert_layouts:
                    if ep > 1 and rules.expert_needs_sp_with_tp and has_tp and not sp:
                        continue
                    for level in levels:
                        block = Strategy(tree, ckpt=level == "full", selective=level == "selective", sp=sp, ep=ep,
                                         expert_tp=expert_tp)
                        layouts.append(Layout(block, Strategy(tree, sp=sp, ep=ep, expert_tp=expert_tp)))
        return layouts
    fixed = {"ddp": (1, (("dp", devices),)), "megatron-tp": (1, (("tp", devices),)),
             "fsdp": (1, (("sdp", devices),)), "gpipe": (devices, ()),
             "deepspeed-3d": _deepspeed_3d(devices, job.cluster.devices_per_node)}[space]
    if fixed is None or fixed[0] != pp:
        return []
    tree = fixed[1]
    return [Layout(Strategy(tree, ckpt=space == "gpipe"), Strategy(tree))]


def space_pipeline_degrees(space: str, job: JobSpec) -> list[int]:
    devices, layers = job.cluster.num_devices, job.model.num_layers
    if space in TARGET_RULES:
        degrees = [2**e for e in range(devices.bit_length()) if devices % 2**e == 0]
    elif space == "gpipe":
        degrees = [devices]
    elif space == "deepspeed-3d":
        fixed = _deepspeed_3d(devices, job.cluster.devices_per_node)
        degrees = [] if fixed is None else [fixed[0]]
    else:
        degrees = [1]
    return [pp for pp in degrees if pp <= layers]


def _runs_on_every_layer(layout: Layout, job: JobSpec, micro_batch: int) -> bool:
    tp = math.prod(degree for axis, degree in layout.block.dims if axis == "tp")
    data = math.prod(degree for axis, degree in layout.block.dims if axis != "tp" and axis not in SEQUENCE)
    heads_ok = all(heads == 0 or heads % tp == 0 for layer in job.model.layers
                   for heads in (layer.attention_heads, layer.kv_heads))
    sequence_ok = not layout.block.sp or job.model.sequence_length % tp == 0  # +sp slices the sequence over TP
    experts_ok = all(layer.num_experts % layout.block.ep == 0 for layer in job.model.layers if layer.num_experts)
    return heads_ok and sequence_ok and experts_ok and _splits_the_sequence(layout, job) and micro_batch % data == 0


def _splits_the_sequence(layout: Layout, job: JobSpec) -> bool:
    """The sequence axis' rules on every layer: cp — the sequence in 2·cp parts, flash attention; ulysses — the
    sequence in u parts, tp·u dividing the query and key/value heads; neither on a layer with a second sequence."""
    axis = next((axis for axis, _ in layout.block.dims if axis in SEQUENCE), None)
    if axis is None:
        return True
    degree, tp = layout.block.degree(axis), layout.block.tp
    if job.model.sequence_length % (2 * degree if axis == "cp" else degree):
        return False
    for layer in job.model.layers:
        if layer.side_input_bytes_per_sample:
            return False
        if layer.attention_heads and axis == "cp" and not layer.forward_flash_attention_flops_per_sample:
            return False
        if layer.attention_heads and axis == "ulysses" and any(
                heads and heads % (tp * degree) for heads in (layer.attention_heads, layer.kv_heads)):
            return False
    return True


@dataclass(frozen=True)
class UniformPlan:
    samples_per_s: float
    peak_bytes: float
    plan: Plan


@dataclass
class UniformPlanOracle:
    """Every whole plan of `job` in the uniform `space`, priced by estimate_plan, reduced to its (peak, samples/s)
    frontier; `best(budget)` is the brute-force answer for any budget."""

    job: JobSpec
    space: str
    frontier: list[UniformPlan] = field(default_factory=list)
    whole_plans: int = 0
    keys: set = field(default_factory=set)
    """(pp, b, m, partition, strategies, virtual stages) of every plan enumerated: the space, for `in_space`."""

    def __post_init__(self) -> None:
        self.target = self.space if self.space in TARGET_SPACES else "runtime"
        self.schedule = "gpipe" if self.space == "gpipe" else "1f1b"
        target = get_target(self.target)
        self.model = model_as_run(self.job.model, target.fused_attention)
        self.cost_settings = CostSettings(self.job.cluster, self.job.precision, self.job.optimizer, target.framework,
                                          adam_moments_dtype=self.job.adam_moments_dtype)
        found: list[UniformPlan] = []
        degrees = space_pipeline_degrees(self.space, self.job)
        for setting in oracle_settings(self.job):
            if setting.pp not in degrees:
                continue
            for layout in space_layouts(self.space, self.job, setting.pp):
                if _runs_on_every_layer(layout, self.job, setting.micro_batch):
                    found += self._price(setting, layout)
        found.sort(key=lambda plan: (plan.peak_bytes, -plan.samples_per_s))
        for plan in found:
            if not self.frontier or plan.samples_per_s > self.frontier[-1].samples_per_s:
                self.frontier.append(plan)

    def strategies(self, layout: Layout) -> tuple[Strategy, ...]:
        return tuple(layout.block if layer.is_block else layout.other for layer in self.model.layers)

    def partitions(self, setting: Setting, layout: Layout) -> list[tuple[tuple[int, ...], int]]:
        """(partition, virtual stages) pairs of the space for this setting and layout."""
        model, pp = self.model, setting.pp
        if pp == 1:
            return [((model.num_layers,), 1)]
        if self.space == "gpipe":
            return [(self._time_balanced(setting, layout), 1)]
        rules = TARGET_RULES[self.space].partition_rules if self.space in TARGET_RULES else ("even", "uniform")
        found = dict.fromkeys((tuple(p), 1) for rule in rules for p in PARTITION_RULES[rule](model, pp))
        blocks = int(sum(layer.is_block for layer in model.layers))
        if (self.space in TARGET_RULES and TARGET_RULES[self.space].interleaved and setting.num_micro_batches % pp == 0):
            # megatron-core's v equal chunks per stage: get_num_layers_to_build splits the blocks (plus one layer for
            # the embedding and one for the loss, with --account-for-…-in-pipeline-split) into pp·v chunks
            for accounted, rule in ((0, "even"), (2, "accounted")):
                layers = blocks + accounted
                if layers % pp:
                    continue
                for split in PARTITION_RULES[rule](model, pp):
                    for v in range(2, layers // pp + 1):
                        if (layers // pp) % v == 0:
                            found[tuple(split), v] = None
        return list(found)

    def _time_balanced(self, setting: Setting, layout: Layout) -> tuple[int, ...]:
        """GPipe's split by the layers' times (the rule gbmw.search.balance implements), checked to have the least
        slowest-stage time of every composition."""
        strategies = self.strategies(layout)
        unique = list(dict.fromkeys(strategies))
        tables = strategy_tables(self.model, unique, setting.micro_batch, self.cost_settings,
                                 CommModel(self.job.cluster))
        times = np.array([tables.time_no_grad_sync_s[unique.index(s), i] for i, s in enumerate(strategies)])
        partition = tuple(time_balanced_partition(times, setting.pp))

        def slowest(split):
            bounds = np.cumsum((0,) + split)
            return max(times[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:]))

        least = min(slowest(split) for split in compositions(len(times), setting.pp))
        assert slowest(partition) <= least * (1 + 1e-12), (partition, slowest(partition), least)
        return partition

    def _price(self, setting: Setting, layout: Layout) -> list[UniformPlan]:
        found = []
        for partition, virtual in self.partitions(setting, layout):
            plan = Plan(model=self.job.model.name, cluster=self.job.cluster.name,
                        num_devices=self.job.cluster.num_devices, precision=self.job.precision,
                        global_batch=setting.global_batch, micro_batch=setting.micro_batch,
                        num_micro_batches=setting.num_micro_batches, pp=setting.pp, partition=partition,
                        strategies=self.strategies(layout), target=self.target, schedule=self.schedule,
                        virtual_stages=virtual, adam_moments_dtype=self.job.adam_moments_dtype)
            estimate = estimate_plan(self.job, plan, PLACEHOLDER_BUDGET_BYTES)
            self.whole_plans += 1
            self.keys.add(plan_key(plan))
            found.append(UniformPlan(estimate.samples_per_s, max(estimate.stage_peak_memory_bytes), plan))
        return found

    def best(self, budget_bytes: float) -> UniformPlan | None:
        """The fastest plan whose every stage fits `budget_bytes` (None: nothing fits), re-checked with
        estimate_plan's `fits`."""
        position = bisect_right([plan.peak_bytes for plan in self.frontier], budget_bytes)
        if position == 0:
            return None
        best = self.frontier[position - 1]
        assert estimate_plan(self.job, best.plan, budget_bytes).fits
        return best

    def peaks(self) -> list[float]:
        return [plan.peak_bytes for plan in self.frontier]


def plan_key(plan: Plan) -> tuple:
    return (plan.pp, plan.micro_batch, plan.num_micro_batches, tuple(plan.partition), tuple(plan.strategies),
            plan.virtual_stages)


# ---------------------------------------------------------------------------------------------------- cases


class UniformCase(Case):
    """A random tiny job in a uniform space (`variant` names the space), with a budget drawn from its brute-force
    frontier; its oracle is a UniformPlanOracle."""

    @property
    def space(self) -> str:
        return self.variant


def random_uniform_case(source, spaces: tuple[str, ...] = UNIFORM_SPACES, work_cap: int = 20_000) -> UniformCase:
    """A case from a random.Random or a hypothesis draw: space, job (tests/whole_plan_oracle.py's tiny jobs, the
    batch drawn among those the per-layer `1f1b+bi-obj` space keeps under `work_cap`), oracle, budget."""
    choose = source if isinstance(source, Choices) else Choices(source)
    space = choose.choice(spaces)
    tiny = random_tiny_job(choose, "1f1b+bi-obj", work_cap)
    # A uniform space is small: larger batches than the per-layer oracle affords, so that data parallelism over 8
    # devices and long 1F1B sweeps (m ≥ P, interleaving's multiples of P) are in reach.
    batch = choose.choice([None, 8, 16, 24, 32])
    if batch is not None:
        sweep = choose.flag(0.4)
        job = tiny.job.model_copy(update={"global_batch": None, "max_global_batch": batch} if sweep
                                  else {"global_batch": batch})
        summary = tiny.summary.rsplit(", ", 1)[0] + (f", sweep ≤ {batch}" if sweep else f", batch {batch}")
        tiny = TinyJob(job, summary)
    if space == "megatron-core" and tiny.job.precision == "bf16" and tiny.job.optimizer == "adam" and choose.flag(0.5):
        tiny = TinyJob(tiny.job.model_copy(update={"adam_moments_dtype": "bf16"}), tiny.summary + ", bf16 moments")
    oracle = UniformPlanOracle(tiny.job, space)
    budget, kind = draw_budget(choose, oracle)
    return UniformCase(tiny, space, budget, kind, oracle)


UniformVerdict = Verdict
"""The planner's answer for a uniform case against the uniform brute force's (its oracle plan a UniformPlan)."""


def check_uniform_planner(case: UniformCase, exact: bool) -> UniformVerdict:
    """Run gbmw's search (the thing under test) on the case and classify its answer against the oracle's."""
    from gbmw.search.planner import NothingFitsError, Planner

    job = case.job
    oracle = case.oracle.best(case.budget_bytes)
    try:
        plan = Planner(job, exact=exact, explain_failure=False, **planner_arguments(case.space)).run()
    except NothingFitsError:
        return UniformVerdict(AGREE if oracle is None else MISSED, oracle, None)
    if not estimate_plan(job, plan).fits:
        return UniformVerdict(OVER_BUDGET, oracle, plan)
    if plan_key(plan) not in case.oracle.keys:
        return UniformVerdict(OUTSIDE, oracle, plan)
    if oracle is None:
        return UniformVerdict(INVENTED, oracle, plan)
    got, want = plan.estimate.samples_per_s, oracle.samples_per_s
    if abs(got - want) <= 1e-9 * want:  # the same plan's Eq. (9) summed in another order: a few ulps apart
        return UniformVerdict(AGREE, oracle, plan)
    return UniformVerdict(SLOWER if got < want else FASTER, oracle, plan)


def describe_uniform_plan(plan: Plan) -> str:
    chunks = f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else ""
    return (f"pp={plan.pp} partition={list(plan.partition)}{chunks} b={plan.micro_batch}×m={plan.num_micro_batches} "
            f"[{' '.join(dict.fromkeys(s.name for s in plan.strategies))}]")
