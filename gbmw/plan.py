"""The Plan: the only contract between the planner and the adapters (DeepSpeed, Megatron, runtime).

A Plan fixes, for a model on a number of devices: the global batch, how it is cut into pipeline
micro-batches, the pipeline degree and partition (layers per stage), one Strategy per layer, the
target that will run it, the estimate the planner made, and where the plan came from. It is
frozen, validates itself on construction (errors show the arithmetic), and round-trips exactly
through YAML (`Plan.to_yaml` / `Plan.from_yaml`).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from gbmw.errors import GbmwError, PlanError
from gbmw.spec import ModelSpec
from gbmw.space import Strategy, is_power_of_two

TARGETS = ("runtime", "deepspeed", "megatron-deepspeed", "megatron-core")
SCHEDULES = ("1f1b", "gpipe")
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
    schedule: str = "1f1b"
    """Pipeline schedule: `1f1b` (1F1B-flush, the runtime's) or `gpipe` (baselines only)."""
    estimate: Estimate | None = None
    provenance: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """gbmw version, search settings and seconds, or how a hand-written plan was made."""

    def __post_init__(self) -> None:
        problems = []
        if self.target not in TARGETS:
            problems.append(f"target {self.target!r} is not one of {list(TARGETS)}")
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule {self.schedule!r} is not one of {list(SCHEDULES)}")
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


def write_new_file(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically (temp file in the same folder, then rename), refusing to
    replace an existing file: a user's files are never overwritten in place."""
    return write_new_file_bytes(path, text.encode())


def write_new_file_bytes(path: str | Path, data: bytes) -> Path:
    """`write_new_file` for bytes."""
    path = Path(path)
    if path.exists():
        raise GbmwError(f"{path} exists; gbmw does not overwrite files — choose a new name or remove it first")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.link(temporary, path)  # fails if `path` appeared meanwhile: no overwrite even in a race
    except FileExistsError:
        raise GbmwError(f"{path} exists; gbmw does not overwrite files") from None
    finally:
        os.unlink(temporary)
    return path


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


def megatron_partition(model: ModelSpec, pp: int) -> list[int]:
    """Megatron's even split: the same number of Transformer blocks per stage, embeddings on the
    stage of the block that follows them, heads on the stage of the block before them."""
    block_indices = [i for i, layer in enumerate(model.layers) if layer.kind not in ("embedding", "head")]
    if len(block_indices) % pp:
        divisors = [p for p in range(1, len(block_indices) + 1) if len(block_indices) % p == 0 and is_power_of_two(p)]
        raise PlanError(
            f"{model.name} has {len(block_indices)} Transformer blocks, not divisible by pp={pp}; "
            f"an even split needs pp in {divisors}"
        )
    per_stage = len(block_indices) // pp
    stage_of = {}
    for rank, index in enumerate(block_indices):
        stage_of[index] = rank // per_stage
    counts = [0] * pp
    previous_stage = 0
    for index, layer in enumerate(model.layers):
        if index in stage_of:
            stage = previous_stage = stage_of[index]
        elif layer.kind == "embedding":
            following = [stage_of[i] for i in block_indices if i > index]
            stage = following[0] if following else previous_stage
        else:
            stage = previous_stage
        counts[stage] += 1
    return counts


# ----------------------------------------------------------------------------------------------
# What a stock framework can express
# ----------------------------------------------------------------------------------------------


def _describe_runs(plan: Plan) -> str:
    """`layers 0-11 use tp2-dp8 and 12-49 use sdp16` (runs across stage boundaries, first three)."""
    runs: list[list] = []
    for index, strategy in enumerate(plan.strategies):
        if runs and runs[-1][2] == strategy.name:
            runs[-1][1] = index
        else:
            runs.append([index, index, strategy.name])
    parts = [f"{a}-{b} use {name}" if b > a else f"{a} uses {name}" for a, b, name in runs]
    return "layers " + " and ".join(parts[:3]) + (" …" if len(parts) > 3 else "")


def expressibility_problems(plan: Plan, model: ModelSpec, target: str) -> list[str]:
    """Why `target` cannot run `plan` as it is (empty if it can). Targets: deepspeed,
    megatron-deepspeed, megatron-core (the runtime runs anything)."""
    from gbmw.balance import least_spread_partition, uniform_first_partition

    if target == "runtime":
        return []
    if target not in TARGETS:
        return [f"target {target!r} is unknown; targets are {list(TARGETS)}"]
    problems = []
    blocks = [layer.kind not in ("embedding", "head") for layer in model.layers]
    trees = {strategy.dims for strategy in plan.strategies}
    if len(trees) > 1:
        problems.append(f"{_describe_runs(plan)}; a {target} job has one parallel layout for every layer")
    block_ckpt = {strategy.ckpt for strategy, block in zip(plan.strategies, blocks) if block}
    if len(block_ckpt) > 1:
        problems.append(f"some Transformer blocks recompute and others do not; {target} recomputes all blocks or none")
    if any(strategy.ckpt for strategy, block in zip(plan.strategies, blocks) if not block):
        problems.append(f"an embedding or head layer recomputes; {target} recomputes Transformer blocks only")
    if plan.schedule != "1f1b":
        problems.append(f"schedule {plan.schedule}; {target} runs 1F1B")
    names = ", ".join(dict.fromkeys(strategy.name.removesuffix("+ckpt") for strategy in plan.strategies))
    data_axes = {axis for tree in trees for axis, _ in tree if axis != "tp"}
    for tree in trees:
        axes = [axis for axis, _ in tree]
        tree_data = [axis for axis in axes if axis != "tp"]
        if len(tree_data) > 1:
            problems.append(f"a layout mixes {' and '.join(tree_data)}; {target} has one ZeRO stage")
        if "tp" in axes and axes[0] != "tp":
            problems.append(f"a layout puts TP outside data parallelism; {target} places TP on consecutive ranks")
    if target == "deepspeed" and any(axis == "tp" for tree in trees for axis, _ in tree):
        problems.append(f"{names} uses TP; plain DeepSpeed has none — use --target megatron-deepspeed")
    if target in ("deepspeed", "megatron-deepspeed") and plan.pp > 1 and data_axes & {"z2dp", "sdp"}:
        problems.append(f"{names} with pp={plan.pp}: DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 — use "
                        "ZeRO-1")
    if target == "megatron-core" and data_axes - {"dp", "z1dp"}:
        problems.append(f"{names}: megatron-core offers DP or its distributed optimizer (ZeRO-1) — use "
                        "megatron-deepspeed")
    partition = list(plan.partition)
    if plan.pp > 1:
        if target == "deepspeed":
            methods = {"uniform": uniform_first_partition(model.num_layers, plan.pp),
                       "parameters": least_spread_partition(model.arrays.parameter_count, plan.pp)}
            if partition not in methods.values():
                problems.append(f"partition {partition} is none of DeepSpeed's pipeline partitions "
                                f"({', '.join(f'{k}: {v}' for k, v in methods.items())})")
        else:
            try:
                even = megatron_partition(model, plan.pp)
            except GbmwError:
                even = None
            if partition != even and not (target == "megatron-core" and _first_last_shape(plan, model)):
                problems.append(f"partition {partition} is not Megatron's even split of Transformer blocks ({even})"
                                + ("" if target != "megatron-core" else " nor uneven first/last stages with equal middles"))
    return problems


def _first_last_shape(plan: Plan, model: ModelSpec) -> bool:
    """True if only the first and last stages differ from an equal share of blocks (megatron-core)."""
    blocks_per_stage = []
    for first, end in plan.stage_bounds:
        blocks_per_stage.append(sum(layer.kind not in ("embedding", "head") for layer in model.layers[first:end]))
    middle = blocks_per_stage[1:-1]
    return all(count >= 1 for count in blocks_per_stage) and len(set(middle)) <= 1


def check_expressible(plan: Plan, model: ModelSpec, target: str) -> None:
    """Raise PlanError with every reason `target` cannot run `plan`."""
    problems = expressibility_problems(plan, model, target)
    if problems:
        raise PlanError(f"{target} cannot run this plan: " + "; ".join(problems) + " — use --target runtime, or plan "
                        f"again with --target {target}")
