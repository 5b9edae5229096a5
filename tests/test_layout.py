"""The house's rules, checked on the source: floors, file sizes, no import cycle."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "model", "stages", "cli", "orchestration", "benchmarks", "scripts")
MAX_LINES = 450


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Project modules ``path`` imports anywhere (functions too), except for type checking."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    known = {module_name(p) for p in sources()}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        found |= {n for n in names if n in known}
    return found


def test_no_file_outside_tests_is_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in sources()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


@pytest.mark.parametrize("floor", ["cli", "benchmarks", "model", "pipeline"])
def test_library_floors_never_import_stages(floor):
    bad = {str(p.relative_to(ROOT)): sorted(i for i in imports(p) if i.startswith("stages"))
           for p in (ROOT / floor).rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_pipeline_is_the_ground_floor():
    bad = {str(p.relative_to(ROOT)): sorted(i for i in imports(p)
                                            if i.split(".")[0] in ("model", "cli"))
           for p in (ROOT / "pipeline").rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_no_import_cycle():
    graph = {module_name(p): imports(p) - {module_name(p)} for p in sources()}
    assert "model.methods.registry" in graph["model.files.checkpoint"]  # sees `from pkg import x`
    assert "model.training.loop" not in graph["model.training.state"]  # TYPE_CHECKING skipped
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, path: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle.extend([*path[path.index(nxt):], nxt])
                return True
            if state.get(nxt) is None and visit(nxt, [*path, nxt]):
                return True
        state[node] = 2
        return False

    for start in sorted(graph):
        if state.get(start) is None and visit(start, [start]):
            break
    assert cycle == []
