"""Orchestration is the top floor: the packages below run without it (and without Prefect)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BELOW = ("pipeline", "model", "stages", "cli", "serve")


def imported(path: Path) -> set[str]:
    """Top-level package names that ``path`` imports, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_lower_floor_imports_orchestration():
    offenders = [str(path.relative_to(ROOT)) for package in BELOW
                 for path in sorted((ROOT / package).rglob("*.py"))
                 if {"orchestration", "prefect"} & imported(path)]
    assert offenders == []


def test_the_checker_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from orchestration.flows import retrain\n")
    assert "orchestration" in imported(module)
