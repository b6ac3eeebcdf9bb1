"""Checkpoints every N steps (`gbmw train --save DIR --save-every N`), and resuming from the latest complete one.

A job that may be killed at any moment needs a recent checkpoint it can trust. With `--save-every N` the `--save`
folder holds one checkpoint per save, named by its step:

    DIR/step-00000050/   a whole checkpoint (adapters/runtime/checkpoint_files.py), step 50
    DIR/step-00000100/   …

Each is written under a temporary name and renamed only when complete (save_checkpoint), so a folder of this name
is always a complete checkpoint: a kill during a save leaves at most a marked `.step-….partial-*` folder, which the
next load of DIR reports and removes (adapters/runtime/partial_saves.py). No pointer file names the latest one — a
file rewritten in place is what a kill could leave half-written; `--load DIR` takes the highest step present.
Checkpoints already written are never replaced or removed.
"""

from __future__ import annotations

import re
from pathlib import Path

from gbmw.errors import CheckpointError

from .checkpoint_files import MANIFEST
from .partial_saves import PARTIAL_PREFIX, remove_interrupted_saves

STEP_FOLDER = "step-{step:08d}"
STEP_PATTERN = re.compile(r"step-(\d{8,})")
PARTIAL_STEP_PATTERN = re.compile(re.escape(PARTIAL_PREFIX.format(name="@")).replace("@", r"(step-\d{8,})") + ".*")


def step_checkpoint(series: str | Path, step: int) -> Path:
    """Where `--save-every` writes the checkpoint of `step` inside the `--save` folder."""
    return Path(series) / STEP_FOLDER.format(step=step)


def steps_saved(series: Path) -> list[int]:
    """The steps of the complete checkpoints in a `--save-every` folder, in order (a step folder exists only once
    its checkpoint is complete)."""
    if not series.is_dir() or series.is_symlink():
        return []
    return sorted(int(match.group(1)) for entry in series.iterdir()
                  if (match := STEP_PATTERN.fullmatch(entry.name)) and (entry / MANIFEST).is_file())


def remove_interrupted_step_saves(series: Path) -> None:
    """Report and remove the saves of step checkpoints in `series` that a kill interrupted, when their marker proves
    gbmw wrote them (partial_saves.remove_interrupted_saves; anything else is left and named)."""
    names = {match.group(1) for entry in series.iterdir() if (match := PARTIAL_STEP_PATTERN.fullmatch(entry.name))}
    for name in sorted(names):
        remove_interrupted_saves(series / name)


def checkpoint_to_load(path: str | Path) -> tuple[Path, str | None]:
    """The checkpoint `--load PATH` resumes from, and a note when PATH is a `--save-every` folder: its latest
    complete checkpoint. A path that is neither is left to the checkpoint reader to refuse with its own line."""
    path = Path(path)
    steps = [] if (path / MANIFEST).exists() else steps_saved(path)
    if not steps:  # one checkpoint, or nothing the reader will accept
        return path, None
    latest = step_checkpoint(path, steps[-1])
    return latest, (f"{path} holds {len(steps)} checkpoint(s) saved by --save-every; resuming from the latest "
                    f"complete one, {latest.name}")


def check_save_every(save: str | None, save_every: int | None) -> None:
    """`--save-every` needs the `--save` folder it writes into."""
    if save_every is not None and not save:
        raise CheckpointError(f"--save-every {save_every}: give --save DIR too, the new folder the checkpoints of every "
                              f"{save_every} step(s) go into (DIR/step-NNNNNNNN)")
