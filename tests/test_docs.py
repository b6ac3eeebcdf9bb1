"""The README and docs/ (issue 25): the README stays short enough to read in ten minutes, and what the README and
docs/*.md name exists — every relative link, every path under gbmw/, adapters/, benchmarks/ and tests/, and every
dotted `gbmw.<part>.<module>` name (`gbmw.adapters.…` lives in adapters/). Read as text, nothing imported."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_BYTES = 11_000
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
PAGE_IDS = [str(page.relative_to(ROOT)) for page in PAGES]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
"""A Markdown link's target: `[text](target)`."""
REPO_PATH = re.compile(r"(?<![\w/.~$-])((?:gbmw|adapters|benchmarks|tests)/[\w/.-]*)")
"""A path from the repository root under one of the code folders (not inside a URL or another path)."""
DOTTED_NAME = re.compile(r"(?<![\w/.-])gbmw(?:\.\w+)+")
"""`gbmw.x`, `gbmw.x.y`, …: a module of the package or a name it defines."""
PACKAGE_FOLDERS = {"gbmw": ROOT / "gbmw", "gbmw.adapters": ROOT / "adapters"}


def relative_links(text: str) -> list[str]:
    """Link targets that are files of this repository (no scheme, no bare #anchor), without their #anchor."""
    targets = [target.split("#")[0] for target in LINK.findall(text)]
    return [target for target in targets if target and "://" not in target and not target.startswith("mailto:")]


def repo_paths(text: str) -> list[str]:
    """Paths under gbmw/, adapters/, benchmarks/, tests/ that a page names (a sentence's final dot removed)."""
    return [path.rstrip(".") for path in REPO_PATH.findall(text)]


def defines(path: Path, name: str) -> bool:
    """Whether a module's source mentions `name` as a whole word (a def, a class, an import, an assignment)."""
    return re.search(rf"\b{re.escape(name)}\b", path.read_text()) is not None


def resolves(dotted: str) -> bool:
    """Whether `gbmw.part.module[.name]` is a package or module of gbmw (gbmw.adapters → adapters/), optionally
    followed by one name that module's source defines; or a name a package's `__init__.py` defines (`gbmw.Plan`)."""
    parts = dotted.split(".")
    if parts[:2] == ["gbmw", "adapters"]:
        folder, rest = PACKAGE_FOLDERS["gbmw.adapters"], parts[2:]
    else:
        folder, rest = PACKAGE_FOLDERS["gbmw"], parts[1:]
    for index, part in enumerate(rest):
        if (folder / part / "__init__.py").exists():
            folder = folder / part
        elif (folder / f"{part}.py").exists():
            return len(rest) - index - 1 <= 1 and all(defines(folder / f"{part}.py", name) for name in rest[index + 1:])
        else:  # a name the package defines (its attributes, `gbmw.Plan.load`, are not followed)
            return defines(folder / "__init__.py", part)
    return True


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes (at most {MAX_README_BYTES}): move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_relative_links_exist(page):
    missing = [target for target in relative_links(page.read_text()) if not (page.parent / target).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_named_paths_exist(page):
    missing = [path for path in repo_paths(page.read_text()) if not (ROOT / path).exists()]
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_dotted_names_resolve(page):
    unresolved = [name for name in DOTTED_NAME.findall(page.read_text()) if not resolves(name)]
    assert not unresolved, f"{page.relative_to(ROOT)} names gbmw modules that do not exist: {unresolved}"


def test_the_checks_catch_what_they_are_for():
    """Each finder sees the broken form it exists to catch (so an empty result above means something)."""
    assert relative_links("[a](docs/nowhere.md) [b](https://example.org/x.md) [c](#top)") == ["docs/nowhere.md"]
    assert repo_paths("see `gbmw/search/nowhere.py`. not https://x.org/tests/a.py") == ["gbmw/search/nowhere.py"]
    assert not resolves("gbmw.search.nowhere") and not resolves("gbmw.adapters.nowhere")
    assert not resolves("gbmw.plan.no_such_function") and not resolves("gbmw.no_such_name")
    assert resolves("gbmw.search.exact.whole_plan_search") and resolves("gbmw.adapters.profile.fake_memory")
    assert resolves("gbmw.plan.plan_from_strategy_names") and resolves("gbmw.Plan.load")
