"""Argument types of the `gbmw` command line: argparse `type=` callables that refuse a bad value with the flag,
the value and what would work, and a parser whose errors are one line (`gbmw: error: …`, exit status 2).

Every number a flag takes is bounded: finite, and within a range no real job leaves (gbmw.specs.schema's limits).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable

from gbmw.errors import GbmwError
from gbmw.specs.files import shown
from gbmw.specs.schema import parse_bytes


_OTHER_RANKS_WAIT_S = 60.0


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line naming the command (no usage block): a bad flag reads like every
    other bad input of gbmw."""

    def error(self, message: str):
        """Print the line and exit 2. Under a launcher every rank parses the same command line and fails alike, so only
        rank 0 prints it."""
        command = self.prog.removeprefix("gbmw").strip()
        if os.environ.get("RANK", "0") == "0":
            print(f"gbmw: error: {command + ': ' if command else ''}{message} (see `gbmw "
                  f"{command + ' ' if command else ''}--help`)", file=sys.stderr, flush=True)
        else:
            # The other ranks leave after rank 0: a launcher that sees any rank exit terminates the rest, so a rank
            # leaving first could stop rank 0 before its line is out (no process group exists yet to wait on). Rank
            # 0's exit ends this wait through the launcher's SIGTERM; without one, the rank exits 2 by itself.
            time.sleep(_OTHER_RANKS_WAIT_S)
        raise SystemExit(2)


def integer(low: int, high: int, what: str = "") -> Callable[[str], int]:
    """A whole number in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"value {shown(text)} is not a whole number{_range(low, high, what)}") \
                from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"value {value}{_range(low, high, what)}")
        return value

    return parse


def power_of_two(high: int) -> Callable[[str], int]:
    """A power of two in [1, high]."""
    whole = integer(1, high, "a power of two")

    def parse(text: str) -> int:
        value = whole(text)
        if value & (value - 1):
            raise argparse.ArgumentTypeError(f"value {value} must be a power of two (1, 2, 4, 8, …)")
        return value

    return parse


def number(low: float, high: float, low_open: bool = False, what: str = "") -> Callable[[str], float]:
    """A finite number in [low, high] ((low, high] with `low_open`)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
            bound = f"more than {low:g}" if low_open else f"at least {low:g}"
            raise argparse.ArgumentTypeError(f"value {shown(text)} — must be a finite number, {bound} and at most "
                                             f"{high:g}{' (' + what + ')' if what else ''}")
        return value

    return parse


def memory_size(text: str) -> str:
    """A positive memory size such as 16GiB (kept as text; gbmw.specs.schema.parse_bytes reads it again where used)."""
    try:
        parse_bytes(text, "value")
    except GbmwError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("value: ")) from None
    return text


def memory_sizes(text: str) -> str:
    """A comma list of memory sizes (compare's budgets)."""
    for item in text.split(","):
        memory_size(item.strip())
    return text


def new_path(text: str) -> str:
    """A file or folder name that does not exist yet: gbmw never overwrites."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name; give a new file or folder name")
    if os.path.lexists(text):
        raise argparse.ArgumentTypeError(f"{text} exists; gbmw does not overwrite files — choose a new name or remove "
                                         "it first")
    _check_writable_folder(Path(text).absolute().parent, text)
    return text


def _check_writable_folder(folder: Path, text: str) -> None:
    """The nearest existing folder above a new path must be a folder gbmw may write in (checked before a search
    that may take minutes, not after)."""
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: cannot write there ({folder} is a file, not a folder)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot write there (no permission to write in {folder})")


def new_or_empty_folder(text: str) -> str:
    """A folder to write new files into: new, or existing and empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name; give a new folder")
    if os.path.lexists(text) and (not os.path.isdir(text) or os.listdir(text)):
        kind = "the folder exists and is not empty" if os.path.isdir(text) else "exists and is not a folder"
        raise argparse.ArgumentTypeError(f"{text}: {kind}; gbmw writes only new files — choose a new folder")
    return text


def _range(low: int, high: int, what: str) -> str:
    return f" — must be {what + ' ' if what else ''}from {low} to {high}"

