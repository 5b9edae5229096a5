"""The house's rules, checked on the source: floors, file and package sizes, no import cycle,
no method importing another."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "model", "stages", "cli", "serve", "orchestration", "benchmarks",
            "scripts")
MAX_LINES = 400
#: The most modules (``__init__`` aside) one package under ``model/`` may hold.
MAX_MODULES = 12


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Project modules ``path`` imports anywhere: in functions and for type checking too (an
    import that only type checking sees still ties the two modules together)."""
    tree = ast.parse(path.read_text())
    known = {module_name(p) for p in sources()}
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        found |= {n for n in names if n in known}
    return found


def test_no_file_outside_tests_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in sources()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


@pytest.mark.parametrize("floor", ["cli", "serve", "benchmarks", "model", "pipeline"])
def test_library_floors_never_import_stages(floor):
    bad = {str(p.relative_to(ROOT)): sorted(i for i in imports(p) if i.startswith("stages"))
           for p in (ROOT / floor).rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_pipeline_is_the_ground_floor():
    bad = {str(p.relative_to(ROOT)): sorted(i for i in imports(p)
                                            if i.split(".")[0] in ("model", "cli"))
           for p in (ROOT / "pipeline").rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_serve_stands_on_model_and_pipeline_only():
    """The service imports the model and the plumbing, never a command of ``cli/``."""
    bad = {str(p.relative_to(ROOT)): sorted(i for i in imports(p)
                                            if i.split(".")[0] in ("cli", "orchestration"))
           for p in (ROOT / "serve").rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}
    below = [p for floor in ("pipeline", "model", "stages", "cli")
             for p in (ROOT / floor).rglob("*.py")]
    assert not any(i.startswith("serve") for p in below for i in imports(p))


def test_no_import_cycle():
    graph = {module_name(p): imports(p) - {module_name(p)} for p in sources()}
    assert "model.files.tensor_file" in graph["model.files.checkpoint"]  # `from pkg import x`
    assert "model.config" in graph["model.methods.base"]  # an import for type checking only
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


def test_no_method_imports_another():
    """A method module imports the base, the registry and helpers, never a sibling method:
    what two methods share lives in ``model.methods.base``."""
    methods = ROOT / "model" / "methods"
    shared = {"model.methods", "model.methods.base", "model.methods.registry"}
    siblings = {module_name(p) for p in methods.glob("*.py")} - shared
    bad = {p.name: sorted(imports(p) & (siblings - {module_name(p)}))
           for p in methods.glob("*.py") if module_name(p) in siblings}
    assert {k: v for k, v in bad.items() if v} == {}


def test_base_and_registry_import_no_method():
    """The base knows no method, and the registry finds them by name (``MODULES``) only."""
    methods = ROOT / "model" / "methods"
    siblings = {module_name(p) for p in methods.glob("*.py")} - {
        "model.methods", "model.methods.base", "model.methods.registry"}
    for name in ("base.py", "registry.py"):
        assert imports(methods / name) & siblings == set(), name


@pytest.mark.parametrize("package", sorted(p.parent.name for p in (ROOT / "model").glob(
    "*/__init__.py")))
def test_no_model_package_holds_more_than_12_modules(package):
    modules = sorted(p.stem for p in (ROOT / "model" / package).glob("*.py")
                     if p.stem != "__init__")
    assert len(modules) <= MAX_MODULES, modules


def test_tests_mirror_the_code():
    """``tests/`` mirrors the code: each folder of tests is a code folder's twin
    (``tests/model/posterior/`` for ``model/posterior/``), and ``test_NAME.py`` lives in the
    twin of the folder holding ``NAME.py`` (or ``NAME.sh``) wherever such a module exists."""
    tests = ROOT / "tests"
    folders = {p.parent.relative_to(tests) for p in tests.rglob("*.py")}
    assert sorted(str(f) for f in folders if not (ROOT / f).is_dir()) == []
    homes: dict[str, set[Path]] = {}
    for p in [*sources(), *(ROOT / "scripts").rglob("*.sh")]:
        homes.setdefault(p.stem, set()).add(p.parent.relative_to(ROOT))
    astray = {str(p.relative_to(ROOT)): sorted(f"tests/{h}/" for h in homes[p.stem[5:]])
              for p in tests.rglob("test_*.py")
              if p.stem[5:] in homes and p.parent.relative_to(tests) not in homes[p.stem[5:]]}
    assert astray == {}
