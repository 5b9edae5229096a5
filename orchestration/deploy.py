"""Deployments on the work pool ``regrab``: the weekly retrain, and experiments on demand.

Prefect runs deployments in production through a work pool and a worker: the deployment says
what to run and when, the worker (``prefect worker start --pool regrab``, a process of its own)
polls the pool and runs each flow run in a subprocess. ``scripts/prefect_stack.sh`` creates
the pool, calls this module and starts the worker (``make prefect-worker``); by hand::

    prefect work-pool create regrab --type process
    PREFECT_API_URL=http://127.0.0.1:4200/api python -m orchestration.deploy \\
        [--cron "0 3 * * 1"] [--timezone UTC] [--repo-dir .] [--cluster tcp://HOST:8786]
    prefect worker start --pool regrab

Two deployments are registered, each loaded from this project's folder
(``flow.from_source(<project>, entrypoint)``: offline, no image, no git remote):

- ``regrab-scheduled/weekly``: ``orchestration.scheduled`` on the cron schedule;
- ``regrab-retrain/experiment``: ``orchestration.flows``, no schedule, triggered with
  ``--param overrides=...`` to record a DVC experiment in ``repo_dir``.

Each has a concurrency limit of 1 with the collision strategy ``CANCEL_NEW``: a run triggered
while another of the same deployment runs is Cancelled at once instead of running beside it
(two runs in one workspace would fight over DVC's lock, and queued weekly runs would only
repeat each other). Unlike ``flow.serve``, which ignores a deployment's concurrency limit,
the server enforces this one whichever worker picks the run.

``--cluster`` sets the deployments' ``cluster`` parameter: the Dask scheduler the parse,
training and scoring stages run on (only its form is checked here; it may be down now and up
at 03:00; a triggered run can override it with ``--param cluster=...``).
"""

from __future__ import annotations

import argparse
import os
import urllib.error
import urllib.request
from pathlib import Path

from orchestration.dvc_access import repo_root
from orchestration.flow_command import DASK_ADDRESS_ENV
from pipeline.cluster import check_cluster
from pipeline.errors import PipelineError, run_cli

#: The work pool the deployments run on (a process pool: runs are subprocesses of the worker).
POOL = "regrab"
WEEKLY = "weekly"
EXPERIMENT = "experiment"
#: Weekly, Monday 03:00: the fetch stage sees the week's new data; nobody waits on it.
DEFAULT_CRON = "0 3 * * 1"
CRON_ENV = "REGRAB_RETRAIN_CRON"
TIMEZONE_ENV = "REGRAB_RETRAIN_TZ"
REPO_ENV = "REGRAB_REPO_DIR"
#: The folder the flows' code is loaded from: this project.
PROJECT = Path(__file__).resolve().parents[1]
ENTRYPOINTS = {
    WEEKLY: "orchestration/scheduled.py:scheduled_retrain",
    EXPERIMENT: "orchestration/flows.py:retrain",
}


def check_server(api_url: str | None, timeout_s: float = 5.0) -> str:
    """Return the API URL if a Prefect server answers at ``<api_url>/health``.

    Raises:
        PipelineError: when ``PREFECT_API_URL`` is unset or nothing answers there.
    """
    if not api_url:
        raise PipelineError(
            "PREFECT_API_URL is not set, so the deployment would live in a throw-away server; "
            "start one (scripts/prefect_stack.sh server-start) and export "
            "PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    url = api_url.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            if resp.status == 200:
                return api_url
    except (urllib.error.URLError, OSError) as exc:
        raise PipelineError(
            f"no Prefect server answers at {url} ({exc}); start it with "
            "scripts/prefect_stack.sh server-start (make prefect-server)"
        ) from exc
    raise PipelineError(f"Prefect server at {url} is unhealthy; check its log")


def check_pool(name: str) -> None:
    """Raise unless the work pool ``name`` exists on the server."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            raise PipelineError(f"work pool '{name}' does not exist; create it with prefect "
                                f"work-pool create {name} --type process (make "
                                "prefect-worker does)") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestration.deploy",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cron", default=os.environ.get(CRON_ENV, DEFAULT_CRON),
                        help=f"cron schedule (env {CRON_ENV}; default '{DEFAULT_CRON}')")
    parser.add_argument("--timezone", default=os.environ.get(TIMEZONE_ENV, "UTC"),
                        help=f"time zone of the cron schedule (env {TIMEZONE_ENV}; default UTC)")
    parser.add_argument("--repo-dir", default=os.environ.get(REPO_ENV, "."),
                        help=f"DVC project the runs work for (env {REPO_ENV}; default .)")
    parser.add_argument("--paused", action="store_true",
                        help="register the schedule paused (runs only when triggered)")
    parser.add_argument("--pool", default=POOL, help=f"work pool (default {POOL})")
    parser.add_argument("--cluster", default=os.environ.get(DASK_ADDRESS_ENV) or None,
                        metavar="ADDRESS",
                        help="Dask scheduler tcp://HOST:PORT for the parse, training and scoring "
                             f"stages (env {DASK_ADDRESS_ENV}; default: this machine)")
    return parser


def main(argv: list[str] | None = None) -> dict[str, str]:
    """Check the options, the server and the pool; register both deployments.

    Returns:
        ``{deployment name: its id}``.
    """
    args = build_parser().parse_args(argv)
    repo_dir = str(repo_root(args.repo_dir))
    cluster = check_cluster(args.cluster, connect=False)

    from prefect import Flow
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.schedules import Cron
    from prefect.settings import PREFECT_API_URL

    check_server(PREFECT_API_URL.value())
    check_pool(args.pool)
    try:
        schedule = Cron(args.cron, timezone=args.timezone)
    except ValueError as exc:
        raise PipelineError(
            f"invalid schedule '{args.cron}' / time zone '{args.timezone}' ({exc}); "
            "give five cron fields like '0 3 * * 1' and an IANA zone like Europe/Paris"
        ) from exc
    one_at_a_time = ConcurrencyLimitConfig(
        limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)
    common = {"work_pool_name": args.pool, "concurrency_limit": one_at_a_time,
              "build": False, "push": False, "print_next_steps": False,
              "ignore_warnings": True,
              "tags": ["regrab", "retrain"]}
    ids = {}
    weekly = Flow.from_source(str(PROJECT), ENTRYPOINTS[WEEKLY])
    ids[f"{weekly.name}/{WEEKLY}"] = str(weekly.deploy(
        name=WEEKLY, schedule=schedule, paused=args.paused,
        parameters={"repo_dir": repo_dir, "cluster": cluster},
        description=(f"Weekly retrain of {Path(repo_dir).name} in a workspace of its own, "
                     "gated against the promoted models"), **common))
    experiment = Flow.from_source(str(PROJECT), ENTRYPOINTS[EXPERIMENT])
    ids[f"{experiment.name}/{EXPERIMENT}"] = str(experiment.deploy(
        name=EXPERIMENT, parameters={"overrides": None, "repo_dir": repo_dir,
                                     "cluster": cluster},
        description=(f"DVC experiment in {Path(repo_dir).name} on demand: "
                     "--param overrides='{\"train.steps\": 10}'"), **common))
    for name in ids:
        print(f"deployed {name} on work pool '{args.pool}' for {repo_dir}"
              + (f" ('{args.cron}', {args.timezone})" if name.endswith(WEEKLY) else ""),
              flush=True)
    return ids


if __name__ == "__main__":
    run_cli(main)
