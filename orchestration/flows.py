"""Prefect flow ``regrab-retrain``: the repo's DVC pipeline, one Prefect task per stage.

DVC owns caching and the experiment record; Prefect owns scheduling, retries and
observability. The flow never writes an artifact itself: outputs and ``dvc.lock`` are
written by ``dvc repro``, the experiment by ``dvc exp save`` (see ``orchestration.dvc_access``),
and ``params.yaml`` by ``orchestration.overrides`` with the grammar of ``dvc exp run -S``.

Why not one ``dvc exp run`` call: that would be a single opaque task. DVC documents
``dvc exp run`` as ``dvc repro`` followed by ``dvc exp save``, so the flow splits it
along that seam:

1. check everything before the first write: the project, the overrides against every
   section's schema and the stages' start checks (``orchestration.checks``), a git commit
   when there are overrides, the targets, the cluster (a Dask handshake, bounded);
2. ``set-params``: write the overrides into ``params.yaml``;
3. one task per stage, in ``dvc repro``'s order, each ``dvc repro --single-item <stage>``;
4. ``save-experiment``: ``dvc exp save --name <name>``, so the run shows in ``dvc exp show``;
5. ``publish-metrics``: the metrics files declared in ``dvc.yaml`` become keyed table
   artifacts plus one markdown summary, and are returned.

Without overrides steps 2 and 4 are skipped: that is a plain ``dvc repro``. After the
run, failed or not, ``params.yaml`` gets its text back byte for byte (``restore-params``), so
the next scheduled run does not inherit the overrides; the experiment keeps them.

``cluster`` (``--cluster``) names a running Dask scheduler; the flow exports it as
``REGRAB_DASK_ADDRESS`` to the stages that can spread their work over one
(``parse_wikidata``, ``train``, ``evaluate``, ``transfer``, ``active_labelling``). Without it
those stages use their local default.

Run it once, locally and without a server (Prefect starts a temporary one)::

    python -m orchestration.flows -S train.epochs=1 --repo-dir . [--cluster tcp://host:8786]
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestration import flow_command
from pipeline.errors import PipelineError, run_cli

if __name__ == "__main__":
    # Before Prefect is imported (seconds, many on a busy machine): a bad override is one
    # line at once. main() checks everything again, with the full plan.
    run_cli(flow_command.check_overrides)
flow_command.allow_server_startup()  # read by Prefect when it loads its settings

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact, create_table_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from orchestration import dvc_access, interrupt  # noqa: E402
from orchestration.checks import check_scheduler  # noqa: E402
from orchestration.dvc_access import PlannedStage, StageError, plan_stages, repo_root  # noqa: E402
from orchestration.flow_command import DASK_ADDRESS_ENV, PARAMS_FILE  # noqa: E402
from orchestration.overrides import apply as apply_params  # noqa: E402
from orchestration.overrides import describe, resolve, restore  # noqa: E402
from pipeline.cluster import check_cluster  # noqa: E402

__all__ = ["StageError", "check_cluster", "plan_stages", "retrain", "validate_overrides"]

#: Prefect flow name; its deployment is ``regrab-retrain/experiment`` (orchestration.deploy).
FLOW_NAME = "regrab-retrain"
#: Stages that touch the network (HEAD requests, downloads): the only ones retried (a network
#: blip is worth a retry, a bug in a training stage is not).
NETWORK_STAGES = frozenset({"check_sources", "fetch"})
NETWORK_RETRIES = 2
#: Seconds between retries of a network stage: 60, or the environment's value (read when the
#: flow is loaded; a worker passes its environment to the runs it starts).
NETWORK_RETRY_DELAY_ENV = "REGRAB_NETWORK_RETRY_DELAY_S"


def network_retry_delay(value: str | None, default: float = 60.0) -> float:
    """Seconds between retries of a network stage, from ``$REGRAB_NETWORK_RETRY_DELAY_S``.

    Raises:
        PipelineError: a value that is not a number of seconds, 0 or more.
    """
    if value is None or not value.strip():
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise PipelineError(f"{NETWORK_RETRY_DELAY_ENV}={value!r} is not a number of seconds; "
                            "set it to 0 or more (default 60), or unset it")
    return seconds


NETWORK_RETRY_DELAY_S = network_retry_delay(os.environ.get(NETWORK_RETRY_DELAY_ENV))
#: Stages that run on the cluster when one is given; the others never see the address.
CLUSTER_STAGES = frozenset({"parse_wikidata", "train", "evaluate", "transfer",
                            "active_labelling"})


@dataclass(frozen=True)
class Plan:
    """Everything a run needs, checked before anything is written.

    Attributes:
        root: the project root.
        stages: what ``dvc repro [targets]`` would run, upstream first.
        new_params: ``{key: value}`` to write into ``params.yaml`` (empty: plain repro).
        old_params: the values they replace, restored after the run.
        cluster: Dask scheduler address for ``CLUSTER_STAGES``, or None.
    """

    root: Path
    stages: list[PlannedStage]
    new_params: dict[str, Any]
    old_params: dict[str, Any]
    cluster: str | None


def validate_overrides(repo_dir: str, override_map: dict[str, Any] | None) -> list[str]:
    """Check every override key exists in ``params.yaml``; return ``key=value`` strings.

    Raises:
        PipelineError: naming the first unknown key and the valid sections.
    """
    new, _ = resolve(repo_root(repo_dir) / PARAMS_FILE, override_map)
    return describe(new)


def make_plan(
    repo_dir: str,
    override_map: dict[str, Any] | None = None,
    targets: list[str] | None = None,
    cluster: str | None = None,
) -> Plan:
    """Check the run's inputs in the order a user would fix them; write nothing.

    Raises:
        PipelineError: the first problem found, as one line naming it and the fix.
    """
    root = repo_root(repo_dir)
    new, old = resolve(root / PARAMS_FILE, override_map)
    if new:
        dvc_access.require_git_commit(root)
    stages = plan_stages(root, targets)
    if not stages:
        raise PipelineError(f"no stages to run in {root}/dvc.yaml; add stages or fix targets")
    return Plan(root, stages, new, old, check_scheduler(cluster))


def experiment_name(run_name: str | None, run_id: str | None) -> str:
    """A git-ref-safe, unique experiment name tied to the Prefect flow run."""
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", run_name or "run").strip("-") or "run"
    suffix = (run_id or "").replace("-", "")[:6]
    return f"{base}-{suffix}" if suffix else base


# --------------------------------------------------------------------------- tasks


@task(name="set-params", cache_policy=NO_CACHE, persist_result=False)
def set_params(repo_dir: str, values: dict[str, Any]) -> tuple[str, str]:
    """Write ``{key: value}`` into ``params.yaml`` (comments and layout kept).

    Returns:
        The file's text before and after, for ``restore-params``.
    """
    texts = apply_params(Path(repo_dir) / PARAMS_FILE, values)
    get_run_logger().info("%s: set %s", PARAMS_FILE, ", ".join(describe(values)))
    return texts


@task(name="restore-params", cache_policy=NO_CACHE, persist_result=False)
def restore_params(repo_dir: str, texts: tuple[str, str], old: dict[str, Any]) -> None:
    """Put ``params.yaml`` back as it was before ``set-params``."""
    restore(Path(repo_dir) / PARAMS_FILE, texts, old)
    get_run_logger().info("%s: restored (%s)", PARAMS_FILE, ", ".join(describe(old)))


@task(cache_policy=NO_CACHE, persist_result=False)
def run_stage(repo_dir: str, stage: str, cluster: str | None = None) -> float:
    """Reproduce one stage (``dvc repro --single-item``); return its wall time in s."""
    logger = get_run_logger()
    extra_env = {}
    if cluster and stage.split("@")[0] in CLUSTER_STAGES:  # train@nyt25 is a train stage
        extra_env[DASK_ADDRESS_ENV] = cluster
        logger.info("stage '%s' runs on the Dask cluster at %s", stage, cluster)
    start = time.perf_counter()
    dvc_access.repro_stage(Path(repo_dir), stage, logger.info, extra_env)
    seconds = time.perf_counter() - start
    logger.info("stage '%s' done in %.1f s", stage, seconds)
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
    dvc_access.save_experiment(Path(repo_dir), name, stages, get_run_logger().info)
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


def _markdown(
    metrics: dict[str, Any], exp_name: str | None, changes: list[str], durations: dict[str, float]
) -> str:
    lines = [f"# {FLOW_NAME}", ""]
    lines.append(
        f"- DVC experiment: `{exp_name}` (see `dvc exp show`)"
        if exp_name
        else "- plain `dvc repro` (no overrides, no experiment recorded)"
    )
    lines.append("- overrides: " + (", ".join(f"`{o}`" for o in changes) or "none"))
    lines += ["", "| stage | seconds |", "| --- | ---: |"]
    lines += [f"| {stage} | {sec:.1f} |" for stage, sec in durations.items()]
    for path, data in metrics.items():
        rows = metric_rows(data)
        columns = list(dict.fromkeys(k for row in rows for k in row))
        lines += ["", f"## {path}", "", "| " + " | ".join(columns) + " |"]
        lines.append("|" + " --- |" * len(columns))
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
    metrics = dvc_access.read_metrics(Path(repo_dir))
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
    cluster: str | None = None,
) -> dict[str, Any]:
    """Reproduce the DVC pipeline, one task per stage; record a DVC experiment if overridden.

    Args:
        overrides: ``{"section.key": value}`` applied to ``params.yaml`` as
            ``dvc exp run -S`` would. A string value is parsed like on DVC's command
            line. With overrides the run is saved as a DVC experiment.
        repo_dir: root of the DVC project.
        targets: stages to reproduce (with everything upstream); default all.
        cluster: Dask scheduler address (``tcp://host:8786``) for ``CLUSTER_STAGES``;
            default: each stage's own processes on this machine.

    Returns:
        ``{metrics_path: metrics}`` for every metrics file declared in ``dvc.yaml``.
    """
    from prefect.runtime import flow_run

    logger = get_run_logger()
    interrupt.set_run(flow_run.get_id())
    plan = make_plan(repo_dir, overrides, targets, cluster)
    root = str(plan.root)
    logger.info("stages in order: %s", ", ".join(s.name for s in plan.stages))

    exp_name, texts = None, None
    if plan.new_params:
        exp_name = experiment_name(flow_run.get_name(), flow_run.get_id())
        texts = set_params(root, plan.new_params)
    durations: dict[str, float] = {}
    # On Ctrl-C (python -m orchestration.flows) this `finally` never runs: undo it there too.
    undo = (lambda: restore(plan.root / PARAMS_FILE, texts, plan.old_params)) if texts else None
    try:
        with interrupt.cleanup(undo) if undo else contextlib.nullcontext():
            for stage in plan.stages:
                durations[stage.name] = stage_task(stage.name)(root, stage.name, plan.cluster)
            if exp_name:
                save_experiment(root, exp_name, plan.stages)
    finally:
        if texts is not None:
            # An experiment, failed or saved, must not leave its params behind for the next
            # scheduled run (`dvc exp run` would); DVC sees the stages that ran as changed.
            try:
                restore_params(root, texts, plan.old_params)
            except Exception as exc:  # keep the stage's error as the one raised
                logger.error("could not restore %s: %s", PARAMS_FILE, exc)
    return publish_metrics(root, exp_name, describe(plan.new_params), durations)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Check the arguments, then run the flow once in this process and print the metrics.

    Every check the flow makes runs here first, so a mistake is one ``error:`` line
    before Prefect starts its temporary server (about 20 s), not a failed flow run.
    """
    args = flow_command.build_parser().parse_args(argv)
    override_map = flow_command.parse_set(args.set_param) or None
    make_plan(args.repo_dir, override_map, args.target, args.cluster)
    try:
        with interrupt.handling():  # Ctrl-C: seconds, one line, exit 130 (not Prefect's minutes)
            metrics = retrain(overrides=override_map, repo_dir=args.repo_dir,
                              targets=args.target, cluster=args.cluster)
    except RuntimeError as exc:  # Prefect's temporary server did not start in time
        failure = flow_command.server_failure(exc)
        if failure is None:
            raise
        raise failure from None
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return metrics


if __name__ == "__main__":
    run_cli(main)
