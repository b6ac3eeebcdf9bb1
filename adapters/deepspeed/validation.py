"""Validation by DeepSpeed itself: its own DeepSpeedConfig parses the config, with a Megatron-style
mpu and a process-group stand-in, and its refusal becomes one GbmwError naming the key.

This module sits inside the package gbmw.adapters.deepspeed, yet `import deepspeed...` below is
an absolute import (no relative imports without a leading dot): it always resolves to the
third-party DeepSpeed library, never to this package. Keep it that way: write `from . import …`
for gbmw's own modules."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import re
from typing import Any, Iterable, Iterator

from gbmw.errors import GbmwError

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


@contextlib.contextmanager
def deepspeed_warnings_as_notes(notes: list[str]) -> Iterator[None]:
    """DeepSpeed's warnings while the block runs (its logger "DeepSpeed": a deprecated key, a setting it ignores)
    become notes, `DeepSpeed: …`, instead of log lines printed before gbmw's output — or before its one-line error."""
    logger = logging.getLogger("DeepSpeed")

    def keep(record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            line = f"DeepSpeed: {' '.join(record.getMessage().split())}"
            if line not in notes:
                notes.append(line)
            return False
        return True

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


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


def _describe_deepspeed_error(error: Exception, config: dict[str, Any], known_keys: Iterable[str] = ()) -> str:
    """`KEY: what DeepSpeed said`, the key found from the pydantic location or the message: the config's key, or
    DeepSpeed's (`known_keys`) when the message names one the config leaves at its default."""
    details = getattr(error, "errors", None)
    if callable(details):
        try:
            items = details()
        except Exception:  # noqa: BLE001
            items = []
        section = _SECTION_OF_MODEL.get(getattr(error, "title", ""), "")
        lines = []
        for item in items:
            loc = ".".join(str(part) for part in item.get("loc", ()))
            key = f"{section}.{loc}" if section and loc else section or _located(loc, config)
            lines.append(f"{key}: {item.get('msg', '')} (value {_short(item.get('input'))})")
        if lines:
            return "; ".join(lines)
    message = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, TypeError) and "unexpected keyword argument" in message:
        message = f"{message} ({type(error).__name__})"
    key = _key_named_in(message, config, known_keys)
    return f"{key}: {message}" if key else message


def _located(loc: str, config: dict[str, Any]) -> str:
    """The config path a pydantic location (relative to a section whose model is not in _SECTION_OF_MODEL) names:
    the shortest path ending in it."""
    paths = [path for path in _paths(config) if path == loc or path.endswith("." + loc)]
    return min(paths, key=len) if paths else loc


def _key_named_in(message: str, config: dict[str, Any], known_keys: Iterable[str] = ()) -> str | None:
    """The config path the message is about. DeepSpeed quotes the key it means ('max_grad_norm',
    <"zero_force_ds_cpu_optimizer": false>): the first quoted name that is a key of the config (its longest path) or
    one of DeepSpeed's (`known_keys`, for a key the config leaves at its default); else the longest path whose key —
    or whose text value, an optimizer's type say — the message names as a whole word."""
    lowered = message.lower()
    if "batch" in lowered:
        return "train_batch_size"
    if "bfloat16 and fp16" in lowered:
        return "bf16.enabled / fp16.enabled"
    known = set(known_keys)

    def paths_naming(word: str) -> list[str]:
        return [path for path in _paths(config) if path.split(".")[-1] == word
                or (isinstance(_value_at(config, path), str) and _value_at(config, path) == word)]

    for quoted in re.findall(r"""['"]([A-Za-z_][A-Za-z0-9_]*)['"]""", message):
        if paths_naming(quoted):
            return max(paths_naming(quoted), key=len)
        if quoted in known:
            return quoted
    words = _words(message)
    paths = [path for word in words for path in paths_naming(word)]
    if paths:
        return max(paths, key=len)
    named = [key for key in known if key in words]
    return max(named, key=len) if named else None


def _words(message: str) -> list[str]:
    """The message's identifier-like words (`max_grad_norm`, `OnebitAdam`, `zero_force_ds_cpu_optimizer`)."""
    return list(dict.fromkeys(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message)))


def _value_at(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        node = node[part]
    return node


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
