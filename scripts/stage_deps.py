"""Keep each DVC stage's code deps equal to the project modules its command imports.

A stage file imports ``pipeline/`` and ``model/`` modules; if ``dvc.yaml`` named only the
stage file, editing an imported module would leave ``dvc status`` green and ``dvc repro``
would serve outputs today's code does not make. This script follows the imports of each
stage's ``python -m stages.<name>`` (every ``import`` statement, also those inside
functions, plus the method modules :data:`model.methods.registry.MODULES` names) and writes the
project files found into the stage's ``deps``, keeping its data deps as they are.

Usage:
    python scripts/stage_deps.py           # rewrite dvc.yaml's code deps
    python scripts/stage_deps.py --check   # exit 1 and list the stages whose deps differ
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The project's packages: deps under them are code, generated here.
PACKAGES = ("stages", "model", "pipeline", "cli")
#: Module-level names whose string values name modules imported by ``importlib``.
DYNAMIC = ("MODULES",)
COMMAND = re.compile(r"python -m (stages\.[a-z_]+)")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The file of a project module (``model.methods.registry`` ->
    model/methods/registry.py), or None."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Project modules ``path`` imports (its package ``__init__`` files included)."""
    tree = ast.parse(path.read_text(), str(path))
    here = ".".join(path.relative_to(root).with_suffix("").parts)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                parent = here.split(".")[: -node.level]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from model import x`
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in DYNAMIC for t in node.targets):
            # A tuple or list of module names, or a dict keyed by them.
            value = node.value
            names = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
            found.update(e.value for e in names
                         if isinstance(e, ast.Constant) and isinstance(e.value, str))
    # Importing a.b.c runs a/__init__.py and a/b/__init__.py too.
    for name in list(found):
        parts = name.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return {m for m in found if module_file(m, root) is not None}


def closure(module: str, root: Path = ROOT) -> list[str]:
    """Every project file ``module`` imports, directly or not, itself included (sorted)."""
    seen: set[Path] = set()
    todo = [module]
    while todo:
        path = module_file(todo.pop(), root)
        if path is None or path in seen:
            continue
        seen.add(path)
        todo.extend(imports_of(path, root))
    return sorted(str(p.relative_to(root)) for p in seen)


def is_code(dep: str) -> bool:
    return dep.split("/")[0] in PACKAGES


def stage_blocks(doc: dict) -> list[tuple[str, dict]]:
    """``(name, stage)`` for every stage; a ``foreach`` stage's ``do`` block stands for it."""
    out = []
    for name, stage in doc["stages"].items():
        block = stage.get("do", stage)
        out.append((name, block))
    return out


def wanted_deps(block: dict, root: Path = ROOT) -> list[str] | None:
    """The block's deps with generated code deps (None: its command runs no stage module)."""
    match = COMMAND.search(" ".join(str(block.get("cmd", "")).split()))
    if match is None:
        return None
    data = [d for d in block.get("deps", []) if not is_code(str(d))]
    return closure(match.group(1), root) + data


def main(argv: list[str] | None = None) -> int:
    from ruamel.yaml import YAML

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="report, do not rewrite")
    parser.add_argument("--dvc-yaml", type=Path, default=ROOT / "dvc.yaml")
    args = parser.parse_args(argv)
    yaml = YAML()
    yaml.width = 100
    yaml.indent(mapping=2, sequence=4, offset=2)
    doc = yaml.load(args.dvc_yaml.read_text())
    stale = []
    for name, block in stage_blocks(doc):
        want = wanted_deps(block, args.dvc_yaml.parent)
        if want is None or [str(d) for d in block.get("deps", [])] == want:
            continue
        stale.append(name)
        if not args.check:
            block["deps"] = want
    if args.check:
        for name in stale:
            print(f"dvc.yaml stage {name}: code deps differ from its imports; run "
                  "python scripts/stage_deps.py")
        return 1 if stale else 0
    if stale:
        from pipeline.io import atomic_path

        with atomic_path(args.dvc_yaml) as tmp, tmp.open("w") as fh:  # never half a dvc.yaml
            yaml.dump(doc, fh)
    print(f"updated {len(stale)} stage(s): {', '.join(stale) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
