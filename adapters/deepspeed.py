"""Plan → DeepSpeed config (`ds_config.json`), drop-in rewrite of a user's config, and validation by
DeepSpeed itself.

Every key below is DeepSpeed's, as documented in "DeepSpeed Configuration JSON"
(https://www.deepspeed.ai/docs/config-json/) and defined in `deepspeed/runtime/config.py`,
`runtime/zero/config.py` (`DeepSpeedZeroConfig`), `runtime/precision_config.py` and
`runtime/activation_checkpointing/config.py` (checked against deepspeed 0.19.8).

What a Plan becomes (a plan DeepSpeed can run: one layout for every layer, gbmw.targets):

* Batch — DeepSpeed's identity `train_batch_size = train_micro_batch_size_per_gpu ×
  gradient_accumulation_steps × DP`, with DP = N / (TP × PP) the data-parallel size its engine
  takes from the model-parallel unit. A Plan's `micro_batch` counts all DP replicas together, so
  `train_micro_batch_size_per_gpu = micro_batch / DP`; `gradient_accumulation_steps` is the number
  of pipeline micro-batches and `train_batch_size` the global batch.
* `zero_optimization.stage` — from the data-parallel axis: dp → 0, z1dp → 1, z2dp → 2, sdp → 3.
* `activation_checkpointing` — present when the Transformer blocks recompute (CKPT).
* `bf16` / `fp16` — `enabled` from the job's precision; fp32 enables neither.
* `pipeline.activation_checkpoint_interval` (pp > 1) — DeepSpeed's pipeline engine reads this
  section (`get_pipeline_config`): 1 checkpoints every layer of the PipelineModule, 0 leaves the
  module's own setting. The pipeline *partition* is not a config key: it is the PipelineModule's
  `partition_method` argument, which `pipeline_partition_method` names.

DeepSpeed is imported only inside `validate_with_deepspeed` (the planner never imports torch):
`import deepspeed.runtime.config` costs ~3 s on a 2-core CPU machine, ~2.5 s of it torch.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from gbmw.errors import GbmwError, PlanError
from gbmw.files import write_new_file
from gbmw.plan import Plan
from gbmw.stock_partitions import least_spread_partition, uniform_first_partition
from gbmw.targets import AXIS_OF_ZERO_STAGE, ZERO_STAGE_OF_AXIS, get_target
from gbmw.jobs import JobSpec
from gbmw.model_spec import ModelSpec

DEEPSPEED_TARGETS = ("deepspeed", "megatron-deepspeed")
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

OWNED_KEYS: tuple[str, ...] = (
    *BATCH_KEYS,
    "zero_optimization.stage",
    "zero_optimization.overlap_comm",
    "zero_optimization.contiguous_gradients",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_max_live_parameters",
    "activation_checkpointing.partition_activations",
    "activation_checkpointing.contiguous_memory_optimization",
    "activation_checkpointing.cpu_checkpointing",
    "bf16.enabled",
    "fp16.enabled",
    "pipeline.activation_checkpoint_interval",
)
"""Dotted paths of the keys gbmw sets: the ones the plan and its estimate depend on. Everything
else in a user's config — optimizer, scheduler, gradient_clipping, logging, offload, loss-scale
settings, unknown keys, unowned keys inside these sections — is the user's and is kept. An owned
key the plan does not determine (stage-3 tuning under ZeRO-1, say) is left as the user wrote it:
DeepSpeed ignores it there."""

OWNED_SECTIONS: tuple[str, ...] = ("activation_checkpointing",)
"""Sections whose presence gbmw owns: present exactly when the plan recomputes, so a config says
what the plan does (the unowned keys inside, e.g. `profile`, stay when the section stays)."""

OWNED_KEY_ALIASES = {
    "zero_optimization.stage3_prefetch_bucket_size": "zero_optimization.prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold": "zero_optimization.param_persistence_threshold",
    "zero_optimization.stage3_max_live_parameters": "zero_optimization.max_live_parameters",
}
"""Other spellings DeepSpeed's pydantic ZeRO config accepts (`populate_by_name`) for owned keys;
a user's alternative spelling is dropped when gbmw sets the key, so only one value remains."""

_NOT_MODELLED = {
    "zero_optimization.offload_optimizer": "gbmw's estimate keeps optimizer states on the device",
    "zero_optimization.offload_param": "gbmw's estimate keeps parameters on the device",
}


@dataclass(frozen=True)
class _Layout:
    """The one parallel layout a DeepSpeed plan has (the target's check guarantees it is one)."""

    tp: int
    pp: int
    dp: int
    data_parallel_axis: str | None
    ckpt: bool


def _layout(plan: Plan, model: ModelSpec) -> _Layout:
    first = plan.strategies[0]
    axes = [axis for axis, _ in first.dims if axis != "tp"]
    blocks = [s for s, layer in zip(plan.strategies, model.layers) if layer.is_block]
    return _Layout(
        tp=first.tp,
        pp=plan.pp,
        dp=plan.num_devices // (first.tp * plan.pp),
        data_parallel_axis=axes[0] if axes else None,
        ckpt=any(strategy.ckpt for strategy in blocks),
    )


# ----------------------------------------------------------------------------------------------
# Plan → ds_config
# ----------------------------------------------------------------------------------------------


def plan_to_ds_config(plan: Plan, job: JobSpec, target: str = "deepspeed") -> dict[str, Any]:
    """The DeepSpeed config for `plan`: a new plain JSON-able dict holding only `OWNED_KEYS`.

    Raises PlanError with the target's reasons when `target` ("deepspeed", or
    "megatron-deepspeed" which adds Megatron TP) cannot run the plan, or when the plan is not for
    this job. For pp > 1, pass `pipeline_partition_method(plan, model)` to the PipelineModule.
    """
    if target not in DEEPSPEED_TARGETS:
        raise PlanError(f"target {target!r}: a DeepSpeed config serves {list(DEEPSPEED_TARGETS)}")
    _check_plan_is_for(plan, job)
    get_target(target).check(plan, job.model)
    layout = _layout(plan, job.model)
    stage = ZERO_STAGE_OF_AXIS[layout.data_parallel_axis] if layout.data_parallel_axis else 0
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch // layout.dp,
        "gradient_accumulation_steps": plan.num_micro_batches,
        "zero_optimization": _zero_section(stage, job.model, layout.tp),
        "bf16": {"enabled": job.precision == "bf16"},
        "fp16": {"enabled": job.precision == "fp16"},
    }
    if layout.ckpt:
        config["activation_checkpointing"] = _activation_checkpointing_section()
    if plan.pp > 1:
        config["pipeline"] = {"activation_checkpoint_interval": 1 if layout.ckpt else 0}
    return config


def _check_plan_is_for(plan: Plan, job: JobSpec) -> None:
    if plan.model != job.model.name:
        raise PlanError(f"the plan is for model {plan.model!r} but job {job.name} trains {job.model.name!r}")
    if plan.precision != job.precision:
        raise PlanError(
            f"the plan was made for {plan.precision} but job {job.name} trains in {job.precision}; plan again"
        )
    plan.check_against(job.model, job.cluster.num_devices)


def _zero_section(stage: int, model: ModelSpec, tp: int) -> dict[str, Any]:
    """`zero_optimization` (DeepSpeedZeroConfig).

    stage >= 1: `overlap_comm` true — the estimate overlaps backward gradient communication with
    compute (DeepSpeed's default is true only for stage 3); `contiguous_gradients` true (its
    default, stated); `reduce_bucket_size` = hidden² elements, HF Transformers' rule for "auto"
    (DeepSpeed's default 5e8 elements is a 2 GB fp32 bucket the estimate does not count).
    stage 3 adds HF's `stage3_prefetch_bucket_size` = 0.9·hidden² and
    `stage3_param_persistence_threshold` = 10·hidden (norms and biases stay unsharded), and
    `stage3_max_live_parameters` = the largest layer's parameters on one device: the estimate
    holds one gathered layer at a time (cost.py), DeepSpeed's default 1e9 lets several stay.
    """
    section: dict[str, Any] = {"stage": stage}
    if stage == 0:
        return section
    hidden = model.hidden_size
    section.update(overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=hidden * hidden)
    if stage == 3:
        local = [layer.parameter_count - layer.tp_split_parameter_count + math.ceil(layer.tp_split_parameter_count / tp)
                 for layer in model.layers]
        section.update(
            stage3_prefetch_bucket_size=int(0.9 * hidden * hidden),
            stage3_param_persistence_threshold=10 * hidden,
            stage3_max_live_parameters=max(local),
        )
    return section


def _activation_checkpointing_section() -> dict[str, Any]:
    """`activation_checkpointing` (DeepSpeedActivationCheckpointingConfig), as the estimate models
    CKPT: each block stashes its whole input on every TP rank (`partition_activations` false), on
    the device (`cpu_checkpointing` false), with no preallocated checkpoint buffer
    (`contiguous_memory_optimization` false, so `number_checkpoints` is not needed). The section
    configures `deepspeed.checkpointing`; the model (or PipelineModule) chooses what to recompute."""
    return {"partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False}


# ----------------------------------------------------------------------------------------------
# Pipeline partition
# ----------------------------------------------------------------------------------------------


# DeepSpeed's partition methods are gbmw.stock_partitions' rules (the planner needs them without torch);
# tests/test_deepspeed_adapter.py checks them against DeepSpeed's own functions.
deepspeed_partition_uniform = uniform_first_partition
deepspeed_partition_balanced = least_spread_partition


def deepspeed_partitions(model: ModelSpec, pp: int, target: str = "deepspeed") -> dict[str, list[int]]:
    """The partition each PipelineModule method of `target` gives `model` over `pp` stages (gbmw.targets):
    `uniform` and `parameters` for DeepSpeed; `type:transformer` for Megatron-DeepSpeed, whose GPTModelPipe
    balances the count of ParallelTransformerLayerPipe layers — Megatron's even split of blocks."""
    return {method: list(partition) for method, partition in get_target(target).partitions(model, pp).items()}


def pipeline_partition_method(plan: Plan, model: ModelSpec, target: str | None = None) -> str:
    """The PipelineModule `partition_method` that reproduces `plan.partition`: "uniform" or
    "parameters" for DeepSpeed, "type:transformer" for Megatron-DeepSpeed (its GPTModelPipe
    hard-codes it). `target` defaults to the plan's when that is a DeepSpeed target, else
    "deepspeed". PlanError if no method gives the plan's partition."""
    if target is None:
        target = plan.target if plan.target in DEEPSPEED_TARGETS else "deepspeed"
    if target not in DEEPSPEED_TARGETS:
        raise PlanError(f"target {target!r}: pipeline partition methods exist for {list(DEEPSPEED_TARGETS)}")
    method = get_target(target).partition_method(model, plan.partition)
    if method is not None:
        return method
    methods = deepspeed_partitions(model, plan.pp, target)
    offered = "; ".join(f"{method}: {partition}" for method, partition in methods.items())
    raise PlanError(
        f"partition {list(plan.partition)} is what no {target} PipelineModule partition_method gives ({offered}); "
        f"plan again with --target {target} or run it with --target runtime"
    )


# ----------------------------------------------------------------------------------------------
# A user's config: loading, batch consistency, drop-in merge
# ----------------------------------------------------------------------------------------------


def load_user_config(path: str | Path) -> dict[str, Any]:
    """Read a user's ds_config: one GbmwError for a missing file, invalid JSON (line, column), a
    duplicate key (DeepSpeed refuses those) or a value that is not an object. DeepSpeed reads
    configs with hjson, so a file with comments is accepted when hjson is installed; it is written
    back as plain JSON (comments are not kept)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise GbmwError(f"{path}: no such DeepSpeed config file") from None
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise GbmwError(f"{path}: cannot read the DeepSpeed config ({reason})") from None
    try:
        data = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except json.JSONDecodeError as error:
        data = _hjson_or_none(text)
        if data is None:
            raise GbmwError(
                f"{path}: not valid JSON at line {error.lineno}, column {error.colno}: {error.msg}"
            ) from None
    except _DuplicateKey as error:
        raise GbmwError(f"{path}: key {error.args[0]!r} appears twice in one object; DeepSpeed refuses that") from None
    if not isinstance(data, dict):
        raise GbmwError(
            f"{path}: a DeepSpeed config is a JSON object ({{...}}), this file holds a {type(data).__name__}"
        )
    return data


class _DuplicateKey(Exception):
    pass


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _hjson_or_none(text: str) -> Any:
    try:
        import hjson  # DeepSpeed's own reader; installed with deepspeed
    except ImportError:
        return None
    try:
        return hjson.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except Exception:  # noqa: BLE001 - any hjson failure means "not readable"; json's message is reported
        return None


def _batch_value(config: dict[str, Any], key: str) -> int | None:
    """A batch key's value; None when absent or "auto" (HF Trainer fills those in)."""
    value = config.get(key)
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GbmwError(f"{key}: value {value!r} — must be a positive integer")
    return value


def resolve_batch(config: dict[str, Any], data_parallel: int) -> tuple[int, int, int]:
    """(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps) as DeepSpeed
    completes them when one or two are given (DeepSpeedConfig._set_batch_related_parameters)."""
    train, micro, accum = (_batch_value(config, key) for key in BATCH_KEYS)
    if train is not None and micro is not None and accum is None:
        accum = train // micro // data_parallel
    elif train is not None and accum is not None and micro is None:
        micro = train // data_parallel // accum
    elif micro is not None and accum is not None and train is None:
        train = micro * accum * data_parallel
    elif train is not None and micro is None and accum is None:
        accum, micro = 1, train // data_parallel
    elif micro is not None and train is None and accum is None:
        train, accum = micro * data_parallel, 1
    elif train is None and micro is None:
        raise GbmwError("the DeepSpeed config sets neither train_batch_size nor train_micro_batch_size_per_gpu")
    return train, micro, accum  # type: ignore[return-value]


def batch_consistency_problems(config: dict[str, Any], world_size: int, mp_size: int = 1) -> list[str]:
    """Why DeepSpeed would refuse the config's batch keys on `world_size` devices with model
    parallelism `mp_size` (TP × PP): its identity train_batch_size = micro × accumulation × DP
    with DP = world_size / mp_size. Empty when consistent, or when any of them is "auto"."""
    if mp_size < 1 or world_size % mp_size:
        return [f"world_size({world_size}) is not a multiple of the model-parallel size mp_size({mp_size})"]
    data_parallel = world_size // mp_size
    if any(config.get(key) == "auto" for key in BATCH_KEYS):
        return []  # HF Trainer fills "auto" batch keys consistently before DeepSpeed sees them
    try:
        train, micro, accum = resolve_batch(config, data_parallel)
    except GbmwError as error:
        return [str(error)]
    if micro < 1 or accum < 1 or train != micro * accum * data_parallel:
        return [
            f"train_batch_size({train}) != train_micro_batch_size_per_gpu({micro}) * "
            f"gradient_accumulation_steps({accum}) * data-parallel size({data_parallel}) = "
            f"{micro * accum * data_parallel}, where data-parallel size = "
            f"world_size({world_size}) / mp_size({mp_size})"
        ]
    return []


def check_batch_consistency(config: dict[str, Any], world_size: int, mp_size: int = 1,
                            where: str = "ds_config") -> None:
    """Raise one GbmwError with `batch_consistency_problems`, if any."""
    problems = batch_consistency_problems(config, world_size, mp_size)
    if problems:
        raise GbmwError(f"{where}: inconsistent batch sizes: " + "; ".join(problems))


def merge_into_user_config(user: dict[str, Any], generated: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A new config: `user` with gbmw's `generated` keys written over it, and one human-readable
    line per change ("zero_optimization.stage: 3 -> 1", "activation_checkpointing: added").

    Only `OWNED_KEYS` (and the presence of `OWNED_SECTIONS`) are taken from `generated`; every
    other key of `user`, at any depth, is kept as it was. `user` is never modified. A user's
    `bfloat16` section (DeepSpeed's old name) becomes `bf16`; a user's alternative spelling of an
    owned ZeRO key is dropped. Notes flag kept settings the estimate does not model (offload).
    """
    if not isinstance(user, dict) or not isinstance(generated, dict):
        raise GbmwError("a DeepSpeed config is a JSON object; merge_into_user_config takes two dicts")
    result = copy.deepcopy(user)
    changes: list[str] = []
    if "bfloat16" in result and "bf16" not in result and _has(generated, "bf16.enabled"):
        result["bf16"] = result.pop("bfloat16")
        changes.append("bfloat16: renamed to bf16 (DeepSpeed's current name)")
    for section in OWNED_SECTIONS:
        if section in result and section not in generated:
            del result[section]
            changes.append(f"{section}: removed (the plan recomputes no layer)")
    added_sections: set[str] = set()
    for path in OWNED_KEYS:
        if not _has(generated, path):
            continue
        new = _get(generated, path)
        section = path.split(".")[0]
        if "." in path and section not in added_sections:
            if section in result and not isinstance(result[section], dict):
                changes.append(f"{section}: {_show(result.pop(section))} replaced by an object")
            if section not in result:
                added_sections.add(section)
                changes.append(f"{section}: added")
        if _has(result, path):
            old = _get(result, path)
            if old != new or type(old) is not type(new):
                changes.append(f"{path}: {_show(old)} -> {_show(new)}")
        elif section not in added_sections:
            changes.append(f"{path}: added ({_show(new)})")
        _set(result, path, new)
        alias = OWNED_KEY_ALIASES.get(path)
        if alias and _has(result, alias):
            changes.append(f"{alias}: removed ({_show(_get(result, alias))}); gbmw sets it as {path.split('.')[-1]}")
            _delete(result, alias)
    for path, why in _NOT_MODELLED.items():
        setting = _get(result, path) if _has(result, path) else None
        if isinstance(setting, dict) and str(setting.get("device", "none")).lower() != "none":
            changes.append(f"note: {path} kept from your config; {why}, so memory use will be lower and steps slower")
    return result, _unique(changes)


def _unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def _show(value: Any) -> str:
    return json.dumps(value)


def _has(config: dict[str, Any], path: str) -> bool:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _get(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        node = node[part]
    return node


def _set(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = copy.deepcopy(value)


def _delete(config: dict[str, Any], path: str) -> None:
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
        node = node[part]
    del node[leaf]


def dumps_config(config: dict[str, Any]) -> str:
    """The config as written to a file: JSON, 2-space indent, keys in order, final newline."""
    return json.dumps(config, indent=2) + "\n"


def write_ds_config(path: str | Path, config: dict[str, Any]) -> Path:
    """Write the config to a new file, atomically; never overwrites (gbmw.plan.write_new_file)."""
    return write_new_file(path, dumps_config(config))


# ----------------------------------------------------------------------------------------------
# ds_config → plan fields (round trips)
# ----------------------------------------------------------------------------------------------


def ds_config_to_plan_fields(config: dict[str, Any], world_size: int, tp: int = 1, pp: int = 1) -> dict[str, Any]:
    """The Plan fields a ds_config fixes, for `world_size` devices with TP `tp` and PP `pp`:
    global_batch, micro_batch (all DP replicas), num_micro_batches, data_parallel_axis (dp, z1dp,
    z2dp, sdp; None when DP = 1), zero_stage, ckpt and precision. Missing batch keys are completed
    as DeepSpeed completes them."""
    if tp < 1 or pp < 1 or world_size % (tp * pp):
        raise GbmwError(f"world_size({world_size}) % (tp({tp}) * pp({pp})) != 0")
    data_parallel = world_size // (tp * pp)
    check_batch_consistency(config, world_size, tp * pp)
    train, micro, accum = resolve_batch(config, data_parallel)
    zero = config.get("zero_optimization", {})
    if isinstance(zero, bool):  # DeepSpeed's deprecated form: true means stage 1
        zero = {"stage": int(zero)}
    stage = int(zero.get("stage", 0)) if isinstance(zero, dict) else 0
    if stage not in AXIS_OF_ZERO_STAGE:
        raise GbmwError(f"zero_optimization.stage: value {stage!r} — DeepSpeed's stages are 0, 1, 2 and 3")
    bf16 = config.get("bf16", config.get("bfloat16", {}))
    interval = config.get("pipeline", {}).get("activation_checkpoint_interval", 0) if pp > 1 else 0
    return {
        "global_batch": train,
        "micro_batch": micro * data_parallel,
        "num_micro_batches": accum,
        "data_parallel_axis": AXIS_OF_ZERO_STAGE[stage] if data_parallel > 1 else None,
        "zero_stage": stage,
        "ckpt": "activation_checkpointing" in config or bool(interval),
        "precision": "bf16" if bf16.get("enabled") else "fp16" if config.get("fp16", {}).get("enabled") else "fp32",
    }


def plan_layout(plan: Plan, model: ModelSpec) -> tuple[int, int, int]:
    """(tp, pp, dp) of a plan DeepSpeed can run — the arguments `validate_with_deepspeed` needs."""
    layout = _layout(plan, model)
    return layout.tp, layout.pp, layout.dp


# ----------------------------------------------------------------------------------------------
# Validation by DeepSpeed itself
# ----------------------------------------------------------------------------------------------


class _ModelParallelUnit:
    """The Megatron-style `mpu` DeepSpeed's engine takes; DeepSpeedConfig reads its data-parallel
    world size for the batch identity."""

    def __init__(self, world_size: int, model_parallel: int):
        self.world_size, self.model_parallel = world_size, model_parallel

    def get_model_parallel_world_size(self) -> int:
        return self.model_parallel

    def get_data_parallel_world_size(self) -> int:
        return self.world_size // self.model_parallel

    def get_model_parallel_rank(self) -> int:
        return 0

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_sequence_parallel_world_size(self) -> int:
        return 1


@contextlib.contextmanager
def _standing_in_for_process_group(world_size: int) -> Iterator[None]:
    """Rank 0 of `world_size` for `deepspeed.comm` while the block runs, then the real functions.

    DeepSpeedConfig asks `deepspeed.comm.get_rank()` first; with no process group that raises and
    DeepSpeed silently validates as world size 1, ignoring the mpu. Only these two module
    attributes are replaced; nothing is initialised."""
    import deepspeed.comm as ds_comm

    saved = {name: getattr(ds_comm, name) for name in ("get_rank", "get_world_size")}
    ds_comm.get_rank = lambda group=None: 0
    ds_comm.get_world_size = lambda group=None: world_size
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(ds_comm, name, function)


def validate_with_deepspeed(config: dict[str, Any], world_size: int, tp: int = 1, pp: int = 1) -> Any:
    """Parse `config` with DeepSpeed's own `DeepSpeedConfig` as rank 0 of `world_size` devices with
    model parallelism TP × PP (DP = world_size / (tp × pp)), with no process group. Returns the
    DeepSpeedConfig; DeepSpeed's refusal becomes one GbmwError naming the key."""
    if tp < 1 or pp < 1 or world_size % (tp * pp):
        raise GbmwError(f"world_size({world_size}) % (tp({tp}) * pp({pp})) != 0")
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError as error:
        raise GbmwError(f"validating a DeepSpeed config needs deepspeed (install gbmw[runtime]): {error}") from None
    data_parallel = world_size // (tp * pp)
    try:
        with _standing_in_for_process_group(world_size):
            parsed = DeepSpeedConfig(copy.deepcopy(config), mpu=_ModelParallelUnit(world_size, tp * pp))
    except Exception as error:  # noqa: BLE001 - DeepSpeed raises Assertion/Value/Type/pydantic errors alike
        raise GbmwError(f"DeepSpeed refuses the config: {_describe_deepspeed_error(error, config)}") from None
    if parsed.world_size != data_parallel:
        raise GbmwError(
            f"DeepSpeed validated with data-parallel size {parsed.world_size}, not {data_parallel}: the "
            "process-group stand-in no longer works with this DeepSpeed version"
        )
    return parsed


_SECTION_OF_MODEL = {
    "DeepSpeedZeroConfig": "zero_optimization",
    "DeepSpeedFP16Config": "fp16",
    "DeepSpeedBF16Config": "bf16",
    "DeepSpeedZeroOffloadParamConfig": "zero_optimization.offload_param",
    "DeepSpeedZeroOffloadOptimizerConfig": "zero_optimization.offload_optimizer",
}


def _describe_deepspeed_error(error: Exception, config: dict[str, Any]) -> str:
    """`KEY: what DeepSpeed said`, the key found from the pydantic location or the message."""
    details = getattr(error, "errors", None)
    if callable(details):
        try:
            items = details()
        except Exception:  # noqa: BLE001
            items = []
        section = _SECTION_OF_MODEL.get(getattr(error, "title", ""), "")
        lines = []
        for item in items:
            key = ".".join([section] * bool(section) + [str(part) for part in item.get("loc", ())])
            lines.append(f"{key or section}: {item.get('msg', '')} (value {_short(item.get('input'))})")
        if lines:
            return "; ".join(lines)
    message = str(error).strip() or type(error).__name__
    key = _key_named_in(message, config)
    return f"{key}: {message}" if key else message


def _key_named_in(message: str, config: dict[str, Any]) -> str | None:
    lowered = message.lower()
    if "batch" in lowered:
        return "train_batch_size"
    if "bfloat16 and fp16" in lowered:
        return "bf16.enabled / fp16.enabled"
    paths = [path for path in _paths(config) if path.split(".")[-1] in message]
    return max(paths, key=len) if paths else None


def _paths(config: dict[str, Any], prefix: str = "") -> list[str]:
    result = []
    for key, value in config.items():
        path = f"{prefix}{key}"
        result.append(path)
        if isinstance(value, dict):
            result += _paths(value, path + ".")
    return result


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
