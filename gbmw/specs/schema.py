"""Typed input schemas (frozen pydantic models) and their errors: one message that names the file, each
offending field, its value and what is allowed — never a traceback from deep inside."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ByteSize, ConfigDict, Field, TypeAdapter, ValidationError

from gbmw.errors import SpecError
from gbmw.specs.files import MAX_STRING_CHARS, shown

# Bounds on what an input may ask for: far beyond any real model or cluster, small enough that nothing a user
# writes makes the planner hang or run out of memory. Each is a pydantic Field constraint where it is read.
MAX_LAYERS = 1024
"""Layers of one model (GPT-3 175B has 96 blocks; the search time grows with the layers)."""
MAX_GLOBAL_BATCH = 2**20
"""Samples in one iteration (a million: 4 billion tokens at sequence length 4096)."""
MAX_DEVICES = 2**18
"""Devices in one cluster."""
MAX_WIDTH = 2**20
"""Hidden, FFN, head and vocabulary sizes."""
MAX_SEQUENCE = 2**24
"""Tokens (or patches) of one sample."""
MAX_COUNT = 2**53
"""Parameter counts and other integers read as exact floats."""
MAX_QUANTITY = 1e30
"""FLOPs, bytes, seconds and rates: finite, and far below where float arithmetic loses its meaning."""

T = TypeVar("T")
Items = Annotated[tuple[T, ...], BeforeValidator(lambda value: tuple(value) if isinstance(value, list) else value)]
"""A tuple field that reads a YAML list (strict validation takes tuples only)."""


class Frozen(BaseModel):
    """Immutable, and unknown fields are errors (a misspelt key is never silently ignored); no NaN or infinity, no
    string longer than gbmw.specs.files.MAX_STRING_CHARS. Input files are validated strictly (`validate_as`):
    `global_batch: yes` is a bool, not 1."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, str_max_length=MAX_STRING_CHARS)


def describe_validation_error(error: ValidationError, where: str) -> str:
    """One message listing every bad field of `error` as `where: field a.b[2]: value 7 — must be …`."""
    lines = []
    for item in error.errors():
        field = ".".join(str(part) if not isinstance(part, int) else f"[{part}]" for part in item["loc"])
        field = field.replace(".[", "[") or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "missing":
            lines.append(f"{where}: field `{field}` is required")
        elif item["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown field `{field}` (value {shown(item['input'])}); check its spelling")
        elif item["type"] == "value_error" and isinstance(item.get("input"), dict):
            lines.append(f"{where}: {message}")  # a check of the whole mapping (e.g. heads against the width)
        else:
            lines.append(f"{where}: field `{field}`: value {shown(item.get('input'))} — {_what_works(item, message)}")
    return "; ".join(lines[:3]) + (f"; and {len(lines) - 3} more" if len(lines) > 3 else "")


def _what_works(item: dict, message: str) -> str:
    """pydantic's message, with what to write where it only names the type."""
    kind = item["type"]
    if kind in ("int_type", "int_from_float", "int_parsing"):
        return "must be a whole number (write e.g. 8, not 8.0, yes or \"8\")"
    if kind in ("float_type", "float_parsing"):
        return "must be a number (write e.g. 1.5, not yes or \"1.5\")"
    if kind == "finite_number":
        return "must be a finite number"
    if kind == "string_type":
        return "must be text (quote it)"
    if kind == "bool_type":
        return "must be true or false"
    bounds = {"greater_than_equal": ("ge", "at least"), "less_than_equal": ("le", "at most"),
              "greater_than": ("gt", "more than"), "less_than": ("lt", "less than")}
    if kind in bounds:
        key, words = bounds[kind]
        return f"must be {words} {item.get('ctx', {}).get(key)}"
    return message


def validate_as(schema: type[BaseModel], data: dict[str, Any], where: str | Path) -> Any:
    """Build `schema` from `data`, turning pydantic's errors into one SpecError naming `where` (or saying which kind
    of file it is when it is another kind's)."""
    try:
        return schema.model_validate(data, strict=True)
    except ValidationError as error:
        check_kind(data, _KIND_OF_SCHEMA.get(schema.__name__, ""), str(where))
        raise SpecError(describe_validation_error(error, str(where))) from None


_SIGNATURES = {
    "job": (("model", "cluster", "precision"), ("strategies", "num_devices")),
    "plan": (("strategies", "partition"), ()),
    "cluster": (("devices_per_node", "links"), ()),
    "model": (("family",), ()),
    "checkpoint manifest": (("saved_under",), ()),
    "hand-tuned configuration": (("applies_to", "config"), ()),
    "DeepSpeed config": (("train_batch_size",), ()),
}
"""(fields only that kind of gbmw input has, fields it never has): how a file given in the wrong place is
recognised."""
_KIND_OF_SCHEMA = {"JobFile": "job", "ClusterSpec": "cluster", "ModelSpec": "model", "Manifest": "checkpoint manifest",
                   "HandTunedConfig": "hand-tuned configuration"}


def check_kind(data: Any, expected: str, where: str, error: type[Exception] = SpecError) -> None:
    """Raise one `error` saying so when `data` is plainly another kind of gbmw input than `expected` (a plan given as
    a job, a model recipe as a cluster), instead of listing every field it lacks."""
    if not isinstance(data, dict) or not expected:
        return
    for kind, (keys, never) in _SIGNATURES.items():
        if kind != expected and all(key in data for key in keys) and not any(key in data for key in never):
            raise error(f"{where}: this is a {kind} (it has {', '.join(keys)}), not a {expected}; give a {expected} "
                        "here")


_BYTE_SIZE = TypeAdapter(ByteSize)


MAX_MEMORY_BYTES = 2**50
"""The largest memory size read (1 PiB)."""
MIN_PLAIN_MEMORY_BYTES = 2**20
"""A memory size written as a bare number below this (1 MiB) is taken for a unit left out (`memory_budget: 80`)."""


def _unit_given(value: Any) -> Any:
    plain = isinstance(value, int) and not isinstance(value, bool) or isinstance(value, str) and value.strip().isdigit()
    if plain and 0 < int(value) < MIN_PLAIN_MEMORY_BYTES:
        raise ValueError(f"a number without a unit is bytes, and {int(value)} bytes holds no model; give the unit: "
                         f"{int(value)}GiB or {int(value)}GB")
    return value


MemorySize = Annotated[ByteSize, BeforeValidator(_unit_given), Field(gt=0, le=MAX_MEMORY_BYTES)]
"""A positive memory size, e.g. `80GiB` (pydantic's ByteSize); a bare number below 1 MiB is refused as a unit left
out."""


def format_bytes(count: float) -> str:
    """GiB with two decimals, or MiB below 1 GiB (tiny test jobs would read 0.00 GiB)."""
    if count >= 2**30 or count == 0:
        return f"{count / 2**30:.2f} GiB"
    return f"{count / 2**20:.2f} MiB"


def parse_bytes(text: str | int, where: str) -> int:
    """Parse a positive memory size such as `16GiB`, `1.5 GB` or a plain byte count (pydantic's ByteSize)."""
    try:
        size = int(_BYTE_SIZE.validate_python(text, strict=True))
    except ValidationError:
        raise SpecError(f"{where}: value {shown(text)} is not a memory size; write e.g. 16GiB, 80GB or "
                        "1073741824") from None
    if not 0 < size <= MAX_MEMORY_BYTES:
        raise SpecError(f"{where}: value {shown(text)} — a memory size must be positive and at most 1PiB; write e.g. "
                        "16GiB")
    if size < MIN_PLAIN_MEMORY_BYTES and str(text).strip().isdigit():
        raise SpecError(f"{where}: value {shown(text)} — a number without a unit is bytes, and {size} bytes holds no "
                        f"model; give the unit: {str(text).strip()}GiB or {str(text).strip()}GB")
    return size
