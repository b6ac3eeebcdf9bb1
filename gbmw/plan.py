"""The Plan: the only contract between the planner and the adapters (DeepSpeed, Megatron, runtime).

A Plan fixes, for a model on a number of devices: the global batch, how it is cut into pipeline
micro-batches, the pipeline degree and partition (layers per stage), one Strategy per layer, the
target that will run it, the estimate the planner made, and where the plan came from. It is
frozen, validates itself on construction (errors show the arithmetic), and round-trips exactly
through YAML (`Plan.to_yaml` / `Plan.from_yaml`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from numbers import Integral
from pathlib import Path
from typing import Any

import yaml

from gbmw.errors import GbmwError, PlanError
from gbmw.specs.plan_fields import flag, name_text, plain, whole_number
from gbmw.space.strategy import Strategy
from gbmw.space.targets import TARGETS
from gbmw.specs.files import load_yaml_text, read_text, shown, write_new_file
from gbmw.specs.model_spec import FP8_RECIPES, PRECISIONS, ModelSpec
from gbmw.specs.optimizer_dtypes import adam_moments_dtype_problem, gradient_reduce_dtype_problem
from gbmw.specs.schema import MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_LAYERS, check_kind

PLAN_FORMAT_VERSION = 1
SCHEDULES = ("1f1b", "gpipe")
"""The pipeline schedules a plan may name; gbmw.cost.pipeline_schedules prices them."""


@dataclass(frozen=True)
class Estimate:
    """What the cost estimator predicts for a plan."""

    iteration_time_s: float
    samples_per_s: float
    stage_time_s: tuple[float, ...]
    """C(M_i, B_m) per stage: one micro-batch, gradient synchronisation included."""
    stage_peak_memory_bytes: tuple[float, ...]
    stage_model_state_bytes: tuple[float, ...]
    stage_activation_bytes: tuple[float, ...]
    memory_budget_bytes: float
    fits: bool
    model_tflops_per_device: float
    """Model FLOPs (3 × forward of every layer; Megatron's 72·B·s·L·h²(1 + s/6h + V/12hL) for GPT)
    per second per device; recomputation is not counted."""
    mfu: float
    """model_tflops_per_device over the device's peak for the precision."""


@dataclass(frozen=True)
class Plan:
    """A complete training plan for one model on `num_devices` devices."""

    model: str
    cluster: str
    num_devices: int
    precision: str
    global_batch: int
    """Samples per iteration (optimizer step)."""
    micro_batch: int
    """Samples in one pipeline micro-batch, all data-parallel replicas of a stage together
    (Megatron's --micro-batch-size is this over the data-parallel degree)."""
    num_micro_batches: int
    pp: int
    partition: tuple[int, ...]
    """Layers per pipeline stage, first stage first."""
    strategies: tuple[Strategy, ...]
    """One per layer of the model."""
    target: str = "runtime"
    """What will run it (gbmw.space.targets): runtime, deepspeed, megatron-deepspeed or megatron-core."""
    schedule: str = "1f1b"
    """Pipeline schedule: `1f1b` (1F1B-flush, the runtime's) or `gpipe` (baselines only)."""
    virtual_stages: int = 1
    """Model chunks per pipeline device: > 1 is interleaved 1F1B (Megatron's virtual pipeline stages), each
    stage's Transformer blocks cut into that many equal chunks (gbmw.cost.pipeline_schedules)."""
    fp8_recipe: str = "delayed"
    """Transformer Engine's FP8 scaling under precision fp8: `delayed` or `current` (gbmw.cost.fp8)."""
    gradient_reduce_dtype: str = "fp32"
    """The dtype gradients are accumulated and reduced in: `fp32` or `bf16` (gbmw.cost.model_states)."""
    adam_moments_dtype: str = "fp32"
    """The dtype Adam's moments are kept in: `fp32` or `bf16` (gbmw.cost.model_states)."""
    tp_comm_overlap: bool = False
    """Transformer Engine overlaps the +sp layers' TP collectives with their GEMMs (gbmw.cost.tp_comm_overlap)."""
    estimate: Estimate | None = None
    provenance: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """gbmw version, search settings and seconds, or how a hand-written plan was made."""

    def __post_init__(self) -> None:
        problems = [f"{name} {value!r}: must be a whole number from 1 to {bound}"
                    for name, value, bound in (("num_devices", self.num_devices, MAX_DEVICES),
                                               ("global_batch", self.global_batch, MAX_GLOBAL_BATCH),
                                               ("micro_batch", self.micro_batch, MAX_GLOBAL_BATCH),
                                               ("num_micro_batches", self.num_micro_batches, MAX_GLOBAL_BATCH),
                                               ("pp", self.pp, MAX_DEVICES), ("virtual_stages", self.virtual_stages, 64))
                    if isinstance(value, bool) or not isinstance(value, Integral) or not 1 <= value <= bound]
        if problems:
            raise PlanError("invalid plan: " + "; ".join(problems))
        if self.precision not in PRECISIONS:
            problems.append(f"precision {shown(self.precision)} is not one of {list(PRECISIONS)}")
        if self.fp8_recipe not in FP8_RECIPES:
            problems.append(f"fp8_recipe {shown(self.fp8_recipe)} is not one of {list(FP8_RECIPES)} (blockwise and "
                            "MXFP8 scaling are not costed)")
        elif self.fp8_recipe != "delayed" and self.precision != "fp8":
            problems.append(f"fp8_recipe {self.fp8_recipe} needs precision fp8 (the plan's is {self.precision})")
        problems += filter(None, [gradient_reduce_dtype_problem(self.precision, self.gradient_reduce_dtype),
                                  adam_moments_dtype_problem(self.precision, "adam", self.adam_moments_dtype)])
        if not isinstance(self.tp_comm_overlap, bool):
            problems.append(f"tp_comm_overlap {shown(self.tp_comm_overlap)}: must be true or false")
        if len(self.strategies) > MAX_LAYERS + 16:
            problems.append(f"{len(self.strategies)} layers: gbmw plans at most {MAX_LAYERS + 16}")
        if self.target not in TARGETS:
            problems.append(f"target {self.target!r} is not one of {list(TARGETS)}")
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule {self.schedule!r} is not one of {list(SCHEDULES)}")
        if self.virtual_stages > 1 and (self.schedule != "1f1b" or self.pp < 2):
            problems.append(f"virtual_stages {self.virtual_stages} interleaves a 1F1B pipeline; it needs schedule "
                            f"1f1b and pp ≥ 2 (schedule {self.schedule}, pp {self.pp})")
        if self.num_devices % self.pp != 0:
            problems.append(f"num_devices({self.num_devices}) % pp({self.pp}) != 0: stages need equal device groups")
        if len(self.partition) != self.pp:  # pp ≤ num_devices: the partition is short
            problems.append(f"partition has {len(self.partition)} stages but pp = {self.pp}")
        if any(count < 1 for count in self.partition):
            problems.append(f"partition {list(self.partition)}: every stage needs at least one layer")
        if sum(self.partition) != len(self.strategies):
            problems.append(
                f"sum(partition {list(self.partition)}) = {sum(self.partition)} != {len(self.strategies)} strategies"
            )
        if self.micro_batch * self.num_micro_batches != self.global_batch:
            problems.append(
                f"micro_batch({self.micro_batch}) * num_micro_batches({self.num_micro_batches}) = "
                f"{self.micro_batch * self.num_micro_batches} != global_batch({self.global_batch})"
            )
        if problems:
            raise PlanError("invalid plan: " + "; ".join(problems))
        group = self.num_devices // self.pp
        for index, strategy in enumerate(self.strategies):
            if strategy.group_size != group:
                raise PlanError(
                    f"invalid plan: layer {index} uses {strategy.name} over {strategy.group_size} devices, but "
                    f"each stage has num_devices({self.num_devices}) / pp({self.pp}) = {group}"
                )
            if self.micro_batch % strategy.data_parallel != 0:
                raise PlanError(
                    f"invalid plan: layer {index} ({strategy.name}) splits each micro-batch {strategy.data_parallel} "
                    f"ways, but micro_batch = {self.micro_batch} is not a multiple of {strategy.data_parallel}"
                )

    # ------------------------------------------------------------------ views

    @property
    def stage_bounds(self) -> list[tuple[int, int]]:
        """[(first layer, one past the last layer)] per stage."""
        bounds, start = [], 0
        for count in self.partition:
            bounds.append((start, start + count))
            start += count
        return bounds

    @property
    def devices_per_stage(self) -> int:
        return self.num_devices // self.pp

    def stage_strategies(self, stage: int) -> tuple[Strategy, ...]:
        first, end = self.stage_bounds[stage]
        return self.strategies[first:end]

    def runs(self) -> list[tuple[int, int, Strategy]]:
        """Consecutive layers with equal strategies collapsed: [(first, count, strategy)]."""
        result: list[tuple[int, int, Strategy]] = []
        for index, strategy in enumerate(self.strategies):
            if result and result[-1][2] == strategy and index not in {b for b, _ in self.stage_bounds}:
                first, count, _ = result[-1]
                result[-1] = (first, count + 1, strategy)
            else:
                result.append((index, 1, strategy))
        return result

    def check_against(self, model: ModelSpec, num_devices: int | None = None, precision: str | None = None,
                      fp8_recipe: str | None = None, gradient_reduce_dtype: str | None = None,
                      tp_comm_overlap: bool | None = None, adam_moments_dtype: str | None = None) -> None:
        """Raise PlanError if the plan does not fit this model (and device count, the job's precision, FP8 recipe,
        gradient dtype, TP communication overlap, Adam moments' dtype)."""
        if len(self.strategies) != model.num_layers:
            raise PlanError(
                f"plan has {len(self.strategies)} layer strategies but model {model.name} has {model.num_layers} layers"
            )
        if precision is not None and self.precision != precision:
            raise PlanError(
                f"plan is for precision {self.precision} but the job trains {model.name} in {precision}; "
                f"plan again (gbmw plan) or set the job's precision to {self.precision}"
            )
        if fp8_recipe is not None and self.fp8_recipe != fp8_recipe:
            raise PlanError(f"plan is for fp8_recipe {self.fp8_recipe} but the job scales FP8 by {fp8_recipe}; "
                            f"plan again (gbmw plan) or set the job's fp8_recipe to {self.fp8_recipe}")
        word = lambda value: str(value).lower()  # noqa: E731 (YAML's words for booleans)
        for name, wanted in (("gradient_reduce_dtype", gradient_reduce_dtype), ("adam_moments_dtype", adam_moments_dtype),
                             ("tp_comm_overlap", tp_comm_overlap)):
            have = getattr(self, name)
            if wanted is not None and have != wanted:
                raise PlanError(f"plan is for {name} {word(have)} but the job sets {word(wanted)}; plan again (gbmw "
                                f"plan) or set the job's {name} to {word(have)}")
        if num_devices is not None and num_devices != self.num_devices:
            raise PlanError(
                f"plan is for {self.num_devices} devices but {num_devices} are available; "
                f"plan again for {num_devices} devices (gbmw plan) or run on {self.num_devices}"
            )
        for layer, strategy in zip(model.layers, self.strategies):
            if strategy.ep > 1 and layer.num_experts % strategy.ep:
                allowed = [2**e for e in range(1, 16) if layer.num_experts % 2**e == 0]
                raise PlanError(
                    f"layer {layer.name} has {layer.num_experts} experts, not divisible by ep={strategy.ep} "
                    f"({strategy.name}): each rank of an EP group holds a whole share of them; EP degrees that divide "
                    f"it: {allowed}")
            tp = strategy.tp
            for what, heads in (("attention heads", layer.attention_heads), ("key/value heads", layer.kv_heads)):
                if tp > 1 and heads and heads % tp:
                    allowed = [2**e for e in range(8) if heads % 2**e == 0]
                    raise PlanError(
                        f"layer {layer.name} has {heads} {what}, not divisible by tp={tp} ({strategy.name}); "
                        f"TP degrees that divide it: {allowed}"
                    )

    # ------------------------------------------------------------------ YAML

    def to_dict(self) -> dict[str, Any]:
        runs = []
        for strategy in self.strategies:
            if runs and runs[-1]["strategy"] == strategy.name:
                runs[-1]["layers"] += 1
            else:
                runs.append({"strategy": strategy.name, "layers": 1})
        data: dict[str, Any] = {"format": PLAN_FORMAT_VERSION}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "strategies":
                data["strategies"] = runs
            elif item.name == "partition":
                data["partition"] = list(value)
            elif item.name == "estimate":
                data["estimate"] = None if value is None else plain(asdict(value))
            elif item.name == "virtual_stages" and value == 1:
                continue  # plain 1F1B: the field is written only for interleaved pipelines
            elif (item.name, value) in (("fp8_recipe", "delayed"), ("gradient_reduce_dtype", "fp32"),
                                        ("adam_moments_dtype", "fp32"), ("tp_comm_overlap", False)):
                continue  # the defaults: plans written before these fields read the same
            else:
                data[item.name] = plain(value)
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=100)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "plan") -> "Plan":
        if not isinstance(data, dict):
            raise PlanError(f"{where}: expected a mapping, got {type(data).__name__}")
        known = {item.name for item in fields(cls)} | {"format"}
        unknown = sorted(set(data) - known)
        if unknown:
            check_kind(data, "plan", where, PlanError)
            raise PlanError(f"{where}: unknown field(s) {unknown}; fields are {sorted(known)}")
        required = ["model", "cluster", "num_devices", "precision", "global_batch", "micro_batch",
                    "num_micro_batches", "pp", "partition", "strategies"]
        missing = [name for name in required if name not in data]
        if missing:
            raise PlanError(f"{where}: field(s) {missing} are required")
        try:
            if not isinstance(data["strategies"], list):
                raise PlanError(f"{where}: field `strategies`: value {shown(data['strategies'])} — write a list of "
                                "{strategy: NAME, layers: COUNT}")
            strategies: list[Strategy] = []
            for index, run in enumerate(data["strategies"]):
                if not isinstance(run, dict) or set(run) != {"strategy", "layers"}:
                    raise PlanError(
                        f"{where}: field `strategies[{index}]`: value {shown(run)} — write "
                        "{strategy: NAME, layers: COUNT}"
                    )
                count = whole_number(run["layers"], f"strategies[{index}].layers", where)
                if not 1 <= count <= MAX_LAYERS + 16 - len(strategies):
                    raise PlanError(f"{where}: field `strategies[{index}].layers`: value {count} — must be at least 1, "
                                    f"and all runs together at most {MAX_LAYERS + 16} layers")
                name = name_text(run["strategy"], f"strategies[{index}].strategy", where)
                strategies += [Strategy.parse(name)] * count
            estimate = data.get("estimate")
            if estimate is not None:
                estimate = _estimate(estimate, where)
            integers = {name: whole_number(data[name], name, where) for name in
                        ("num_devices", "global_batch", "micro_batch", "num_micro_batches", "pp")}
            integers["virtual_stages"] = whole_number(data.get("virtual_stages", 1), "virtual_stages", where)
            partition = data["partition"]
            if not isinstance(partition, list) or len(partition) > MAX_DEVICES:
                raise PlanError(f"{where}: field `partition`: value {shown(partition)} — write the layers of each "
                                "stage as a list, e.g. [3, 3]")
            provenance = data.get("provenance") or {}
            if not isinstance(provenance, dict):
                raise PlanError(f"{where}: field `provenance`: value {shown(provenance)} — must be a mapping")
            return cls(
                model=name_text(data["model"], "model", where),
                cluster=name_text(data["cluster"], "cluster", where, least=0),
                precision=name_text(data["precision"], "precision", where),
                partition=tuple(whole_number(v, "partition", where) for v in partition),
                strategies=tuple(strategies),
                target=name_text(data.get("target", "runtime"), "target", where),
                schedule=name_text(data.get("schedule", "1f1b"), "schedule", where),
                fp8_recipe=name_text(data.get("fp8_recipe", "delayed"), "fp8_recipe", where),
                gradient_reduce_dtype=name_text(data.get("gradient_reduce_dtype", "fp32"), "gradient_reduce_dtype",
                                                where),
                adam_moments_dtype=name_text(data.get("adam_moments_dtype", "fp32"), "adam_moments_dtype", where),
                tp_comm_overlap=flag(data.get("tp_comm_overlap", False), "tp_comm_overlap", where),
                estimate=estimate,
                provenance=dict(provenance),
                **integers,
            )
        except GbmwError as error:
            message = str(error)
            raise PlanError(message if message.startswith(where) else f"{where}: {message}") from None
        except (TypeError, ValueError) as error:
            raise PlanError(f"{where}: malformed plan ({error})") from None

    @classmethod
    def from_yaml(cls, text: str, where: str = "plan") -> "Plan":
        return cls.from_dict(load_yaml_text(text, where, PlanError), where)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        return cls.from_yaml(read_text(path, "plan", PlanError), str(path))

    def save(self, path: str | Path) -> Path:
        """Write the plan atomically to a new file (temp file + rename); never overwrites."""
        return write_new_file(path, self.to_yaml())


def replace_estimate(plan: Plan, estimate: Estimate) -> Plan:
    """The same plan carrying `estimate`."""
    from dataclasses import replace

    return replace(plan, estimate=estimate)


def _estimate(data: Any, where: str) -> Estimate:
    """The `estimate` section of a plan file: every field, numbers finite and not negative (`fits` a bool)."""
    names = [item.name for item in fields(Estimate)]
    if not isinstance(data, dict) or set(data) != set(names):
        raise PlanError(f"{where}: field `estimate`: value {shown(data)} — write gbmw's estimate (fields "
                        f"{', '.join(names)}) or leave it out; `gbmw estimate` recomputes it")
    values = {}
    for name in names:
        value = data[name]
        if name == "fits":
            ok = isinstance(value, bool)
        else:
            items = value if isinstance(value, list) else [value]
            ok = (isinstance(value, list) == name.startswith("stage_") and len(items) <= MAX_DEVICES and all(
                isinstance(item, (int, float)) and not isinstance(item, bool) and 0 <= item < float("inf")
                for item in items))
        if not ok:
            raise PlanError(f"{where}: field `estimate.{name}`: value {shown(value)} — must be "
                            f"{'true or false' if name == 'fits' else 'a finite number ≥ 0 (a list per stage for stage_*)'}")
        values[name] = tuple(value) if isinstance(value, list) else value
    return Estimate(**values)


# ----------------------------------------------------------------------------------------------
# Building plans by hand
# ----------------------------------------------------------------------------------------------


def plan_from_strategy_names(
    model: ModelSpec,
    num_devices: int,
    names: list[str],
    partition: list[int],
    global_batch: int,
    num_micro_batches: int,
    cluster: str = "",
    target: str = "runtime",
) -> Plan:
    """A Plan from per-layer strategy names (`["tp2-dp4", …]`, one per layer) and a partition."""
    if len(names) != model.num_layers:
        raise PlanError(f"{len(names)} strategy names given for {model.num_layers} layers of {model.name}")
    if num_micro_batches < 1 or global_batch % num_micro_batches:
        raise PlanError(
            f"global_batch({global_batch}) is not divisible by num_micro_batches({num_micro_batches})"
        )
    plan = Plan(model=model.name, cluster=cluster, num_devices=num_devices, precision=model.precision,
                global_batch=global_batch, micro_batch=global_batch // num_micro_batches,
                num_micro_batches=num_micro_batches, pp=len(partition), partition=tuple(partition),
                strategies=tuple(Strategy.parse(name) for name in names), target=target,
                provenance={"made_by": "plan_from_strategy_names"})
    plan.check_against(model, num_devices)
    return plan
