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
from typing import Any, Iterator

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
