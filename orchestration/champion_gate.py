"""Score the promoted models against a run's new ones, in the run's workspace, and gate.

The champion is the version assigned to ``prod`` in the registry (``pipeline.registry``): its
REGRAB model of every split is copied out of DVC at that version's commit into the workspace
(the shared cache, else the DVC remote). ``scripts/paired_runs.py`` then scores both on the same
test episodes, as a subprocess of the workspace's own code (no model code runs in the flow's
process), and :func:`pipeline.gate.decide` reads its tables. A benchmark whose models the run
did not change (the champion's bytes, as when new data reaches only another benchmark) is not
scored: both sides would give the same answer on every episode. Nothing here imports Prefect.
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestration import dvc_access
from orchestration.dvc_access import StageError
from orchestration.workspace import Workspace
from pipeline import registry
from pipeline.config import load_benchmarks
from pipeline.errors import PipelineError
from pipeline.gate import (
    NOT_COMPARABLE_EXIT,
    UNCHANGED,
    Decision,
    PromoteConfig,
    decide,
    not_comparable,
)
from pipeline.report import REFERENCE

#: Where the champion's models are copied in the workspace, and the paired tables written.
CHAMPION_DIR = Path(".regrab") / "champion"
#: The project's paired comparison, relative to the workspace.
PAIRED_RUNS = Path("scripts") / "paired_runs.py"


class NotComparable(PipelineError):
    """The champion saw a test relation of the run's splits: no paired comparison."""


def check_benchmarks(params: Path, cfg: PromoteConfig) -> None:
    """Refuse ``promote.benchmarks`` that ``benchmarks`` lacks, before hours of training.

    Raises:
        PipelineError: naming the unknown benchmark and the known ones.
    """
    benches = load_benchmarks(params)
    unknown = [b for b in cfg.benchmarks if b not in benches]
    if unknown:
        raise PipelineError(f"promote.benchmarks names {', '.join(unknown)}, which the "
                            f"benchmarks section of {params} lacks ({', '.join(benches)}); "
                            "list benchmarks the pipeline trains")


def champion_models(ws: Workspace, champion: registry.Version, bench: str,
                    splits: Path) -> Path:
    """The champion's REGRAB models of ``bench``, one per split the workspace has."""
    dest = ws.path / CHAMPION_DIR / bench
    for split in sorted(p.name for p in splits.glob("split_*")):
        ref = registry.Ref(registry.NAME, champion.version, None, f"{bench}/{split}/{REFERENCE}")
        registry.checkout(ws.path, ref, dest / split / REFERENCE)
    return dest


def same_models(champion_dir: Path, models: Path) -> bool:
    """Whether every file of the champion's REGRAB models (``champion_dir/split_k/regrab``)
    is in ``models`` with the same bytes, for at least one split."""
    files = [p for p in champion_dir.rglob("*") if p.is_file()]
    return bool(files) and all(
        (models / p.relative_to(champion_dir)).is_file()
        and filecmp.cmp(p, models / p.relative_to(champion_dir), shallow=False) for p in files)


def paired_table(ws: Workspace, bench: str, splits: Path, champion_dir: Path,
                 cfg: PromoteConfig, log: Callable[[str], Any]) -> dict[str, Any]:
    """``scripts/paired_runs.py`` of the champion (A) against the workspace's models (B)."""
    out = ws.path / CHAMPION_DIR / f"paired_{bench}.json"
    cmd = [sys.executable, str(PAIRED_RUNS), "--splits", str(splits), "--a", str(champion_dir),
           "--b", str(ws.path / registry.MODELS_DIR / bench), "--methods", REFERENCE,
           "--settings", ",".join(cfg.settings), "--episodes", str(cfg.episodes),
           "--params", "params.yaml", "--out", str(out), "--a-trained-elsewhere"]
    log("$ " + " ".join(cmd))
    # The workspace's packages first: the code of the commit being scored.
    path = os.pathsep.join(p for p in (str(ws.path), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(cmd, cwd=ws.path, env={**dvc_access.dvc_env(), "PYTHONPATH": path},
                          capture_output=True, text=True)
    for line in done.stdout.splitlines():
        log(line)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if done.returncode == NOT_COMPARABLE_EXIT:
            raise NotComparable(f"{bench}: {last.removeprefix('error: not comparable: ')}")
        raise StageError(f"scoring the champion against this run on {bench} failed: {last}")
    return json.loads(out.read_text())


def score(ws: Workspace, champion: registry.Version | None, cfg: PromoteConfig,
          log: Callable[[str], Any]) -> Decision:
    """The gate's decision: ``no champion``, or on the paired tables of every benchmark.

    Raises:
        PipelineError: a benchmark of ``promote.benchmarks`` is not in ``benchmarks``, the
            champion's models cannot be copied out, or the scoring failed.
    """
    if champion is None:
        return decide(None, cfg)
    check_benchmarks(ws.path / "params.yaml", cfg)
    benches = load_benchmarks(ws.path / "params.yaml")
    tables: dict[str, Any] = {}
    for bench in cfg.benchmarks:
        splits = ws.path / benches[bench].splits
        champion_dir = champion_models(ws, champion, bench, splits)
        log(f"{champion.tag}'s {bench} models copied to {champion_dir}")
        if same_models(champion_dir, ws.path / registry.MODELS_DIR / bench):
            log(f"{bench}: this run's {REFERENCE} models are {champion.tag}'s, byte for byte; "
                "not scored (every paired difference would be 0)")
            tables[bench] = UNCHANGED
            continue
        try:
            tables[bench] = paired_table(ws, bench, splits, champion_dir, cfg, log)
        except NotComparable as exc:
            log(f"{champion.tag} and this run cannot be paired: {exc}")
            return not_comparable(str(exc))
    return decide(tables, cfg)
