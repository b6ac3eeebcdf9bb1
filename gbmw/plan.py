"""The Plan: the only contract between the planner and the adapters (DeepSpeed, Megatron, runtime).

A Plan fixes, for a model on a number of devices: the global batch, how it is cut into pipeline
micro-batches, the pipeline degree and partition (layers per stage), one Strategy per layer, the
target that will run it, the estimate the planner made, and where the plan came from. It is
frozen, validates itself on construction (errors show the arithmetic), and round-trips exactly
through YAML (`Plan.to_yaml` / `Plan.from_yaml`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from gbmw.errors import GbmwError, PlanError
from gbmw.files import write_new_file
from gbmw.model_spec import ModelSpec
from gbmw.pipeline_schedules import SCHEDULES
from gbmw.space import Strategy
from gbmw.targets import TARGETS

PLAN_FORMAT_VERSION = 1


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
    """What will run it (gbmw.targets): runtime, deepspeed, megatron-deepspeed or megatron-core."""
    schedule: str = "1f1b"
    """Pipeline schedule: `1f1b` (1F1B-flush, the runtime's) or `gpipe` (baselines only)."""
    virtual_stages: int = 1
    """Model chunks per pipeline device: > 1 is interleaved 1F1B (Megatron's virtual pipeline stages), each
    stage's Transformer blocks cut into that many equal chunks (gbmw.pipeline_schedules)."""
    estimate: Estimate | None = None
    provenance: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """gbmw version, search settings and seconds, or how a hand-written plan was made."""

    def __post_init__(self) -> None:
        problems = []
        if self.target not in TARGETS:
            problems.append(f"target {self.target!r} is not one of {list(TARGETS)}")
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule {self.schedule!r} is not one of {list(SCHEDULES)}")
        if self.virtual_stages < 1:
            problems.append(f"virtual_stages {self.virtual_stages}: must be at least 1 (1 = plain 1F1B)")
        elif self.virtual_stages > 1 and (self.schedule != "1f1b" or self.pp < 2):
            problems.append(f"virtual_stages {self.virtual_stages} interleaves a 1F1B pipeline; it needs schedule "
                            f"1f1b and pp ≥ 2 (schedule {self.schedule}, pp {self.pp})")
        if self.pp < 1 or self.num_devices % self.pp != 0:
            problems.append(f"num_devices({self.num_devices}) % pp({self.pp}) != 0: stages need equal device groups")
        if len(self.partition) != self.pp:
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

    def check_against(self, model: ModelSpec, num_devices: int | None = None) -> None:
        """Raise PlanError if the plan does not fit this model (and device count)."""
        if len(self.strategies) != model.num_layers:
            raise PlanError(
                f"plan has {len(self.strategies)} layer strategies but model {model.name} has {model.num_layers} layers"
            )
        if num_devices is not None and num_devices != self.num_devices:
            raise PlanError(
                f"plan is for {self.num_devices} devices but {num_devices} are available; "
                f"plan again for {num_devices} devices (gbmw plan) or run on {self.num_devices}"
            )
        for layer, strategy in zip(model.layers, self.strategies):
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
                data["estimate"] = None if value is None else _plain(asdict(value))
            elif item.name == "virtual_stages" and value == 1:
                continue  # plain 1F1B: the field is written only for interleaved pipelines
            else:
                data[item.name] = _plain(value)
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
            raise PlanError(f"{where}: unknown field(s) {unknown}; fields are {sorted(known)}")
        required = ["model", "cluster", "num_devices", "precision", "global_batch", "micro_batch",
                    "num_micro_batches", "pp", "partition", "strategies"]
        missing = [name for name in required if name not in data]
        if missing:
            raise PlanError(f"{where}: field(s) {missing} are required")
        try:
            strategies: list[Strategy] = []
            for index, run in enumerate(data["strategies"]):
                if not isinstance(run, dict) or set(run) != {"strategy", "layers"}:
                    raise PlanError(
                        f"{where}: field `strategies[{index}]`: value {run!r} — write "
                        "{strategy: NAME, layers: COUNT}"
                    )
                strategies += [Strategy.parse(str(run["strategy"]))] * int(run["layers"])
            estimate = data.get("estimate")
            if estimate is not None:
                estimate = Estimate(**{
                    key: tuple(value) if isinstance(value, list) else value for key, value in estimate.items()
                })
            integers = {name: _integer(data[name], name, where) for name in
                        ("num_devices", "global_batch", "micro_batch", "num_micro_batches", "pp")}
            integers["virtual_stages"] = _integer(data.get("virtual_stages", 1), "virtual_stages", where)
            return cls(
                model=str(data["model"]),
                cluster=str(data["cluster"]),
                precision=str(data["precision"]),
                partition=tuple(_integer(v, "partition", where) for v in data["partition"]),
                strategies=tuple(strategies),
                target=str(data.get("target", "runtime")),
                schedule=str(data.get("schedule", "1f1b")),
                estimate=estimate,
                provenance=dict(data.get("provenance") or {}),
                **integers,
            )
        except GbmwError as error:
            message = str(error)
            raise PlanError(message if message.startswith(where) else f"{where}: {message}") from None
        except (TypeError, ValueError) as error:
            raise PlanError(f"{where}: malformed plan ({error})") from None

    @classmethod
    def from_yaml(cls, text: str, where: str = "plan") -> "Plan":
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise PlanError(f"{where}: not valid YAML{at}: {getattr(error, 'problem', error)}") from None
        return cls.from_dict(data, where)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as error:
            raise PlanError(f"{path}: cannot read the plan ({error.strerror})") from None
        return cls.from_yaml(text, str(path))

    def save(self, path: str | Path) -> Path:
        """Write the plan atomically to a new file (temp file + rename); never overwrites."""
        return write_new_file(path, self.to_yaml())


def replace_estimate(plan: Plan, estimate: Estimate) -> Plan:
    """The same plan carrying `estimate`."""
    from dataclasses import replace

    return replace(plan, estimate=estimate)


def _integer(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{where}: field `{name}`: value {value!r} — must be an integer")
    return value


def _plain(value: Any) -> Any:
    """Tuples to lists and numpy scalars to Python numbers, for safe_dump."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


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
    plan = Plan(
        model=model.name,
        cluster=cluster,
        num_devices=num_devices,
        precision=model.precision,
        global_batch=global_batch,
        micro_batch=global_batch // num_micro_batches,
        num_micro_batches=num_micro_batches,
        pp=len(partition),
        partition=tuple(partition),
        strategies=tuple(Strategy.parse(name) for name in names),
        target=target,
        provenance={"made_by": "plan_from_strategy_names"},
    )
    plan.check_against(model, num_devices)
    return plan
