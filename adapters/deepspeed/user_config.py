"""A user's ds_config: the keys gbmw owns, reading (duplicate keys, hjson), batch-size resolution
and consistency, the drop-in merge with one line per change, and writing."""

from __future__ import annotations

import copy
import difflib
import json
import math
from pathlib import Path
from typing import Any

from gbmw.errors import GbmwError
from gbmw.specs.files import check_bounds, read_text, shown, write_new_file

from .kept_settings import USER_TUNED_KEYS, grad_accum_dtype_change, in_users_spelling, user_tuned

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
    "sequence_parallel_size",
    "tensor_parallel.autotp_size",
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


# ----------------------------------------------------------------------------------------------
# A user's config: loading, batch consistency, drop-in merge
# ----------------------------------------------------------------------------------------------


def load_user_config(path: str | Path) -> dict[str, Any]:
    """Read a user's ds_config: one GbmwError for a missing file, invalid JSON (line, column), a
    duplicate key (DeepSpeed refuses those) or a value that is not an object. DeepSpeed reads
    configs with hjson, so a file with comments is accepted when hjson is installed; it is written
    back as plain JSON (comments are not kept)."""
    path = Path(path)
    text = read_text(path, "DeepSpeed config file", GbmwError)
    try:
        data = json.loads(text, object_pairs_hook=_refuse_duplicate_keys, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        data = _hjson_or_none(text)
        if data is None:
            raise GbmwError(
                f"{path}: not valid JSON at line {error.lineno}, column {error.colno}: {error.msg}"
            ) from None
    except _DuplicateKey as error:
        raise GbmwError(f"{path}: key {shown(error.args[0])} appears twice in one object; DeepSpeed refuses that") from None
    except ValueError as error:  # NaN / Infinity
        raise GbmwError(f"{path}: {error}") from None
    except RecursionError:
        raise GbmwError(f"{path}: nested too deeply to be a DeepSpeed config") from None
    if not isinstance(data, dict):
        raise GbmwError(
            f"{path}: a DeepSpeed config is a JSON object ({{...}}), this file holds a {type(data).__name__}"
        )
    check_bounds(data, str(path), GbmwError)
    check_user_config(data, str(path))
    return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number DeepSpeed accepts; write a finite number")


DEEPSPEED_KEYS_NEAR_OWNED = ("bfloat16", "amp", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
                             "min_batch_size", "max_train_batch_size", "min_train_batch_size",
                             "max_train_micro_batch_size_per_gpu", "min_train_micro_batch_size_per_gpu")
"""Keys DeepSpeed reads that resemble a key gbmw owns (`bfloat16` is `bf16`'s other spelling; the batch bounds are
elasticity's and autotuning's): never taken for a misspelling."""


def misspelt_owned_key(key: str) -> str | None:
    """The top-level key gbmw owns that `key` is a near miss of (difflib ratio ≥ 0.85: `zero_optimisation`,
    `train_batch_sizes`), or None; DeepSpeed's own keys are never near misses."""
    owned = sorted({path.split(".")[0] for path in OWNED_KEYS})
    if key in owned or key in DEEPSPEED_KEYS_NEAR_OWNED:
        return None
    close = difflib.get_close_matches(key, owned, n=1, cutoff=0.85)
    return close[0] if close else None


def check_user_config(config: dict[str, Any], where: str = "ds_config") -> None:
    """Refuse, with one GbmwError naming the key, the value and what DeepSpeed accepts, every key gbmw reads whose
    value DeepSpeed would refuse or that would be read wrongly (DeepSpeed's own DeepSpeedConfig runs on the merged
    config later; these are the keys the costing of the current configuration depends on)."""

    def refuse(key: str, value: Any, allowed: str) -> None:
        raise GbmwError(f"{where}: key `{key}`: value {shown(value)} — {allowed}")

    for key in config:
        meant = misspelt_owned_key(key)
        if meant:
            raise GbmwError(f"{where}: key `{key}` is not DeepSpeed's — did you mean `{meant}`? DeepSpeed ignores "
                            f"keys it does not know, so this setting would silently not apply")

    for key in BATCH_KEYS:
        value = config.get(key)
        if value is not None and value != "auto" and (
                isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH):
            refuse(key, value, f"must be an integer from 1 to {MAX_BATCH}, or \"auto\"")
    for key in ("zero_optimization", "optimizer", "scheduler", "activation_checkpointing", "pipeline",
                *PRECISION_SECTIONS):
        if key in config and not isinstance(config[key], dict):
            example = {"zero_optimization": '{"stage": 1}', "optimizer": '{"type": "Adam", "params": {…}}',
                       "scheduler": '{"type": "WarmupLR", "params": {…}}'}.get(key, '{"enabled": true}')
            refuse(key, config[key], f"must be an object, e.g. \"{key}\": {example}")
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        refuse("zero_optimization.stage", stage, "ZeRO stages are the integers 0, 1, 2 and 3")
    optimizer = config.get("optimizer")
    if optimizer is not None and not isinstance(optimizer.get("type", ""), str):
        refuse("optimizer.type", optimizer.get("type"), 'must be a name, e.g. "Adam" or "AdamW"')
    params = (optimizer or {}).get("params", {})
    if not isinstance(params, dict):
        refuse("optimizer.params", params, 'must be an object, e.g. {"lr": 1e-4}')
    for key in ("lr", "weight_decay", "eps"):
        if key in params and params[key] != "auto" and not _finite_at_least(params[key], 0):
            refuse(f"optimizer.params.{key}", params[key], 'must be a number ≥ 0, or "auto"')
    if "gradient_clipping" in config and config["gradient_clipping"] != "auto" and not _finite_at_least(
            config["gradient_clipping"], 0):
        refuse("gradient_clipping", config["gradient_clipping"], 'must be a number ≥ 0 (0 = off), or "auto"')
    enabled = []
    for key in PRECISION_SECTIONS:
        value = config.get(key, {}).get("enabled", False)
        if value not in (True, False, "auto"):
            refuse(f"{key}.enabled", value, 'must be true, false or "auto"')
        if value is True:  # "auto": HF Trainer's --bf16 / --fp16 decide, and enable at most one
            enabled.append(key)
    if "bf16" in config and "bfloat16" in config:
        raise GbmwError(f"{where}: both `bf16` and `bfloat16` (its old name) are present; keep `bf16` only")
    if len(enabled) > 1:
        raise GbmwError(f"{where}: {' and '.join(enabled)} are both enabled; DeepSpeed trains in one 16-bit "
                        "precision — enable one")


def _finite_at_least(value: Any, low: float) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value >= low)


MAX_BATCH = 2**20
"""Largest batch value read from a ds_config (gbmw.specs.schema.MAX_GLOBAL_BATCH)."""
PRECISION_SECTIONS = ("fp16", "bf16", "bfloat16")


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
    other key of `user`, at any depth, is kept as it was. `user` is never modified. What the merge
    keeps although gbmw owns it, and changes although gbmw does not, is gbmw.adapters.deepspeed.kept_settings:
    bucket sizes the user set, the `bfloat16` spelling, `grad_accum_dtype` under ZeRO-0. A user's alternative
    spelling of an owned ZeRO key is dropped. Notes flag kept settings the estimate does not model (offload).
    """
    if not isinstance(user, dict) or not isinstance(generated, dict):
        raise GbmwError("a DeepSpeed config is a JSON object; merge_into_user_config takes two dicts")
    result = copy.deepcopy(user)
    changes: list[str] = []
    for section in OWNED_SECTIONS:
        if section in result and section not in generated:
            del result[section]
            changes.append(f"{section}: removed (the plan recomputes no layer)")
    added_sections: set[str] = set()
    for owned in OWNED_KEYS:
        if not _has(generated, owned):
            continue
        if owned in USER_TUNED_KEYS and user_tuned(user, owned, OWNED_KEY_ALIASES):
            if not (_has(user, owned) and _get(user, owned) == _get(generated, owned)):
                changes.append(f"note: {owned} kept from your config; the estimate counts gbmw's "
                               f"{_show(_get(generated, owned))}")
            continue
        new = _get(generated, owned)
        path = in_users_spelling(owned, user)
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
        alias = OWNED_KEY_ALIASES.get(owned)
        if alias and _has(result, alias):
            changes.append(f"{alias}: removed ({_show(_get(result, alias))}); gbmw sets it as {path.split('.')[-1]}")
            _delete(result, alias)
    precision = "bf16" if _enabled_in(generated, "bf16") else "fp16" if _enabled_in(generated, "fp16") else "fp32"
    accumulation = grad_accum_dtype_change(result, precision, int(_get(generated, "zero_optimization.stage"))
                                           if _has(generated, "zero_optimization.stage") else 0)
    if accumulation:
        changes.append(accumulation)
    for path, why in _NOT_MODELLED.items():
        setting = _get(result, path) if _has(result, path) else None
        if isinstance(setting, dict) and str(setting.get("device", "none")).lower() != "none":
            changes.append(f"note: {path} kept from your config; {why}, so memory use will be lower and steps slower")
    return result, _unique(changes)


def _enabled_in(config: dict[str, Any], section: str) -> bool:
    return _has(config, f"{section}.enabled") and _get(config, f"{section}.enabled") is True


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
