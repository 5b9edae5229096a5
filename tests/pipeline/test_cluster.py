"""pipeline/cluster.py: a scheduler address is checked, bounded, before any stage connects."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.cluster import ADDRESS_ENV, check_cluster
from pipeline.errors import PipelineError

ROOT = Path(__file__).resolve().parents[2]


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # Dask's bytes are a bad request: no log
        pass


@contextlib.contextmanager
def http_server() -> Iterator[str]:
    """A plain HTTP server on a loopback port (not a Dask scheduler); its ``host:port``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_an_http_server_is_no_scheduler(monkeypatch):
    """Refused within the handshake's bound: the wait Dask's handshake runs under carries
    ``handshake_s`` (checked on the call, not on a clock; the server never answers Dask, so
    the bound is what ends the wait)."""
    bounds, wait_for = [], asyncio.wait_for

    def bounded(awaitable, timeout):
        if getattr(awaitable, "__qualname__", "").endswith("check_handshake.<locals>.handshake"):
            bounds.append(timeout)
        return wait_for(awaitable, timeout)

    monkeypatch.setattr(asyncio, "wait_for", bounded)
    with http_server() as address:
        with pytest.raises(PipelineError, match=f"no Dask scheduler answers at tcp://{address}"):
            check_cluster(address, handshake_s=0.2)
        assert bounds == [0.2]
        assert check_cluster(address, connect=False) == f"tcp://{address}"  # the form only


@pytest.mark.slow  # a stage in a child process (it imports Dask)
def test_parse_wikidata_refuses_it_in_one_line_before_any_work(tmp_path):
    """``dvc repro -s -f parse_wikidata`` with such an address hung 240 s, deaf to Ctrl-C."""
    triples = tmp_path / "t.tsv"
    triples.write_text("Q1\tP1\tQ2\n")
    with http_server() as address:
        start = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-m", "stages.parse_wikidata", str(triples), "--out",
             str(tmp_path / "out" / "triples.parquet")],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT), ADDRESS_ENV: address})
        took = time.monotonic() - start
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.count("\n") == 1, res.stderr[-2000:]
    assert res.stderr.startswith(f"error: no Dask scheduler answers at tcp://{address}")
    assert took < 120 and sorted(p.name for p in tmp_path.iterdir()) == ["t.tsv"]
