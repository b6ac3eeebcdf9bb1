"""Reading and writing a user's files safely, with bounds.

Every file a user hands gbmw — job, model, cluster, plan, hand-tuned config, HF config.json, ds_config,
checkpoint manifest — is read here, so every input is bounded in one place: its size (`MAX_INPUT_BYTES`),
UTF-8 text, the nesting depth and expanded size of its data (an alias bomb of a few hundred bytes is refused
before it is expanded), and the length of each string. YAML is read with PyYAML's SafeLoader only (no tags
that build Python objects), and a key written twice in one mapping is an error, not last-wins. JSON refuses
duplicate keys and NaN/Infinity.

Files are written new and atomically: a temporary file in the same folder, then a hard link to the final
name, which fails if the name exists — so a user's file is never overwritten in place, not even in a race,
and a crash leaves no half file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import ScalarNode, SequenceNode

from gbmw.errors import GbmwError, SpecError

MAX_INPUT_BYTES = 8 * 2**20
"""Largest input file read (8 MiB: a profile of a thousand layers is under 2 MiB)."""
MAX_NESTING = 32
"""Deepest nesting of mappings and lists in one input."""
MAX_NODES = 200_000
"""Most values in one input with every YAML alias expanded (what pydantic and the planner will walk)."""
MAX_STRING_CHARS = 10_000
"""Longest single string (key or value) in one input."""


def shown(value: Any, limit: int = 60) -> str:
    """`repr(value)` cut to `limit` characters, for error messages (a value may be a huge string or mapping)."""
    if isinstance(value, dict):
        return "{…}" if value else "{}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_text(path: str | Path, what: str = "file", error: type[GbmwError] = SpecError) -> str:
    """A user's text file: missing, unreadable, a folder, larger than MAX_INPUT_BYTES or not UTF-8 is one `error`
    naming the file."""
    path = Path(path)
    try:
        if path.exists() and not path.is_file() and not path.is_dir():  # a FIFO or a device would block or never end
            raise error(f"{path}: not a regular file; give the {what} itself")
        with open(path, "rb") as stream:
            data = stream.read(MAX_INPUT_BYTES + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder; give the {what} itself") from None
    except OSError as problem:
        raise error(f"{path}: cannot read the {what} ({problem.strerror or problem})") from None
    if len(data) > MAX_INPUT_BYTES:
        raise error(f"{path}: larger than {MAX_INPUT_BYTES // 2**20} MiB; a {what} is far smaller — is this the "
                    "right file?")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as problem:
        raise error(f"{path}: not UTF-8 text (byte 0x{data[problem.start]:02x} at offset {problem.start}); save the "
                    f"{what} as UTF-8") from None


class _InputLimit(Exception):
    """An input exceeds one of the bounds above (the message says which)."""


class _BoundedSafeLoader(yaml.SafeLoader):
    """SafeLoader that counts, while composing, each node's size with aliases expanded and its depth, refuses a key
    written twice in one mapping, and strings longer than MAX_STRING_CHARS — before anything is constructed."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._expanded: dict[int, int] = {}

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None and id(node) not in self._expanded:
                raise _InputLimit(f"alias *{event.anchor} at line {event.start_mark.line + 1} refers to a value that "
                                  "contains it (a recursive structure)")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_NESTING:
            mark = self.peek_event().start_mark
            raise _InputLimit(f"nested deeper than {MAX_NESTING} levels at line {mark.line + 1}")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._expanded[id(node)] = size = self._size(node)
        if size > MAX_NODES:
            raise _InputLimit(f"more than {MAX_NODES} values once its aliases are expanded (at line "
                              f"{node.start_mark.line + 1}); write the values out, or check for an alias bomb")
        return node

    def _size(self, node) -> int:
        if isinstance(node, ScalarNode):
            if len(node.value) > MAX_STRING_CHARS:
                raise _InputLimit(f"a value of {len(node.value)} characters at line {node.start_mark.line + 1} "
                                  f"(at most {MAX_STRING_CHARS})")
            return 1
        if isinstance(node, SequenceNode):
            return 1 + sum(self._expanded.get(id(item), 1) for item in node.value)
        keys: set[str] = set()
        size = 1
        for key, value in node.value:
            if isinstance(key, ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in keys:
                    raise _InputLimit(f"key {shown(key.value)} at line {key.start_mark.line + 1} appears twice in one "
                                      "mapping; keep one")
                keys.add(key.value)
            size += self._expanded.get(id(key), 1) + self._expanded.get(id(value), 1)
        return size


def load_yaml_text(text: str, where: str, error: type[GbmwError] = SpecError) -> Any:
    """YAML text → Python data with SafeLoader and the bounds above; any problem is one `error` naming `where`."""
    loader = None
    try:
        loader = _BoundedSafeLoader(text)  # the reader refuses control characters here
        return loader.get_single_data()
    except _InputLimit as problem:
        raise error(f"{where}: {problem}") from None
    except yaml.YAMLError as problem:
        mark = getattr(problem, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = getattr(problem, "problem", None) or str(problem).splitlines()[0]
        raise error(f"{where}: not valid YAML{at}: {shown(reason, 120).strip(chr(39))}") from None
    except (ValueError, TypeError, OverflowError) as problem:  # a constructor refusing a scalar (a bad timestamp)
        raise error(f"{where}: not valid YAML: {shown(str(problem).split(';')[0], 120)}") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml(path: str | Path, what: str = "file", error: type[GbmwError] = SpecError) -> dict[str, Any]:
    """Read a YAML mapping (bounded, safe); a missing or malformed file is one `error` naming it."""
    data = load_yaml_text(read_text(path, what, error), str(path), error)
    if not isinstance(data, dict):
        raise error(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data


def load_json_text(text: str, where: str, error: type[GbmwError] = SpecError) -> Any:
    """JSON text → Python data: duplicate keys, NaN/Infinity and nesting beyond MAX_NESTING are one `error`."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_refuse_constant)
    except json.JSONDecodeError as problem:
        raise error(f"{where}: not valid JSON at line {problem.lineno}, column {problem.colno}: {problem.msg}") from None
    except _InputLimit as problem:
        raise error(f"{where}: {problem}") from None
    except ValueError as problem:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise error(f"{where}: not readable as JSON: {str(problem).split(';')[0]}") from None
    except RecursionError:
        raise error(f"{where}: nested deeper than {MAX_NESTING} levels") from None
    check_bounds(data, where, error)
    return data


def read_json(path: str | Path, what: str = "file", error: type[GbmwError] = SpecError) -> Any:
    """Read a JSON file (bounded); see `load_json_text`."""
    return load_json_text(read_text(path, what, error), str(path), error)


def check_bounds(data: Any, where: str, error: type[GbmwError] = SpecError) -> None:
    """Raise `error` when `data` (already parsed, e.g. by hjson) nests deeper than MAX_NESTING, holds more than
    MAX_NODES values or a string longer than MAX_STRING_CHARS."""
    stack, count = [(data, 1)], 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if depth > MAX_NESTING or count > MAX_NODES:
            raise error(f"{where}: nested deeper than {MAX_NESTING} levels or more than {MAX_NODES} values")
        if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
            raise error(f"{where}: a value of {len(value)} characters (at most {MAX_STRING_CHARS})")
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for pair in value.items() for item in pair)
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """One object's keys: a key repeated with the same value is read once (real configs have them:
    Meta-Llama-3-8B-Instruct's `_name_or_path`; transformers reads them), with different values refused."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result and result[key] != value:
            raise _InputLimit(f"key {shown(key)} appears twice in one object with different values ({shown(result[key])}"
                              f", {shown(value)}); keep one")
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise _InputLimit(f"{name} is not a number gbmw accepts; write a finite number")


def permissions_as_created(requested: int) -> int:
    """The mode `open()` or `mkdir()` would give a new file or folder asking for `requested` (0o666, 0o777): the
    user's umask applied. tempfile's mkstemp/mkdtemp create 0600/0700, private to the user; gbmw's outputs (plans,
    ds_configs, checkpoints) are read by launchers and teammates as any file the user writes."""
    mask = os.umask(0)
    os.umask(mask)
    return requested & ~mask


def write_new_file(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically (temp file in the same folder, then rename), refusing to
    replace an existing file: a user's files are never overwritten in place."""
    return write_new_file_bytes(path, text.encode())


def write_new_file_bytes(path: str | Path, data: bytes) -> Path:
    """`write_new_file` for bytes."""
    path = Path(path)
    if path.exists():
        raise GbmwError(f"{path} exists; gbmw does not overwrite files — choose a new name or remove it first")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise GbmwError(f"{path}: cannot write there ({error.strerror or error}); choose a folder you can write "
                        "to") from None
    try:
        os.fchmod(handle, permissions_as_created(0o666))  # mkstemp's 0600 would hide the file from the job's group
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.link(temporary, path)  # fails if `path` appeared meanwhile: no overwrite even in a race
    except FileExistsError:
        raise GbmwError(f"{path} exists; gbmw does not overwrite files") from None
    except OSError as error:
        raise GbmwError(f"{path}: cannot write it ({error.strerror or error})") from None
    finally:
        os.unlink(temporary)
    return path
