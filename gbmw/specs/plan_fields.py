"""Reading a plan file's fields and writing them back: one clear error naming the field and its value when a field
is not what a plan holds (gbmw.plan.Plan.from_dict), plain YAML types on the way out."""

from __future__ import annotations

from typing import Any

from gbmw.errors import PlanError
from gbmw.specs.files import shown


def whole_number(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{where}: field `{name}`: value {shown(value)} — must be a whole number")
    return value


def name_text(value: Any, name: str, where: str, least: int = 1) -> str:
    if not isinstance(value, str) or not least <= len(value) <= 200:
        raise PlanError(f"{where}: field `{name}`: value {shown(value)} — must be a name (text of {least} to 200 "
                        "characters)")
    return value


def flag(value: Any, name: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise PlanError(f"{where}: field `{name}`: value {shown(value)} — must be true or false")
    return value


def plain(value: Any) -> Any:
    """Tuples to lists and numpy scalars to Python numbers, for safe_dump."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value
