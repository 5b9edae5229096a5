"""Deployment ``regrab-retrain/scheduled``: serve the retrain flow on a cron schedule.

Start a Prefect server first (``scripts/prefect_stack.sh server-start``), then::

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m orchestration.deploy \\
        [--cron "0 3 * * 1"] [--timezone UTC] [--repo-dir .] [--cluster tcp://HOST:8786]

The process registers the deployment, then stays in the foreground and runs each
scheduled or triggered flow run in a subprocess (``flow.serve``). One run at a time:
two DVC runs in one workspace would fight over its lock. On Ctrl-C / SIGTERM it stops
and pauses the schedule, so nothing piles up while no one serves it.

``--cluster`` sets the deployment's ``cluster`` parameter: the Dask scheduler the
parse, training and scoring stages run on (checked for its form here, for an answer at run time;
a triggered run can override it with ``--param cluster=...``).
"""

from __future__ import annotations

import argparse
import os
import urllib.error
import urllib.request
from pathlib import Path

from orchestration.dvc_access import repo_root
from orchestration.flows import DASK_ADDRESS_ENV, check_cluster, retrain
from pipeline.errors import PipelineError, run_cli

DEPLOYMENT_NAME = "scheduled"
#: Weekly, Monday 03:00: the fetch stage sees the week's new data; nobody waits on it.
DEFAULT_CRON = "0 3 * * 1"
CRON_ENV = "REGRAB_RETRAIN_CRON"
TIMEZONE_ENV = "REGRAB_RETRAIN_TZ"
REPO_ENV = "REGRAB_REPO_DIR"


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


def main(argv: list[str] | None = None) -> None:
    """Parse options, check the server and the repo, then serve until interrupted."""
    from prefect.schedules import Cron
    from prefect.settings import PREFECT_API_URL
    from prefect.types.entrypoint import EntrypointType

    parser = argparse.ArgumentParser(prog="python -m orchestration.deploy", description=__doc__)
    parser.add_argument(
        "--cron",
        default=os.environ.get(CRON_ENV, DEFAULT_CRON),
        help=f"cron schedule (env {CRON_ENV}; default '{DEFAULT_CRON}')",
    )
    parser.add_argument(
        "--timezone",
        default=os.environ.get(TIMEZONE_ENV, "UTC"),
        help=f"time zone of the cron schedule (env {TIMEZONE_ENV}; default UTC)",
    )
    parser.add_argument(
        "--repo-dir",
        default=os.environ.get(REPO_ENV, "."),
        help=f"DVC project the runs work in (env {REPO_ENV}; default .)",
    )
    parser.add_argument(
        "--paused",
        action="store_true",
        help="register the schedule paused (runs only when triggered)",
    )
    parser.add_argument(
        "--cluster",
        default=os.environ.get(DASK_ADDRESS_ENV) or None,
        metavar="ADDRESS",
        help=f"Dask scheduler tcp://HOST:PORT for the parse, training and scoring stages "
        f"(env {DASK_ADDRESS_ENV}; default: this machine)",
    )
    args = parser.parse_args(argv)

    repo_dir = str(repo_root(args.repo_dir))
    # The cluster may be down now and up at 03:00: only its form is checked here.
    cluster = check_cluster(args.cluster, connect=False)
    check_server(PREFECT_API_URL.value())
    try:
        schedule = Cron(args.cron, timezone=args.timezone)
    except ValueError as exc:
        raise PipelineError(
            f"invalid schedule '{args.cron}' / time zone '{args.timezone}' ({exc}); "
            "give five cron fields like '0 3 * * 1' and an IANA zone like Europe/Paris"
        ) from exc
    print(
        f"serving {retrain.name}/{DEPLOYMENT_NAME} on '{args.cron}' ({args.timezone}) "
        f"for {repo_dir}",
        flush=True,
    )
    retrain.serve(
        name=DEPLOYMENT_NAME,
        schedule=schedule,
        paused=args.paused,
        parameters={"overrides": None, "repo_dir": repo_dir, "cluster": cluster},
        description=(
            f"Weekly DVC retrain of {Path(repo_dir).name}; "
            "params: overrides, repo_dir, targets, cluster"
        ),
        tags=["regrab", "retrain"],
        limit=1,
        # Load the flow by module, not by file path: the runner's subprocess then finds it
        # through the installed package whatever directory serve was started from.
        entrypoint_type=EntrypointType.MODULE_PATH,
    )


if __name__ == "__main__":
    run_cli(main)
