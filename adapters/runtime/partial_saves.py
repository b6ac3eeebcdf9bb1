"""The folders of interrupted checkpoint saves, and proof that gbmw wrote them (issue 31: gbmw removes only what it
can prove it created).

A save writes its checkpoint under a temporary name beside the final one, `.NAME.partial-XXXX`
(adapters/runtime/checkpoint_files.py), and the first thing it writes there is a marker, `MARKER`, naming the
checkpoint, the host and the process that writes it. A process killed midway leaves that folder behind; the next
save or load of NAME removes a leftover only when its marker is there, names NAME, and names this host and a process
that is no longer running — a save still in progress, or one on another host sharing the file system, is left
alone, and so is any folder gbmw did not mark (a user's folder that happens to match the pattern). Each removal and
each folder left is reported in one line on stderr.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import sys
from pathlib import Path

PARTIAL_PREFIX = ".{name}.partial-"
"""The temporary name of a checkpoint being written next to its final name."""
MARKER = ".gbmw-partial-checkpoint"
"""The file a save writes first into its temporary folder: what, where and by which process."""
MARKER_MAX_BYTES = 4096


def marker_text(name: str) -> str:
    return f"gbmw partial checkpoint\nof: {name}\nhost: {socket.gethostname()}\npid: {os.getpid()}\n"


def mark_as_ours(folder: Path, name: str) -> None:
    """Write the marker into a save's freshly created temporary folder."""
    (folder / MARKER).write_text(marker_text(name))


def unmark(folder: Path) -> None:
    """Remove the marker from a completed save before it takes its final name."""
    (folder / MARKER).unlink()


def _marker_fields(folder: Path) -> dict[str, str] | None:
    marker = folder / MARKER
    try:
        if marker.is_symlink() or not marker.is_file() or marker.stat().st_size > MARKER_MAX_BYTES:
            return None
        lines = marker.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if not lines or lines[0] != "gbmw partial checkpoint":
        return None
    return dict(line.split(": ", 1) for line in lines[1:] if ": " in line)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def why_not_ours_to_remove(folder: Path, name: str) -> str | None:
    """None when `folder` is an interrupted save of checkpoint `name` by a finished process on this host, else
    why gbmw leaves it."""
    if folder.is_symlink() or not folder.is_dir():
        return "it is not a folder gbmw created"
    fields = _marker_fields(folder)
    if fields is None or fields.get("of") != name:
        return f"it has no marker ({MARKER}) of a gbmw save of {name}"
    if fields.get("host") != socket.gethostname():
        return f"a save on host {fields.get('host')!r} wrote it and may still be writing"
    pid = fields.get("pid", "")
    if not pid.isdigit() or _process_alive(int(pid)):
        return f"the process that writes it (pid {pid}) is still running"
    return None


def remove_interrupted_saves(path: Path) -> list[Path]:
    """Remove the interrupted saves of checkpoint `path` that gbmw can prove it wrote (module docstring), saying
    so on stderr, and name every other folder of their pattern it leaves; returns the folders removed."""
    removed = []
    for folder in sorted(path.parent.glob(PARTIAL_PREFIX.format(name=glob.escape(path.name)) + "*")):
        reason = why_not_ours_to_remove(folder, path.name)
        if reason is None:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            print(f"gbmw: note: removed {folder}, an incomplete checkpoint left by an interrupted save of {path}",
                  file=sys.stderr, flush=True)
        else:
            print(f"gbmw: note: left {folder} in place although its name is that of an interrupted save of {path}: "
                  f"{reason}", file=sys.stderr, flush=True)
    return removed
