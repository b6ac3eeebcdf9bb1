"""Golden-file comparison shared by the adapter tests (GBMW_UPDATE_GOLDEN=1 rewrites the files)."""

import os
from pathlib import Path

UPDATE_GOLDEN = os.environ.get("GBMW_UPDATE_GOLDEN") == "1"


def check_golden(path: Path, text: str) -> None:
    """`text` must equal the checked-in golden file at `path`."""
    if UPDATE_GOLDEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing; create it with GBMW_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} drifted; if intended, regenerate with GBMW_UPDATE_GOLDEN=1"
