"""Prefect flow ``regrab-scheduled``: the retrain a team runs on a schedule, and trusts.

Where ``regrab-retrain`` (``orchestration/flows.py``) reproduces the pipeline in the folder it
is given, this flow works apart from the user's checkout and decides what its result is worth:

1. ``prepare-workspace``: a git worktree of HEAD on branch ``retrain/<run>`` under
   ``.prefect-run/workspaces/``, sharing the project's DVC cache (``orchestration.workspace``);
2. ``check-new``: the stages marked ``always_changed`` (a check of moving sources) run, after
   the stages they depend on, then ``dvc status``; when no stage is stale and ``dvc.yaml``,
   ``dvc.lock`` and ``params.yaml`` are those of the promoted version's commit, the run ends
   Completed, "nothing new";
3. one task per stage (``dvc repro --single-item``) in the workspace;
4. ``score-champion``: the promoted models (``regrab#prod``, copied out of DVC by
   ``pipeline.registry``) and the new ones scored on the same episodes by
   ``scripts/paired_runs.py`` (a subprocess: no model code in this process), then the gate
   of ``pipeline.gate`` with the ``promote`` section of ``params.yaml``;
5. ``promote`` (gate passed): ``dvc.lock`` and the metrics committed on ``retrain/<run>``, the
   user's branch fast-forwarded to it when their checkout is clean and unmoved, the commit
   registered and assigned to ``prod`` (GTO tags), ``dvc push`` when a remote is configured;
6. ``publish``: the metrics this run made (``orchestration.outcome``), the paired table, a
   summary, and the webhook.

The workspace is removed at the end, and kept (with its path in the error) when a stage fails.
A run that is not promoted ends Completed with the name ``Not promoted`` and the reason; one
whose champion cannot be paired with it (the champion trained on a relation that is now a
test relation) ends Completed named ``Not comparable``, its results kept on its branch.

Run it once, locally (Prefect starts a temporary server)::

    python -m orchestration.scheduled --repo-dir . [--webhook http://127.0.0.1:9000/hook]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from orchestration import flow_command

flow_command.allow_server_startup()  # read by Prefect when it loads its settings

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact, create_table_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.states import Completed  # noqa: E402

from orchestration import champion_gate, dvc_access, outcome, workspace  # noqa: E402
from orchestration.dvc_access import plan_stages, repo_root  # noqa: E402
from orchestration.flows import (  # noqa: E402
    CLUSTER_STAGES,
    DASK_ADDRESS_ENV,
    NETWORK_RETRIES,
    NETWORK_RETRY_DELAY_S,
    NETWORK_STAGES,
    artifact_key,
    metric_rows,
)
from orchestration.workspace import Workspace  # noqa: E402
from pipeline import registry  # noqa: E402
from pipeline.config import load_params, load_section  # noqa: E402
from pipeline.errors import PipelineError, run_cli  # noqa: E402
from pipeline.gate import NOT_COMPARABLE, WEBHOOK_ENV, Decision, PromoteConfig  # noqa: E402

FLOW_NAME = "regrab-scheduled"
#: Files whose change since the promoted version makes a run worth doing, stale or not.
RECORDS = ("dvc.yaml", "dvc.lock", "params.yaml")


@task(name="prepare-workspace", cache_policy=NO_CACHE, persist_result=False)
def prepare_workspace(root: str, run_name: str) -> Workspace:
    """A git worktree of HEAD sharing the DVC cache (``orchestration.workspace.create``)."""
    logger = get_run_logger()
    ws = workspace.create(Path(root), run_name)
    logger.info("workspace %s on branch %s at %s", ws.path, ws.branch, ws.start[:12])
    done = workspace.dvc(ws.path, "checkout", check=False)  # the cache's files, hard-linked
    if done.returncode != 0:
        logger.info("dvc checkout: some outputs are not in the DVC cache; their stages run")
    return ws


@task(cache_policy=NO_CACHE, persist_result=False)
def run_stage(ws_path: str, stage: str, cluster: str | None = None) -> tuple[float, bool]:
    """``dvc repro --single-item <stage>`` in the workspace: (seconds, whether it ran)."""
    logger = get_run_logger()
    ran: list[str] = []

    def log(line: str) -> None:
        logger.info(line)
        if outcome.ran_stage(line):
            ran.append(line)

    extra = {DASK_ADDRESS_ENV: cluster} if cluster and stage.split("@")[0] in CLUSTER_STAGES \
        else {}
    start = time.perf_counter()
    dvc_access.repro_stage(Path(ws_path), stage, log, extra)
    return time.perf_counter() - start, bool(ran)


def stage_task(stage: str, network: bool = False) -> Any:
    """``run_stage`` named after ``stage``; retried when it touches the network (``fetch``, a
    check of moving sources)."""
    retries = NETWORK_RETRIES if network or stage in NETWORK_STAGES else 0
    return run_stage.with_options(name=f"stage-{stage}", task_run_name=stage, retries=retries,
                                  retry_delay_seconds=NETWORK_RETRY_DELAY_S if retries else 0)


@task(name="check-new", cache_policy=NO_CACHE, persist_result=False)
def check_new(ws: Workspace, champion: registry.Version | None,
              sources: list[str]) -> str | None:
    """Why this run has work to do, or None when there is nothing new (``sources``: the
    ``always_changed`` stages, which have run already)."""
    stale = workspace.stale_stages(ws, sources)
    if stale:
        return "stale stages: " + ", ".join(sorted(stale))
    if champion is None:
        return "no promoted version yet"
    changed = workspace.changed_since(ws, champion.commit, RECORDS)
    if changed:
        return f"{', '.join(changed)} changed since {champion.tag}"
    return None


@task(name="score-champion", cache_policy=NO_CACHE, persist_result=False)
def score_champion(ws: Workspace, champion: registry.Version | None,
                   cfg: PromoteConfig) -> Decision:
    """The paired table of champion (A) against challenger (B), and the gate on it."""
    return champion_gate.score(ws, champion, cfg, get_run_logger().info)


@task(name="promote", cache_policy=NO_CACHE, persist_result=False)
def promote(ws: Workspace, run: str, decision: Decision, commit: str | None,
            champion: registry.Version | None = None) -> list[str]:
    """Fast-forward the user's branch when it may be, register and promote, push."""
    logger = get_run_logger()
    lines = []
    sha = commit or ws.start
    if commit:
        blocked = workspace.fast_forward(ws)
        lines.append(f"results committed as {sha[:12]} on {ws.branch}; " + (
            "your branch was fast-forwarded to it (dvc checkout brings its models)"
            if blocked is None else f"{blocked}, so they stay on {ws.branch} (git merge it)"))
    else:
        lines.append(f"no file changed: {sha[:12]} itself is the version")
    if champion is not None and sha == champion.commit:
        # Nothing new to register: the champion's own commit, reproduced.
        lines.append(f"{champion.tag} is that commit already; no new version registered")
        for line in lines:
            logger.info(line)
        return lines
    head = next((r for r in decision.rows
                 if r["setting"] == "headline" and r["challenger"] is not None), None)
    note = (f"{run}: headline {head['challenger']:.2f} vs {head['champion']:.2f}" if head
            else f"{run}: gate {decision.gate}")
    version = registry.register(ws.root, commit=sha, message=note)
    registry.promote(ws.root, version.version)
    lines.append(f"registered {version.tag} and assigned it to {registry.PROD} "
                 "(git push --tags publishes both tags)")
    lines.append(workspace.push(ws))
    for line in lines:
        logger.info(line)
    return lines


@task(name="publish", cache_policy=NO_CACHE, persist_result=False)
def publish(ws: Workspace, run: str, ran: set[str], verdict: str, lines: list[str],
            durations: dict[str, float], decision: Decision | None) -> dict[str, Any]:
    """Artifacts of what this run made; returns ``{metrics file: data}`` published."""
    logger = get_run_logger()
    producers = dvc_access.metric_producers(ws.path)
    chosen = outcome.select_metrics(producers, ran,
                                    lambda p: workspace.differs_from_start(ws, p))
    published = {}
    for path, why in chosen.items():
        data = json.loads((ws.path / path).read_text())
        create_table_artifact(table=metric_rows(data), key=artifact_key(path),
                              description=f"{path} made by run {run} ({why})")
        published[path] = data
        logger.info("published %s (%s)", path, why)
    left = sorted(set(producers) - set(chosen))
    if left:
        lines = [*lines, "not published (not made by this run): " + ", ".join(left)]
    rows = list(decision.rows) if decision else []
    if rows:
        create_table_artifact(table=rows, key="regrab-gate",
                              description=f"champion vs challenger, run {run}: {verdict}")
    create_markdown_artifact(markdown=outcome.summary_markdown(run, ws.start, verdict, lines,
                                                               durations, rows),
                             key="regrab-scheduled-summary", description=f"run {run}: {verdict}")
    return published


def check_promote(root: Path) -> PromoteConfig:
    """The ``promote`` section, its benchmarks checked against the pipeline's (when it has a
    ``benchmarks`` section); before anything runs.

    Raises:
        PipelineError: the section is missing or bad, or names a benchmark not trained.
    """
    cfg = load_section(PromoteConfig, "promote", root / "params.yaml")
    if "benchmarks" in load_params(root / "params.yaml"):  # the REGRAB pipeline's models
        champion_gate.check_benchmarks(root / "params.yaml", cfg)
    return cfg


@flow(name=FLOW_NAME, log_prints=True)
def scheduled_retrain(repo_dir: str = ".", cluster: str | None = None,
                      webhook: str | None = None) -> Any:
    """Retrain in a workspace apart from ``repo_dir``, gate, promote or keep the champion.

    Args:
        repo_dir: the user's DVC project (a git checkout).
        cluster: Dask scheduler address for the training and scoring stages.
        webhook: URL for the decision's JSON POST (default: env ``REGRAB_RETRAIN_WEBHOOK``,
            then ``promote.webhook``).

    Returns:
        A Completed state: ``nothing new``, ``promoted ...`` or (named ``Not promoted``)
        ``not promoted: <reasons>``.
    """
    from prefect.runtime import flow_run

    logger = get_run_logger()
    root = repo_root(repo_dir)
    cfg = check_promote(root)
    url = webhook or os.environ.get(WEBHOOK_ENV) or cfg.webhook
    run = workspace.safe_name(f"{flow_run.get_name() or 'run'}-{str(flow_run.get_id())[:6]}")
    try:
        champion = registry.resolve(root, registry.parse_ref(f"{registry.NAME}#{registry.PROD}"))
    except PipelineError:
        champion = None
    ws = prepare_workspace(str(root), run)
    started = time.monotonic()
    durations: dict[str, float] = {}
    ran: set[str] = set()
    planned_stages = []
    stage = "sources"
    try:
        sources = workspace.always_changed(ws)
        # The checks of moving sources, before dvc status can say anything, and the stages
        # they read before them (check_params: a fresh clone's workspace has no output yet).
        first = [p.name for p in plan_stages(ws.path, sources)] if sources else []
        for stage in first:
            durations[stage], did = stage_task(stage, network=stage in sources)(
                str(ws.path), stage, cluster)
            if did:
                ran.add(stage)
        stage = "check-new"
        why = check_new(ws, champion, first)
        if why is None:
            workspace.remove(ws, keep_branch=False)
            message = (f"nothing new: every stage is up to date and {champion.tag} is HEAD's "
                       f"pipeline ({time.monotonic() - started:.0f} s)")
            logger.info(message)
            return Completed(message=message)
        logger.info("work to do: %s", why)
        stage = "plan"
        planned_stages = plan_stages(ws.path)
        resumable = workspace.resume_stages(ws)
        for planned in planned_stages:
            stage = planned.name
            if stage in first:
                continue
            if stage in resumable and not workspace.stale_stages(ws, [], target=stage):
                # Only its resume state is missing (a new workspace never has it): dvc repro
                # would train it again from scratch for the same outputs (TransE: minutes).
                logger.info("%s: up to date but for its resume state; not run", stage)
                continue
            durations[stage], did = stage_task(stage)(str(ws.path), stage, cluster)
            if did:
                ran.add(stage)
        stage = "score-champion"
        decision = score_champion(ws, champion, cfg)
    except Exception as exc:
        kept = str(ws.path)
        create_markdown_artifact(
            markdown=outcome.failure_markdown(run, ws.start, stage, str(exc), kept),
            key="regrab-scheduled-summary", description=f"run {run} failed at {stage}")
        outcome.notify(url, {"run": run, "decision": "failed", "stage": stage,
                             "error": str(exc), "workspace": kept}, logger.info)
        raise PipelineError(f"run {run} failed at {stage} ({exc}); its workspace is kept "
                            f"for inspection at {kept} (git worktree remove --force it)") from exc
    outputs = list(dict.fromkeys(f for p in planned_stages for f in p.files))
    commit = workspace.commit(ws, f"Retrain {run}: {decision.summary()}", outputs)
    lines = [why]
    if decision.promote:
        lines += promote(ws, run, decision, commit, champion)
    elif commit:
        lines.append(f"the champion {champion.tag} stays; this run's results are on "
                     f"{ws.branch} ({commit[:12]})")
    verdict = decision.summary()
    publish(ws, run, ran, verdict, lines, durations, decision)
    keep = bool(commit) and git_branch_unmerged(ws)
    workspace.remove(ws, keep_branch=keep)
    outcome.notify(url, {"run": run, "decision": "promoted" if decision.promote else
                         decision.gate if decision.gate == NOT_COMPARABLE else "not promoted",
                         "summary": verdict, "lines": lines,
                         "table": list(decision.rows)}, logger.info)
    if decision.promote:
        return Completed(message=verdict)
    return Completed(message=verdict, name="Not comparable" if decision.gate == NOT_COMPARABLE
                     else "Not promoted")


def git_branch_unmerged(ws: Workspace) -> bool:
    """Whether the run's branch holds a commit the user's branch does not (keep it then)."""
    out = workspace.git(ws.root, "rev-list", "--count", f"HEAD..{ws.branch}", check=False)
    return out.strip() not in ("", "0")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m orchestration.scheduled",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo-dir", default=".", help="DVC project root (default: .)")
    parser.add_argument("--cluster", default=None, metavar="ADDRESS",
                        help="Dask scheduler for the training and scoring stages")
    parser.add_argument("--webhook", default=None, metavar="URL",
                        help=f"POST the decision here (default: env {WEBHOOK_ENV}, then "
                             "promote.webhook)")
    args = parser.parse_args(argv)
    check_promote(repo_root(args.repo_dir))  # one error line, before Prefect starts a server
    state = scheduled_retrain(repo_dir=args.repo_dir, cluster=args.cluster,
                              webhook=args.webhook, return_state=True)
    print(f"{state.name}: {state.message}")
    if state.is_failed():
        raise PipelineError(state.message or "the flow run failed")


if __name__ == "__main__":
    run_cli(main)
