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


#: Each floor and the floors it may import, itself included (ARCHITECTURE.md's table).
FLOORS = {
    "pipeline": {"pipeline"},
    "model": {"model", "pipeline"},
    "stages": {"stages", "model", "pipeline"},
    "cli": {"cli", "model", "pipeline"},
    "serve": {"serve", "model", "pipeline"},
    "benchmarks": {"benchmarks", "model", "pipeline", "serve"},
    "scripts": {"scripts", "pipeline", "model", "stages", "cli", "serve", "benchmarks"},
    "orchestration": {"orchestration", "pipeline"},
}
#: The calls that import a module by a name held in a string.
BY_NAME_CALLS = {"import_module", "__import__"}


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _table(tree: ast.Module, name: str) -> ast.expr | None:
    """The value a module-level assignment gives ``name``."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node.value
    return None


def _strings(nodes) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _registry_modules(tree: ast.Module) -> list[str]:
    """``model/methods/registry.py``: the keys of ``MODULES``."""
    return _strings(_table(tree, "MODULES").keys)


def _entry_commands(tree: ast.Module) -> list[str]:
    """``cli/entry.py``: ``cli.<command>`` for every ``_run("<command>")``."""
    return [f"cli.{name}" for node in ast.walk(tree) if isinstance(node, ast.Call)
            and _call_name(node) == "_run" for name in _strings(node.args)]


def _declared_owners(tree: ast.Module) -> list[str]:
    """Any module: the owners it hands :func:`pipeline.sections.declare_sections`, which
    imports them by name (a dict literal, or a module-level dict passed by name)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) == "declare_sections" and node.args:
            arg = node.args[0]
            table = _table(tree, arg.id) if isinstance(arg, ast.Name) else arg
            assert isinstance(table, ast.Dict), "declare_sections is given no dict the test reads"
            found += _strings(table.values)
    return found


#: The modules whose ``import_module`` calls read names from a table, and how the test reads
#: that table; ``pipeline/sections.py`` imports what ``declare_sections`` was handed, and that
#: is charged to the module that hands it (:func:`_declared_owners`).
BY_NAME_TABLES = {
    "model/methods/registry.py": _registry_modules,
    "cli/entry.py": _entry_commands,
    "pipeline/sections.py": lambda tree: [],
}


def imports_by_name(path: Path) -> set[str]:
    """The modules ``path`` imports by a name held in a string."""
    tree = ast.parse(path.read_text())
    rel = str(path.relative_to(ROOT))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and _call_name(n) in BY_NAME_CALLS]
    found = {s for call in calls for s in _strings(call.args[:1])}
    if any(not _strings(call.args[:1]) for call in calls):
        assert rel in BY_NAME_TABLES, (
            f"{rel} imports a module by a name the layering test cannot read: add how to read "
            "its table to BY_NAME_TABLES")
        found |= set(BY_NAME_TABLES[rel](tree))
    return found | set(_declared_owners(tree))


def test_imports_by_name_are_read():
    """The three tables of names imported by ``importlib`` are read (and name real modules)."""
    known = {module_name(p) for p in sources()}
    registry = imports_by_name(ROOT / "model" / "methods" / "registry.py")
    assert "model.methods.regrab" in registry and registry <= known
    entry = imports_by_name(ROOT / "cli" / "entry.py")
    assert {"cli.predict", "cli.models"} <= entry and entry <= known
    owners = imports_by_name(ROOT / "stages" / "__init__.py")
    assert {"model.config", "pipeline.gate"} <= owners and owners <= known


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_each_floor_imports_only_the_floors_it_stands_on(floor):
    """Imports anywhere in a module (in functions, for type checking) and imports by name
    (``importlib`` over a table of strings) follow the floors: orchestration imports
    ``pipeline/`` only, nothing imports ``orchestration/``, no library floor imports
    ``stages/``."""
    bad = {}
    for path in (ROOT / floor).rglob("*.py"):
        named = imports(path) | imports_by_name(path)
        wrong = sorted(i for i in named if i.split(".")[0] in FLOORS
                       and i.split(".")[0] not in FLOORS[floor])
        if wrong:
            bad[str(path.relative_to(ROOT))] = wrong
    assert bad == {}


def test_stages_hold_no_function_another_module_imports():
    """A stage module is run (``python -m stages.<name>``), never imported: what two modules
    share lives in ``model/`` or ``pipeline/``. Only the package itself (the catalog of
    ``params.yaml``'s sections) may be imported, and a test may import a stage to run it."""
    bad = {}
    for path in sources():
        named = imports(path) | imports_by_name(path)
        wrong = sorted(i for i in named if i.startswith("stages."))
        if wrong:
            bad[str(path.relative_to(ROOT))] = wrong
    assert bad == {}


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
