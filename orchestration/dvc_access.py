"""DVC access for the Prefect flow, through DVC's public interfaces only.

Reading the pipeline uses ``dvc.repo.Repo``'s public index (its stages, their
dependencies and outputs, and the stage graph); nothing here reads DVC's data index or
cache, so a fresh clone with an empty cache plans exactly like a warm workspace.
Everything that changes the workspace runs the ``dvc`` command line in a subprocess
(``dvc repro``, ``dvc exp save``), the commands a user would type; their output goes
line by line to a logging callable so Prefect shows it as the stage's log.

Nothing here imports Prefect: the flow passes its run logger in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestration import interrupt
from pipeline.errors import PipelineError

#: How many trailing output lines of a failed DVC command go into the raised error.
OUTPUT_TAIL_LINES = 6
#: tqdm redraws many times a second; in a log, one line per this many seconds is plenty.
PROGRESS_EVERY_S = 15


class StageError(PipelineError):
    """A DVC command exited non-zero; the message carries the tail of its output."""


@dataclass(frozen=True)
class PlannedStage:
    """One stage of the DVC pipeline, as ``dvc repro`` would run it.

    Attributes:
        name: DVC address of the stage (``train``, or ``sub/dvc.yaml:train``).
        files: files ``dvc exp save`` must carry for it when git does not track them
            (dvc.yaml, dvc.lock, uncached outputs such as metrics, plain-file deps),
            relative to the repo root.
    """

    name: str
    files: tuple[str, ...]


def repo_root(repo_dir: str | os.PathLike[str]) -> Path:
    """The resolved project root; raise unless it holds ``.dvc/`` and ``dvc.yaml``."""
    root = Path(repo_dir).expanduser().resolve()
    if not (root / ".dvc").is_dir() or not (root / "dvc.yaml").is_file():
        raise PipelineError(
            f"{root} is not a DVC pipeline (needs .dvc/ and dvc.yaml); "
            "pass --repo-dir (repo_dir) pointing at the project root"
        )
    return root


def require_git_commit(root: Path) -> None:
    """DVC experiments hang off a git commit; fail before running anything if none."""
    done = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "HEAD"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise PipelineError(
            f"{root} is not a git repository with a commit, and a DVC experiment needs one "
            "as its baseline; commit the project (git init && git add -A && git commit) "
            "or run without overrides"
        )


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def plan_stages(
    repo_dir: str | os.PathLike[str], targets: list[str] | None = None
) -> list[PlannedStage]:
    """Stages ``dvc repro [targets]`` would consider, upstream first.

    Walks the stage graph of ``Repo.index`` (built from ``dvc.yaml`` alone) the way
    ``dvc repro`` does: depth first, dependencies before dependents, and a frozen stage
    does not pull in its upstream. ``.dvc`` data sources are left out: ``dvc repro``
    never runs a command for them.

    Raises:
        PipelineError: not a DVC project, unreadable ``dvc.yaml``, or an unknown target.
    """
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    root = repo_root(repo_dir)

    def address(stage: Any) -> str:
        return stage_address(stage, root)

    try:
        with Repo(str(root)) as repo:
            graph = repo.index.graph  # edge: stage -> a stage it depends on
            by_address = {address(s): s for s in graph.nodes}
            tracked = [os.path.relpath(o.fs_path, root) for o in repo.index.outs]
            if targets:
                unknown = [t for t in targets if t.removeprefix("dvc.yaml:") not in by_address]
                if unknown:
                    raise PipelineError(
                        f"unknown target {', '.join(unknown)}; valid stages: "
                        + ", ".join(a for a, s in by_address.items() if not s.is_data_source)
                    )
                starts = [by_address[t.removeprefix("dvc.yaml:")] for t in targets]
            else:
                starts = list(graph.nodes)
            order: list[Any] = []
            seen: set[Any] = set()
            for start in starts:
                _postorder(graph, start, seen, order)
            return [
                PlannedStage(address(s), _stage_files(s, root, tracked))
                for s in order
                if not s.is_data_source
            ]
    except DvcException as exc:
        raise PipelineError(f"DVC cannot read the pipeline in {root}: {exc}; fix dvc.yaml") from exc


def stage_address(stage: Any, root: Path) -> str:
    """The stage's DVC address relative to ``root`` (``train``, or ``sub/dvc.yaml:train``)."""
    from dvc.stage import PipelineStage

    dvcfile = os.path.relpath(stage.dvcfile.path, root)
    if isinstance(stage, PipelineStage):
        return stage.name if dvcfile == "dvc.yaml" else f"{dvcfile}:{stage.name}"
    return dvcfile


def _postorder(graph: Any, start: Any, seen: set[Any], order: list[Any]) -> None:
    """Append ``start``'s upstream, then ``start``; iterative so deep DAGs cannot overflow."""
    if start in seen:
        return
    seen.add(start)
    stack = [(start, iter(() if start.frozen else graph.successors(start)))]
    while stack:
        node, children = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            order.append(node)
        elif child not in seen:
            seen.add(child)
            stack.append((child, iter(() if child.frozen else graph.successors(child))))


def _stage_files(stage: Any, root: Path, tracked: list[str]) -> tuple[str, ...]:
    """Files of ``stage`` that git, not DVC's cache, must hold for an experiment."""
    dvcfile = os.path.relpath(stage.dvcfile.path, root)
    files = [dvcfile]
    if dvcfile.endswith(".yaml"):
        files.append(dvcfile[: -len(".yaml")] + ".lock")
    for dep in stage.deps:
        path = os.path.relpath(dep.fs_path, root)
        if dep.is_in_repo and not _under(path, tracked):
            files.append(path)
    for out in stage.outs:
        if out.is_in_repo and not out.use_cache:
            files.append(os.path.relpath(out.fs_path, root))
    return tuple(dict.fromkeys(files))


def dvc_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for DVC and the stage commands it starts."""
    # Stage commands say `python ...`: make that the interpreter running this flow (as
    # an activated venv would), even when the serve process was started by full path.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {
        **os.environ,
        "PATH": path,
        "PYTHONUNBUFFERED": "1",
        "DVC_NO_ANALYTICS": "1",
        # tqdm reads TQDM_* defaults from the environment: one redraw per interval.
        "TQDM_MININTERVAL": str(PROGRESS_EVERY_S),
        **(extra or {}),
    }


def run_dvc(
    args: list[str],
    root: Path,
    what: str,
    log: Callable[[str], Any],
    extra_env: dict[str, str] | None = None,
) -> None:
    """Run ``dvc <args>`` in ``root``, passing each output line to ``log``.

    stdout and stderr are read as one text stream with universal newlines, so a
    progress bar's ``\\r`` redraw arrives as a line of its own.

    Raises:
        StageError: when DVC exits non-zero, with the last lines of its output.
    """
    log("$ dvc " + " ".join(args))
    tail: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dvc", *args],
        cwd=root,
        env=dvc_env(extra_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    try:
        assert proc.stdout is not None
        with interrupt.cleanup(proc.terminate):  # Ctrl-C ends the run without this `except`
            for line in proc.stdout:
                if text := line.rstrip():
                    tail.append(text)
                    log(text)
            code = proc.wait()
    except BaseException:
        # Cancelled or interrupted: do not leave the stage running on its own.
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    if code != 0:
        raise StageError(f"{what} failed (dvc exit {code}): {failure_detail(tail)}; "
                         "see this task's log")


#: A progress bar's redraw (tqdm: ``fetch:  44%|####  | 4/9``) or a terminal escape.
PROGRESS_LINE = re.compile(r"\x1b|\d+%\|")


def failure_detail(tail: Iterable[str]) -> str:
    """What a failed ``dvc`` run says: the stage's own ``error:`` line when it printed one
    (the project's stages end that way), else the last lines, less progress bars."""
    lines = [line for line in tail if not PROGRESS_LINE.search(line)]
    errors = [line for line in lines if line.startswith("error:")]
    return errors[-1] if errors else " | ".join(lines) or "no output"


def repro_stage(
    root: Path, stage: str, log: Callable[[str], Any], extra_env: dict[str, str] | None = None
) -> None:
    """``dvc repro --single-item <stage>``: run it if its deps, params or outs changed."""
    run_dvc(["repro", "--single-item", stage], root, f"stage '{stage}'", log, extra_env)


def save_experiment(
    root: Path, name: str, stages: list[PlannedStage], log: Callable[[str], Any]
) -> None:
    """``dvc exp save --name <name>``, carrying the stages' files git does not track."""
    include = dict.fromkeys(p for s in stages for p in s.files if (root / p).exists())
    args = ["exp", "save", "--name", name]
    for path in include:
        args += ["--include-untracked", path]
    args += [stage.name for stage in stages]
    run_dvc(args, root, f"saving experiment '{name}'", log)


def read_metrics(root: Path) -> dict[str, Any]:
    """``{path: data}`` of the workspace metrics files ``dvc.yaml`` declares, as DVC reads them.

    Raises:
        StageError: when ``dvc metrics show`` fails.
    """
    done = subprocess.run(
        [sys.executable, "-m", "dvc", "metrics", "show", "--json"],
        cwd=root,
        env=dvc_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise StageError(f"dvc metrics show failed in {root}: {done.stderr.strip()[-500:]}")
    shown = json.loads(done.stdout or "{}")
    # One revision (the workspace); its key is "" or "workspace" depending on the DVC version.
    workspace = next(iter(shown.values()), {}) if isinstance(shown, dict) else {}
    return {
        path: entry["data"]
        for path, entry in sorted(workspace.get("data", {}).items())
        if isinstance(entry, dict) and "data" in entry
    }


def metric_producers(root: Path) -> dict[str, str]:
    """``{metrics file: the stage that writes it}`` for every metric ``dvc.yaml`` declares.

    Raises:
        PipelineError: DVC cannot read the pipeline.
    """
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo:
            return {os.path.relpath(out.fs_path, root): stage_address(stage, root)
                    for stage in repo.index.stages for out in stage.outs if out.metric}
    except DvcException as exc:
        raise PipelineError(f"DVC cannot read the pipeline in {root}: {exc}; fix dvc.yaml") from exc
