"""Typed input schemas (frozen pydantic models) and their errors: one message that names the file, each
offending field, its value and what is allowed — never a traceback from deep inside."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ByteSize, ConfigDict, TypeAdapter, ValidationError

from gbmw.errors import SpecError


class Frozen(BaseModel):
    """Immutable, and unknown fields are errors (a misspelt key is never silently ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


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
            lines.append(f"{where}: unknown field `{field}` (value {item['input']!r}); check its spelling")
        else:
            value = item.get("input")
            shown = repr(value) if not isinstance(value, dict) else "{…}"
            lines.append(f"{where}: field `{field}`: value {shown} — {message}")
    return "\n".join(lines)


def validate_as(schema: type[BaseModel], data: dict[str, Any], where: str | Path) -> Any:
    """Build `schema` from `data`, turning pydantic's errors into one SpecError naming `where`."""
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        raise SpecError(describe_validation_error(error, str(where))) from None


_BYTE_SIZE = TypeAdapter(ByteSize)


def parse_bytes(text: str | int, where: str) -> int:
    """Parse a memory size such as `16GiB`, `1.5 GB` or a plain byte count (pydantic's ByteSize)."""
    try:
        return int(_BYTE_SIZE.validate_python(text))
    except ValidationError:
        raise SpecError(f"{where}: value {text!r} is not a memory size; write e.g. 16GiB, 80GB or 1073741824") from None
