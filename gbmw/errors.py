"""The errors gbmw raises on bad input.

Every error a user can cause is a `GbmwError`: the CLI prints its message (which names the file,
the field, the value and what would work) and exits with status 2, never a traceback.
"""

from __future__ import annotations


class GbmwError(Exception):
    """Base of all user-facing errors; the message is complete on its own."""


class SpecError(GbmwError):
    """A model, cluster or job description is malformed or inconsistent."""


class PlanError(GbmwError):
    """A plan is inconsistent with itself, its model or its cluster (the message shows the arithmetic)."""


class CheckpointError(GbmwError):
    """A checkpoint is missing, corrupt, of another model, or would overwrite an existing one."""


class DataError(GbmwError):
    """A dataset given to `gbmw train --data` that cannot be trained on (missing, corrupt, not token ids, ids
    outside the model's vocabulary)."""


class TrainingError(GbmwError):
    """A run that cannot go on: a step's loss or gradient norm is not finite."""


class DistributedError(GbmwError):
    """A process of a distributed job died or could not be reached; the survivors stop with this."""


class LostContactError(DistributedError):
    """A surviving rank's report that a peer died mid-collective: under gbmw's own launcher every survivor hands it
    to the launcher, which prints one line for all of them (gbmw.adapters.runtime.local_launch)."""


def error_line(error: BaseException) -> str:
    """The one line a user sees for a GbmwError (gbmw.cli.main prints it on stderr)."""
    return f"gbmw: error: {error}"
