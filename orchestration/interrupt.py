"""Ctrl-C during a one-off flow run (``python -m orchestration.flows``): seconds, one line.

Left to Prefect, a Ctrl-C took about 2.5 minutes: the terminal's SIGINT also stops the
temporary server Prefect started beside the run, and the engine then retried reporting the
crash to it, printing ``httpx.ConnectError`` tracebacks, and the run stayed ``Running``.
:func:`handling` replaces that while the flow runs: on Ctrl-C the registered clean-ups run
(the stage's ``dvc`` process stops, ``params.yaml`` gets its text back), the run is marked
Cancelled if the API answers within :data:`MARK_TIMEOUT_S` seconds (a served or
``PREFECT_API_URL`` server does; a temporary one that took the Ctrl-C too does not), the
temporary server is stopped, and the process ends with one ``error:`` line and exit 130.

The flow and its helpers register what to undo with :func:`cleanup` and the run with
:func:`set_run`; outside :func:`handling` (a served deployment, whose runner handles signals)
those registrations are never used.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: Exit status of a command stopped by Ctrl-C, as a shell reports it (128 + SIGINT).
INTERRUPTED = 130
#: Seconds to wait for the API to take the Cancelled state; it answers in milliseconds.
MARK_TIMEOUT_S = 5.0

_cleanups: list[Callable[[], Any]] = []
_run: dict[str, str | None] = {"id": None}


@contextlib.contextmanager
def cleanup(undo: Callable[[], Any]) -> Iterator[None]:
    """Run ``undo`` on Ctrl-C while the body runs (the body's own ``finally`` would not)."""
    _cleanups.append(undo)
    try:
        yield
    finally:
        _cleanups.remove(undo)


def set_run(run_id: Any) -> None:
    """Name the flow run that Ctrl-C should mark Cancelled."""
    _run["id"] = str(run_id) if run_id else None


def mark_cancelled(run_id: str) -> None:
    """Set the flow run Cancelled through the API: one try, no retries (they took minutes)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings
    from prefect.states import Cancelled

    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}), get_client(
        sync_client=True, httpx_settings={"timeout": MARK_TIMEOUT_S}
    ) as client:
        client.set_flow_run_state(run_id, Cancelled(message="interrupted (Ctrl-C)"), force=True)


def stop_temporary_server() -> None:
    """Stop the server Prefect started for this process, if any (its atexit will not run)."""
    server = sys.modules.get("prefect.server.api.server")
    # Private to Prefect, hence every step guarded: at worst the server outlives us.
    instances = getattr(getattr(server, "SubprocessASGIServer", None), "_instances", {})
    for instance in list(instances.values()):
        proc = getattr(instance, "server_process", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()


def _bounded(call: Callable[[], Any], timeout_s: float) -> bool:
    """Run ``call`` in a daemon thread; whether it finished without error in time."""
    done: list[bool] = []

    def target() -> None:
        with contextlib.suppress(Exception):
            call()
            done.append(True)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(done)


def on_interrupt(mark: Callable[[str], Any] = mark_cancelled,
                 stop: Callable[[], Any] = stop_temporary_server,
                 end: Callable[[int], Any] = os._exit,
                 timeout_s: float = MARK_TIMEOUT_S) -> None:
    """Undo, mark the run, stop the temporary server, print one line, end with 130.

    ``end`` is ``os._exit``: a ``SystemExit`` or ``KeyboardInterrupt`` would go through
    Prefect's engine again, which is what took minutes.
    """
    # A second Ctrl-C must not cut the clean-up short (params.yaml half restored).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for undo in reversed(_cleanups):
        with contextlib.suppress(Exception):
            undo()
    run_id = _run["id"]
    if run_id is None:
        state = "no flow run had started"
    elif _bounded(lambda: mark(run_id), timeout_s):
        state = f"flow run {run_id} marked Cancelled"
    else:
        state = (f"flow run {run_id} could not be marked Cancelled (the Prefect API did not "
                 f"answer within {timeout_s:g} s); it may show Running")
    with contextlib.suppress(Exception):
        stop()
    sys.stdout.flush()
    print(f"error: interrupted (Ctrl-C); {state}; params.yaml is as before the run, "
          "run the same command again to finish (DVC reuses finished stages)",
          file=sys.stderr, flush=True)
    end(INTERRUPTED)


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """While the body runs, Ctrl-C (SIGINT) goes to :func:`on_interrupt`."""
    old = signal.signal(signal.SIGINT, lambda signum, frame: on_interrupt())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        set_run(None)
