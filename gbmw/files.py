"""Reading and writing a user's files safely.

YAML is read with `yaml.safe_load` only (no tags that build Python objects). Files are written new and
atomically: a temporary file in the same folder, then a hard link to the final name, which fails if the name
exists — so a user's file is never overwritten in place, not even in a race, and a crash leaves no half file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from gbmw.errors import GbmwError, SpecError


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with `yaml.safe_load`; a missing or malformed file is one SpecError."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except OSError as error:
        raise SpecError(f"{path}: cannot read ({error.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise SpecError(f"{path}: not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data


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
