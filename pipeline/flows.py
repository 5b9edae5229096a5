"""Prefect flow ``regrab-retrain``: the repo's DVC pipeline, one Prefect task per stage.

DVC owns caching and the experiment record; Prefect owns scheduling, retries and
observability. The flow never writes an artifact itself: every file it changes is
written by DVC (``params.yaml`` through DVC's own ``--set-param`` code, outputs and
``dvc.lock`` by ``dvc repro``, the experiment by ``dvc exp save``).

Why not one ``dvc exp run`` call: that would be a single opaque task. DVC documents
``dvc exp run`` as ``dvc repro`` followed by ``dvc exp save``, so the flow splits it
along that seam:

1. validate the overrides against ``params.yaml`` (unknown key: error, nothing runs);
2. ``set-params``: apply them with ``dvc.utils.hydra.apply_overrides``, the function
   behind ``dvc exp run -S key=value``;
3. one task per stage, in the order DVC's own planner (``plan_repro``) gives for
   ``dvc repro [targets]``, each running ``dvc repro --single-item <stage>``;
4. ``save-experiment``: ``dvc exp save --name <name>`` with the stages' git-tracked
   files (``dvc exp run`` stages the same ones), so the run shows in ``dvc exp show``;
5. ``publish-metrics``: the metrics files declared in ``dvc.yaml`` become keyed table
   artifacts plus one markdown summary, and are returned.

Without overrides steps 2 and 4 are skipped: that is a plain ``dvc repro``.

After a successful run the workspace holds the experiment (its params, outputs and
``dvc.lock``), as after ``dvc exp run``. After a failed one the overridden keys are set
back to their previous values (``restore-params``) so the next scheduled run does not
inherit them; DVC removed the failed stage's outputs before running it, and the stages
write atomically, so no half-written artifact is left.

Run it once, locally and without a server (Prefect starts a temporary one)::

    python -m pipeline.flows -S train.epochs=1 --repo-dir .
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from pipeline.errors import PipelineError, run_cli

#: Prefect flow name; the deployment is ``regrab-retrain/scheduled``.
FLOW_NAME = "regrab-retrain"
#: Stages that download data: the only ones retried (a network blip is worth a retry,
#: a bug in a training stage is not).
NETWORK_STAGES = frozenset({"fetch"})
NETWORK_RETRIES = 2
#: Seconds between retries of a network stage.
NETWORK_RETRY_DELAY_S = 60.0
#: How many trailing stderr lines of a failed stage go into the raised error.
STDERR_TAIL_LINES = 6
#: Progress bars redraw with '\r' many times a second; log at most one per this many s.
PROGRESS_LOG_EVERY_S = 15.0
PARAMS_FILE = "params.yaml"


class StageError(PipelineError):
    """A DVC stage exited non-zero; the message carries the tail of its stderr."""


@dataclass(frozen=True)
class PlannedStage:
    """One stage of the DVC pipeline, as ``dvc repro`` would run it.

    Attributes:
        name: DVC address of the stage (``train``, or ``sub/dvc.yaml:train``).
        files: git-tracked files ``dvc exp run`` stages for it (dvc.yaml, dvc.lock,
            uncached outputs such as metrics), relative to the repo root.
    """

    name: str
    files: tuple[str, ...]


# --------------------------------------------------------------------------- planning


def _repo_root(repo_dir: str | os.PathLike[str]) -> Path:
    root = Path(repo_dir).expanduser().resolve()
    if not (root / ".dvc").is_dir() or not (root / "dvc.yaml").is_file():
        raise PipelineError(
            f"{root} is not a DVC pipeline (needs .dvc/ and dvc.yaml); "
            "pass repo_dir pointing at the project root"
        )
    return root


def plan_stages(
    repo_dir: str | os.PathLike[str], targets: list[str] | None = None
) -> list[PlannedStage]:
    """Stages ``dvc repro [targets]`` would consider, upstream first.

    Uses DVC's own planner on the graph built from ``dvc.yaml`` (frozen stages cut
    from their dependencies as DVC does), so no stage name is hard-coded here.
    ``.dvc`` data sources are left out: ``dvc repro`` never runs a command for them.
    """
    from dvc.exceptions import DvcException
    from dvc.repo import Repo
    from dvc.repo.reproduce import collect_stages, get_active_graph, plan_repro
    from dvc.stage import PipelineStage
    from dvc.stage.utils import _get_stage_files

    root = _repo_root(repo_dir)

    def address(stage: Any) -> str:
        # Stage.addressing is relative to the current directory; DVC is run from root.
        dvcfile = os.path.relpath(os.path.abspath(stage.dvcfile.path), root)
        if isinstance(stage, PipelineStage):
            return stage.name if dvcfile == "dvc.yaml" else f"{dvcfile}:{stage.name}"
        return dvcfile

    def files_of(stage: Any) -> tuple[str, ...]:
        # _get_stage_files answers relative to the current directory; make it root-relative.
        return tuple(os.path.relpath(os.path.abspath(p), root) for p in _get_stage_files(stage))

    try:
        with Repo(str(root)) as repo:
            try:
                chosen = (
                    collect_stages(repo, [_abs_target(root, t) for t in targets])
                    if targets
                    else None
                )
            except DvcException as exc:
                names = ", ".join(address(s) for s in repo.index.stages)
                raise PipelineError(
                    f"unknown target in {targets} ({exc}); valid stages: {names}"
                ) from exc
            steps = plan_repro(get_active_graph(repo.index.graph), chosen)
            return [
                PlannedStage(address(stage), files_of(stage))
                for stage in steps
                if not stage.is_data_source
            ]
    except DvcException as exc:
        raise PipelineError(f"DVC cannot read the pipeline in {root}: {exc}; fix dvc.yaml") from exc


def _abs_target(root: Path, target: str) -> str:
    """A stage target relative to the repo root, made absolute (DVC reads it from cwd)."""
    if ":" in target:
        path, name = target.rsplit(":", 1)
        return f"{root / path}:{name}"
    if target.endswith((".yaml", ".dvc")):
        return str(root / target)
    return f"{root / 'dvc.yaml'}:{target}"


def _params_has_key(params: Any, parts: list[str]) -> bool:
    node = params
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def _params_get(params: Any, parts: list[str]) -> Any:
    for part in parts:
        params = params[int(part)] if isinstance(params, list) else params[part]
    return params


def _render(value: Any, nested: bool = False) -> str:
    """Render a Python value in the override grammar ``dvc exp run -S`` parses (Hydra)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # A top-level string is passed verbatim, exactly like `-S key=value` on the
        # command line ("5" becomes the number 5; write "'5'" to keep a string).
        return json.dumps(value) if nested else value
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_render(v, nested=True) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_render(v, nested=True)}" for k, v in value.items()) + "}"
    raise PipelineError(
        f"override value {value!r} has unsupported type {type(value).__name__}; "
        "use a number, string, bool, null, list or mapping"
    )


def validate_overrides(
    repo_dir: str | os.PathLike[str], overrides: dict[str, Any] | None
) -> list[str]:
    """Check every override key exists in ``params.yaml``; return ``key=value`` strings.

    Raises:
        PipelineError: naming the first unknown key and the valid top-level sections.
    """
    return _check_overrides(repo_dir, overrides)[0]


def _check_overrides(
    repo_dir: str | os.PathLike[str], overrides: dict[str, Any] | None
) -> tuple[list[str], list[str]]:
    """``validate_overrides``, plus the ``key=value`` strings that restore today's values."""
    if not overrides:
        return [], []
    root = _repo_root(repo_dir)
    path = root / PARAMS_FILE
    if not path.is_file():
        raise PipelineError(
            f"overrides given but {path} does not exist; add it or drop the overrides"
        )
    params = yaml.safe_load(path.read_text()) or {}
    args, restore = [], []
    for key, value in overrides.items():
        if not isinstance(key, str) or not key or not _params_has_key(params, key.split(".")):
            sections = ", ".join(sorted(params)) if isinstance(params, dict) else "(none)"
            raise PipelineError(
                f"unknown parameter '{key}' in overrides: {PARAMS_FILE} has no such key; "
                f"use section.key with one of the sections: {sections}"
            )
        args.append(f"{key}={_render(value)}")
        restore.append(f"{key}={_render(_params_get(params, key.split('.')), nested=True)}")
    return args, restore


def _require_git_commit(root: Path) -> None:
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
            f"{root} has no git commit, and a DVC experiment needs one as its baseline; "
            "commit the project (git add -A && git commit) or run without overrides"
        )


def experiment_name(run_name: str | None, run_id: str | None) -> str:
    """A git-ref-safe, unique experiment name tied to the Prefect flow run."""
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", run_name or "run").strip("-") or "run"
    suffix = (run_id or "").replace("-", "")[:6]
    return f"{base}-{suffix}" if suffix else base


# --------------------------------------------------------------------------- running DVC


def _pump(stream: IO[bytes], label: str, logger: Any, tail: deque[str] | None) -> None:
    """Log a child's output line by line; collapse '\\r' progress redraws."""
    last_progress = 0.0
    buf = b""
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            break
        buf += chunk
        while True:
            cut = min((i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0), default=-1)
            if cut < 0:
                break
            line, sep, buf = buf[:cut], buf[cut : cut + 1], buf[cut + 1 :]
            text = line.decode(errors="replace").rstrip()
            if not text:
                continue
            if sep == b"\r":
                now = time.monotonic()
                if now - last_progress < PROGRESS_LOG_EVERY_S:
                    continue
                last_progress = now
            elif tail is not None:
                tail.append(text)
            logger.info("%s %s", label, text)
    text = buf.decode(errors="replace").rstrip()
    if text:
        if tail is not None:
            tail.append(text)
        logger.info("%s %s", label, text)


def run_dvc(args: list[str], root: Path, what: str) -> None:
    """Run ``dvc <args>`` in ``root``, streaming its output to the Prefect logger.

    Raises:
        StageError: when DVC exits non-zero, with the last lines of its stderr.
    """
    logger = get_run_logger()
    cmd = [sys.executable, "-m", "dvc", *args]
    logger.info("$ dvc %s", " ".join(args))
    # Stage commands say `python ...`: make that the interpreter running this flow (as
    # an activated venv would), even when the serve process was started by full path.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1", "DVC_NO_ANALYTICS": "1"}
    tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    readers = [
        threading.Thread(target=_pump, args=(proc.stdout, "|", logger, None), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, "!", logger, tail), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        code = proc.wait()
    except BaseException:
        # Cancelled or interrupted: do not leave the stage running on its own.
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        for reader in readers:
            reader.join(timeout=10)
    if code != 0:
        detail = " | ".join(tail) or "no stderr output"
        raise StageError(f"{what} failed (dvc exit {code}): {detail}; see this task's log")


# --------------------------------------------------------------------------- tasks


@task(name="set-params", cache_policy=NO_CACHE, persist_result=False)
def set_params(repo_dir: str, override_args: list[str]) -> None:
    """Write the overrides into ``params.yaml`` with DVC's ``--set-param`` code."""
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    logger = get_run_logger()
    try:
        apply_overrides(Path(repo_dir) / PARAMS_FILE, override_args)
    except InvalidArgumentError as exc:
        cause = exc.__cause__ or exc
        raise PipelineError(f"DVC rejected the overrides {override_args}: {cause}") from exc
    logger.info("%s: set %s", PARAMS_FILE, ", ".join(override_args))


@task(cache_policy=NO_CACHE, persist_result=False)
def run_stage(repo_dir: str, stage: str) -> float:
    """Reproduce one stage (``dvc repro --single-item``); return its wall time in s."""
    start = time.perf_counter()
    run_dvc(["repro", "--single-item", stage], Path(repo_dir), f"stage '{stage}'")
    seconds = time.perf_counter() - start
    get_run_logger().info("stage '%s' done in %.1f s", stage, seconds)
    return seconds


def stage_task(stage: str) -> Any:
    """The ``run_stage`` task configured for ``stage``: named after it, retried if networked."""
    retries = NETWORK_RETRIES if stage in NETWORK_STAGES else 0
    return run_stage.with_options(
        name=f"stage-{stage}",
        task_run_name=stage,
        retries=retries,
        retry_delay_seconds=NETWORK_RETRY_DELAY_S if retries else 0,
    )


@task(name="save-experiment", cache_policy=NO_CACHE, persist_result=False)
def save_experiment(repo_dir: str, name: str, stages: list[PlannedStage]) -> str:
    """Record the workspace as DVC experiment ``name`` (``dvc exp save``)."""
    root = Path(repo_dir)
    include: list[str] = []
    for stage in stages:
        for path in stage.files:
            if path not in include and (root / path).exists():
                include.append(path)
    args = ["exp", "save", "--name", name]
    for path in include:
        args += ["--include-untracked", path]
    args += [stage.name for stage in stages]
    run_dvc(args, root, f"saving experiment '{name}'")
    return name


def artifact_key(metrics_path: str) -> str:
    """Artifact key of a metrics file: ``metrics/nyt25.json`` -> ``regrab-nyt25-metrics``."""
    stem = re.sub(r"[^a-z0-9]+", "-", Path(metrics_path).stem.lower()).strip("-") or "metrics"
    return f"regrab-{stem}-metrics"


def metric_rows(data: Any, path: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Flatten nested metrics into table rows: one row per mapping of scalars.

    ``{"proto": {"5-1": {"acc": 0.8, "ci95": 0.01}}}`` -> ``[{"name": "proto/5-1",
    "acc": 0.8, "ci95": 0.01}]``.
    """
    if not isinstance(data, dict):
        return [{"name": "/".join(path), "value": data}]
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict | list)}
    rows = [{"name": "/".join(path) or "(top)", **scalars}] if scalars else []
    for key, value in data.items():
        if isinstance(value, dict):
            rows += metric_rows(value, (*path, str(key)))
    return rows


def read_metrics(repo_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The workspace metrics files declared in ``dvc.yaml``, as DVC reads them."""
    from dvc.repo import Repo

    with Repo(str(Path(repo_dir).resolve())) as repo:
        shown = repo.metrics.show()
    workspace = next(iter(shown.values()), {})
    out: dict[str, Any] = {}
    for path, entry in sorted(workspace.get("data", {}).items()):
        if "data" in entry:
            out[path] = entry["data"]
    return out


def _markdown(
    metrics: dict[str, Any], exp_name: str | None, overrides: list[str], durations: dict[str, float]
) -> str:
    lines = [f"# {FLOW_NAME}", ""]
    lines.append(
        f"- DVC experiment: `{exp_name}` (see `dvc exp show`)"
        if exp_name
        else "- plain `dvc repro` (no overrides, no experiment recorded)"
    )
    lines.append("- overrides: " + (", ".join(f"`{o}`" for o in overrides) or "none"))
    lines += ["", "| stage | seconds |", "| --- | ---: |"]
    lines += [f"| {stage} | {sec:.1f} |" for stage, sec in durations.items()]
    for path, data in metrics.items():
        rows = metric_rows(data)
        columns = list(dict.fromkeys(k for row in rows for k in row))
        lines += [
            "",
            f"## {path}",
            "",
            "| " + " | ".join(columns) + " |",
            "|" + " --- |" * len(columns),
        ]
        for row in rows:
            cells = [
                f"{row[c]:.4g}" if isinstance(row.get(c), float) else str(row.get(c, ""))
                for c in columns
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@task(name="publish-metrics", cache_policy=NO_CACHE, persist_result=False)
def publish_metrics(
    repo_dir: str, exp_name: str | None, override_args: list[str], durations: dict[str, float]
) -> dict[str, Any]:
    """Publish each metrics file as a keyed table artifact, plus a markdown summary."""
    logger = get_run_logger()
    metrics = read_metrics(repo_dir)
    if not metrics:
        logger.warning("dvc.yaml declares no metrics file that exists; nothing to publish")
    for path, data in metrics.items():
        key = artifact_key(path)
        create_table_artifact(
            table=metric_rows(data),
            key=key,
            description=f"{path} after {exp_name or 'dvc repro'}",
        )
        logger.info("published %s as table artifact '%s'", path, key)
    create_markdown_artifact(
        markdown=_markdown(metrics, exp_name, override_args, durations),
        key="regrab-retrain-summary",
        description="stages, overrides and metrics of this retrain",
    )
    return metrics


# --------------------------------------------------------------------------- flow


@flow(name=FLOW_NAME, log_prints=True)
def retrain(
    overrides: dict[str, Any] | None = None,
    repo_dir: str = ".",
    targets: list[str] | None = None,
) -> dict[str, Any]:
    """Reproduce the DVC pipeline, one task per stage; record a DVC experiment if overridden.

    Args:
        overrides: ``{"section.key": value}`` applied to ``params.yaml`` as
            ``dvc exp run -S`` would. A string value is parsed like on DVC's command
            line. With overrides the run is saved as a DVC experiment.
        repo_dir: root of the DVC project.
        targets: stages to reproduce (with everything upstream); default all.

    Returns:
        ``{metrics_path: metrics}`` for every metrics file declared in ``dvc.yaml``.
    """
    from prefect.runtime import flow_run

    logger = get_run_logger()
    root = _repo_root(repo_dir)
    # Everything that can be checked is checked before the first write.
    override_args, restore_args = _check_overrides(root, overrides)
    if override_args:
        _require_git_commit(root)
    stages = plan_stages(root, targets)
    if not stages:
        raise PipelineError(f"no stages to run in {root}/dvc.yaml; add stages or fix targets")
    logger.info("stages in order: %s", ", ".join(s.name for s in stages))

    exp_name = None
    if override_args:
        exp_name = experiment_name(flow_run.get_name(), flow_run.get_id())
        set_params(str(root), override_args)
    durations: dict[str, float] = {}
    try:
        for stage in stages:
            durations[stage.name] = stage_task(stage.name)(str(root), stage.name)
        if exp_name:
            save_experiment(str(root), exp_name, stages)
    except BaseException:
        if restore_args:
            # A failed experiment must not leave its params behind for the next scheduled
            # run (`dvc exp run` would); DVC sees the stages that did run as changed.
            try:
                set_params.with_options(name="restore-params")(str(root), restore_args)
            except Exception as exc:  # keep the stage's error as the one raised
                logger.error("could not restore %s: %s", PARAMS_FILE, exc)
        raise
    return publish_metrics(str(root), exp_name, override_args, durations)


def _parse_set(items: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PipelineError(f"-S expects key=value, got '{item}'; e.g. -S train.epochs=1")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the flow once in this process (no server needed) and print the metrics."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.flows", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "-S",
        "--set-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a params.yaml key, as dvc exp run -S (repeatable)",
    )
    parser.add_argument("--repo-dir", default=".", help="DVC project root (default: .)")
    parser.add_argument(
        "--target",
        action="append",
        default=None,
        help="stage to reproduce with its upstream (repeatable; default all)",
    )
    args = parser.parse_args(argv)
    metrics = retrain(
        overrides=_parse_set(args.set_param) or None, repo_dir=args.repo_dir, targets=args.target
    )
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return metrics


if __name__ == "__main__":
    run_cli(main)
