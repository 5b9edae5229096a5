"""train, evaluate and transfer run their jobs through one runner and keep no module state."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import ROOT

#: The stages' job code and the runner.
MODULES = ("stages/train.py", "stages/evaluate.py", "stages/transfer.py",
           "model/evaluation/transfer.py", "pipeline/workers.py")
#: Calls that build a mutable container.
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque"}


def _mutable(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                          ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return name in MUTABLE_CALLS
    return False


def module_state(source: str) -> list[str]:
    """Names bound at module level to a dict, list or set (literal, comprehension or call),
    and ``global`` statements anywhere."""
    tree = ast.parse(source)
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and _mutable(node.value):
            found += [ast.unparse(t) for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and _mutable(node.value):
            found.append(ast.unparse(node.target))
    found += [f"global {', '.join(n.names)}" for n in ast.walk(tree)
              if isinstance(n, ast.Global)]
    return found


def test_the_check_finds_module_state():
    assert module_state("_SHARED: dict[str, int] = {}\nX = list()\nY = (1, 2)\n"
                        "def f():\n    global Z\n") == ["_SHARED", "X", "global Z"]


@pytest.mark.parametrize("path", MODULES)
def test_no_module_level_mutable_state(path):
    assert module_state((ROOT / path).read_text()) == []


def _runner_calls(path: str) -> list[str]:
    """Where ``path`` takes ``run_jobs`` from, and how many times it calls it."""
    tree = ast.parse((ROOT / path).read_text())
    imports = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and any(a.name == "run_jobs" for a in node.names)]
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "run_jobs"]
    return imports + [f"{len(calls)} call(s)"]


def test_train_evaluate_and_transfer_call_the_same_runner():
    import model.evaluation.transfer
    import pipeline.workers
    from stages import evaluate, train

    for path in ("stages/train.py", "stages/evaluate.py", "model/evaluation/transfer.py"):
        assert _runner_calls(path) == ["pipeline.workers", "1 call(s)"], path
    assert train.run_jobs is evaluate.run_jobs is model.evaluation.transfer.run_jobs \
        is pipeline.workers.run_jobs
    # Nobody else starts processes for these stages.
    for path in MODULES[:-1]:
        text = (ROOT / path).read_text()
        assert "multiprocessing" not in text and "ProcessPoolExecutor" not in text, path
