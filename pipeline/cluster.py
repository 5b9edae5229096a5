"""A Dask scheduler named by a stage's ``--cluster`` or ``$REGRAB_DASK_ADDRESS``, and a client.

Every stage that can spread its work over several machines takes the same argument
(:func:`add_cluster_argument`): the Wikidata parse (:mod:`pipeline.wikidata.engine`) and the
job runner of ``train``, ``evaluate``, ``transfer`` and ``active_labelling``
(:mod:`pipeline.dask_jobs`). A wrong address is one ``error:`` line before any work starts.
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any
from urllib.parse import urlsplit

from pipeline.errors import PipelineError

#: Environment variable naming an existing scheduler (``tcp://host:8786``).
ADDRESS_ENV = "REGRAB_DASK_ADDRESS"
#: Seconds to wait for an existing scheduler to answer.
CONNECT_TIMEOUT_S = 10
#: Seconds to wait for a TCP connection to a scheduler's address, checked first.
PROBE_TIMEOUT_S = 5.0
#: Seconds Dask's handshake may take after the TCP probe; a scheduler answers in milliseconds.
HANDSHAKE_TIMEOUT_S = 5.0


def add_cluster_argument(parser: argparse.ArgumentParser, what: str = "jobs") -> None:
    """The ``--cluster ADDRESS`` argument, defaulting to ``$REGRAB_DASK_ADDRESS``.

    The address is checked as the arguments are read (its form, and that something answers
    there), so a wrong one is one ``error:`` line before the stage reads or writes anything.
    """
    parser.add_argument(
        "--cluster", default=os.environ.get(ADDRESS_ENV) or None, metavar="ADDRESS",
        type=check_cluster,
        help=f"existing Dask scheduler that runs the {what}, e.g. tcp://host:8786 (default: "
             f"${ADDRESS_ENV}; unset: this machine alone)")


def check_cluster(address: str | None, connect: bool = True,
                  handshake_s: float = HANDSHAKE_TIMEOUT_S) -> str | None:
    """Normalise a Dask scheduler address (``host:port`` -> ``tcp://host:port``).

    Args:
        address: ``tcp://host:port``, ``tls://host:port`` or ``host:port``; None or
            empty for no cluster.
        connect: also check that a Dask scheduler answers there: a TCP connection, then
            Dask's handshake within ``handshake_s`` seconds. Something that accepts
            connections but is no scheduler (an HTTP server, a proxy) hung Dask's client
            for minutes, deaf to Ctrl-C.

    Raises:
        PipelineError: a malformed address, nothing answering at it, or no scheduler.
    """
    if not address:
        return None
    url = address if "://" in address else f"tcp://{address}"
    parts = urlsplit(url)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if parts.scheme not in {"tcp", "tls"} or not host or not port:
        raise PipelineError(
            f"cluster address '{address}' is not a Dask scheduler address; "
            "give tcp://HOST:PORT (e.g. tcp://10.0.0.5:8786)"
        )
    if connect:
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
        except OSError as exc:
            raise unreachable(url, exc) from exc
        check_handshake(url, handshake_s)
    return url


def check_handshake(url: str, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
    """Open and close one Dask connection to ``url``, within ``timeout_s`` seconds.

    Raises:
        PipelineError: no Dask handshake in time, or an answer that is not Dask's.
    """
    import asyncio

    from distributed.comm import connect as dask_connect

    async def handshake() -> None:
        comm = await dask_connect(url, timeout=timeout_s)
        await comm.close()

    try:
        # connect's own timeout does not bound the handshake: a silent peer would hang it.
        asyncio.run(asyncio.wait_for(handshake(), timeout_s))
    except Exception as exc:  # noqa: BLE001 - timed out, closed, or not Dask's answer
        reason = str(exc) or f"no Dask handshake within {timeout_s:g} s"
        raise PipelineError(
            f"no Dask scheduler answers at {url} ({type(exc).__name__}: {reason[:200]}); "
            f"start one (`dask scheduler`), fix the address, or drop --cluster / unset "
            f"{ADDRESS_ENV} to use this machine alone") from exc


def unreachable(address: str, exc: BaseException) -> PipelineError:
    """The one line for a scheduler that does not answer."""
    return PipelineError(
        f"cannot reach Dask scheduler at {address} ({type(exc).__name__}: {exc}); start it "
        f"(`dask scheduler` and `dask worker {address}` on the machines), fix the "
        f"address, or drop --cluster / unset {ADDRESS_ENV} to use this machine alone"
    )


def connect(address: str) -> Any:
    """A client of the scheduler at ``address``: a quick probe, then Dask's handshake."""
    from distributed import Client

    if "://" not in address or urlsplit(address).scheme in ("tcp", "tls"):  # not inproc://
        address = check_cluster(address)
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - refused, timed out, or not Dask at all
        raise unreachable(address, exc) from exc
