"""The shape of the code (DESIGN.md, shared/STYLE.md): gbmw/ in parts whose imports point one way (specs at the bottom,
the command line at the top), no import cycle among gbmw's modules (imports inside functions and annotation-only ones
included), the planner (gbmw/ but the command line's dispatch) imports neither torch nor an adapter, however
indirectly; no module of gbmw/ or adapters/ grows past MAX_LINES. Read from the source with `ast`, nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"gbmw": ROOT / "gbmw", "gbmw.adapters": ROOT / "adapters"}
RUNTIME_LIBRARIES = ("torch", "deepspeed", "megatron")
COMPOSITION_ROOTS = ("gbmw.cli.main", "gbmw.cli.running", "gbmw.__main__")
"""The command line dispatches to the adapters (tune, train, profile, validate): the one place the planner package
reaches them, lazily, inside the command that needs one (gbmw.cli.running)."""
CONTRACTS = ("gbmw.errors", "gbmw.version", "gbmw.plan", "gbmw.ranks")
"""The top-level modules; every other module of gbmw/ lives in a part."""
PARTS_BELOW = {
    "gbmw.specs": ("gbmw.errors",),
    "gbmw.space": ("gbmw.errors", "gbmw.specs"),
    "gbmw.plan": ("gbmw.errors", "gbmw.specs", "gbmw.space"),
    "gbmw.ranks": ("gbmw.errors", "gbmw.specs", "gbmw.space", "gbmw.plan"),
    "gbmw.cost": ("gbmw.errors", "gbmw.specs", "gbmw.space", "gbmw.plan", "gbmw.ranks"),
    "gbmw.handwritten": ("gbmw.errors", "gbmw.specs", "gbmw.space", "gbmw.plan"),
    "gbmw.search": ("gbmw.errors", "gbmw.version", "gbmw.specs", "gbmw.space", "gbmw.plan", "gbmw.ranks",
                    "gbmw.cost"),
}
"""What each part may import besides itself (gbmw/__init__.py's docstring draws the same order). The command line
(gbmw.cli) and the package's face (gbmw/__init__.py) may import any part."""
MAX_LINES = 400


def module_files() -> dict[str, Path]:
    """Every module of gbmw and gbmw.adapters by its import name."""
    modules = {}
    for prefix, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([prefix, *parts])] = path
    return modules


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str, path: Path, known: set[str], annotations: bool = False) -> set[str]:
    """What a module imports (gbmw modules by name, other packages by their top-level name), wherever in the file
    the import statement is; under `if TYPE_CHECKING:` (annotations only) with `annotations`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node) and not annotations:
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:  # `from package import submodule` imports the submodule
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {module if module.startswith("gbmw") else module.split(".")[0] for module in found}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


@pytest.fixture(scope="module")
def graph_with_annotations() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files), annotations=True) for name, path in files.items()}


def part_of(module: str) -> str:
    """`gbmw.search.exact.whole_plan_search` → `gbmw.search`; a contract is its own part."""
    return ".".join(module.split(".")[:2])


def test_every_module_of_gbmw_is_in_a_part_or_a_contract(graph):
    loose = [name for name, path in module_files().items() if name.startswith("gbmw.") and
             not name.startswith("gbmw.adapters") and name.count(".") == 1 and path.name != "__init__.py"
             and name not in CONTRACTS + ("gbmw.__main__",)]
    assert not loose, f"modules outside the parts: {loose}"


def test_the_parts_import_only_the_parts_below(graph_with_annotations):
    offences = []
    for name, targets in graph_with_annotations.items():
        allowed = PARTS_BELOW.get(part_of(name))
        if allowed is None:
            continue
        for target in targets:
            if target.startswith("gbmw") and part_of(target) != part_of(name) and part_of(target) not in allowed:
                offences.append(f"{name} imports {target}")
    assert not offences, offences
    assert set(PARTS_BELOW) <= {part_of(name) for name in graph_with_annotations}  # every part still exists


def test_no_import_cycle(graph_with_annotations):
    graph = graph_with_annotations
    internal = {name: {target for target in targets if target in graph} for name, targets in graph.items()}
    state: dict[str, str] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(internal[node]):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(internal):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_the_planner_imports_no_torch_and_no_adapter(graph):
    planner = [name for name in graph if not name.startswith(("gbmw.adapters", *COMPOSITION_ROOTS))]
    offences = []
    for start in planner:
        seen, frontier = {start}, [start]
        while frontier:
            for target in graph.get(frontier.pop(), ()):
                if target.startswith("gbmw.adapters") or target in RUNTIME_LIBRARIES:
                    offences.append(f"{start} reaches {target}")
                elif target in graph and target not in seen:
                    seen.add(target)
                    frontier.append(target)
    assert not offences, offences
    assert len(planner) > 30  # the walk saw the planner's modules (it found none of them when they moved)


def test_the_checks_above_see_what_they_check(graph):
    """The reader finds imports inside functions and relative ones, as the rules need."""
    assert "gbmw.adapters.tune" in graph["gbmw.cli.running"]  # imported inside the `tune` command
    assert {"gbmw.adapters.deepspeed", "gbmw.adapters.megatron"} <= graph["gbmw.adapters.tune"]  # `from . import`
    assert "torch" in graph["gbmw.adapters.runtime.engine"]


def test_no_module_grows_past_the_limit():
    sizes = {name: len(path.read_text().splitlines()) for name, path in module_files().items()}
    assert not {name: size for name, size in sizes.items() if size > MAX_LINES}
