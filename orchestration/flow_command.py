"""The command line of ``python -m orchestration.flows``, with nothing of Prefect in it.

Prefect takes seconds to import (many on a busy machine), and the schemas of the model's
sections pull in torch: :func:`check_overrides` refuses a bad ``-S`` override before either is
imported (the override's own section and the checks that read it are checked first, see
:func:`pipeline.params_check.check_params`, run by :func:`orchestration.checks.check_params`
in a child Python), so a typo is one ``error:`` line at once.

Prefect's temporary server (a run without ``PREFECT_API_URL``) gets
:func:`server_startup_s` seconds to answer, from the machine's load: Prefect's default of 20
s is too short on 2 busy cores. :func:`server_failure` turns its time-out into one line. The
temporary server sends Prefect no usage telemetry (:data:`ANALYTICS_ENV`): its heartbeat's
write raced the flow's own writes to the server's SQLite file on a busy machine ("database is
locked", a traceback in the run's output), and a pipeline run has no use for it.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable

from orchestration.dvc_access import repo_root
from orchestration.overrides import resolve
from pipeline.errors import PipelineError
from pipeline.wikidata.formats import usable_cores

PARAMS_FILE = "params.yaml"
#: Environment variable the Wikidata parse reads for a Dask scheduler address.
DASK_ADDRESS_ENV = "REGRAB_DASK_ADDRESS"
#: Prefect's setting of how long a temporary server may take to start.
STARTUP_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
#: Seconds an idle core needs at most to start the temporary server (it takes 5 to 10).
STARTUP_IDLE_S = 60
#: Prefect's setting of whether its server sends usage telemetry to Prefect.
ANALYTICS_ENV = "PREFECT_SERVER_ANALYTICS_ENABLED"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestration.flows",
                                     description="Run the DVC pipeline once as a Prefect flow")
    parser.add_argument("-S", "--set-param", action="append", default=[], metavar="KEY=VALUE",
                        help="override a params.yaml key, as dvc exp run -S (repeatable)")
    parser.add_argument("--repo-dir", default=".", help="DVC project root (default: .)")
    parser.add_argument("--target", action="append", default=None,
                        help="stage to reproduce with its upstream (repeatable; default all)")
    parser.add_argument("--cluster", default=None, metavar="ADDRESS",
                        help="Dask scheduler (tcp://HOST:PORT) for the parse, training and scoring "
                             f"stages (exported as {DASK_ADDRESS_ENV}); default: this machine")
    return parser


def parse_set(items: Iterable[str]) -> dict[str, str]:
    """``{key: value text}`` of ``-S key=value`` arguments."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PipelineError(f"-S expects key=value, got '{item}'; e.g. -S train.epochs=1")
        out[key] = value
    return out


def check_overrides(argv: list[str] | None = None) -> None:
    """Parse the command line and check its overrides against the project's params.

    Raises:
        PipelineError: the project is not a DVC pipeline, or an override is bad.
    """
    args = build_parser().parse_args(argv)
    overrides = parse_set(args.set_param)
    if overrides:
        resolve(repo_root(args.repo_dir) / PARAMS_FILE, overrides)


def server_startup_s() -> int:
    """Seconds the temporary server may take: :data:`STARTUP_IDLE_S` for each share of the
    CPUs that the jobs already running want (``1 + load / cpus``)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this system
        load = 0.0
    return math.ceil(STARTUP_IDLE_S * (1 + load / usable_cores()))


def allow_server_startup() -> None:
    """Give Prefect's temporary server :func:`server_startup_s` to start, and no telemetry to
    send, unless the user set :data:`STARTUP_ENV` or :data:`ANALYTICS_ENV`; call it before
    Prefect is imported."""
    os.environ.setdefault(STARTUP_ENV, str(server_startup_s()))
    os.environ.setdefault(ANALYTICS_ENV, "false")


def server_failure(exc: BaseException) -> PipelineError | None:
    """The one line for Prefect's temporary server not starting (None for anything else)."""
    if "ephemeral Prefect API server" not in str(exc):
        return None
    waited = os.environ.get(STARTUP_ENV, "?")
    return PipelineError(
        f"Prefect's temporary server did not start within {waited} s (this machine is busy: "
        f"load {os.getloadavg()[0]:.1f} on {usable_cores()} CPUs); run again when it is "
        f"quieter, set {STARTUP_ENV} higher, or start a server (make prefect-server) and set "
        "PREFECT_API_URL=http://127.0.0.1:4200/api")
