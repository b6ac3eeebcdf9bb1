"""The bundled recipes — models, clusters, jobs and published hand-tuned configurations — and how a name
given on the command line resolves to one of them or to a user's file.

The recipes ship as package data (`gbmw.recipes`, the repository's recipes/ folder), so an installed gbmw
finds them as an editable clone does.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from gbmw.errors import SpecError
from gbmw.specs.files import shown

RECIPES_DIR = Path(str(files("gbmw.recipes")))
"""recipes/ of the installed package: models/, clusters/, jobs/, handtuned/, gpt3/."""


_KIND_NAMES = {"models": "model", "clusters": "cluster", "jobs": "job", "handtuned": "hand-tuned configuration"}


def bundled_names(kind: str) -> list[str]:
    """The bundled recipes of one kind (`models`, `clusters`, `jobs`, `handtuned`), by name."""
    return sorted(path.stem for path in (RECIPES_DIR / kind).glob("*.yaml"))


def resolve_recipe(reference: str, kind: str, relative_to: Path | None = None) -> Path:
    """A path for `reference`: an existing path (relative to `relative_to` first), or the name of
    a bundled recipe under recipes/<kind>/."""
    candidates = []
    as_path = Path(reference)
    if relative_to is not None and not as_path.is_absolute():
        candidates.append(relative_to / as_path)
    candidates.append(as_path)
    if as_path.suffix not in (".yaml", ".yml", ".json") and len(as_path.parts) == 1:  # a name (it may hold a dot)
        candidates.append(RECIPES_DIR / kind / f"{reference}.yaml")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise SpecError(
        f"{_KIND_NAMES.get(kind, kind)} {shown(reference)}: no such file or bundled recipe; bundled {kind}: "
        f"{', '.join(bundled_names(kind)) or 'none'}"
    )
