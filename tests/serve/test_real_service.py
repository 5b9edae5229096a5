"""The real service in a subprocess on loopback: 1,000 requests from 32 concurrent clients
with a version swap in the middle (every answer names one version and equals that version's
Predictor output), hostile bodies answered 4xx while it stays up, and SIGTERM under load
answering every request it took and exiting 0."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.serve.test_app import RELATIONS, expected

ROOT = Path(__file__).resolve().parents[2]
REQUESTS, CLIENTS = 1000, 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def service(data, tmp_path):
    port = free_port()
    log = (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "serve.main", "--checkpoint", str(data["one"]), "--port",
         str(port), "--device", "cpu", "--threads", "1", "--max-wait-ms", "5"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, Path(log.name).read_text()
            time.sleep(0.1)
        yield url, proc, Path(log.name)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()


@pytest.mark.slow
def test_swap_under_load_hostile_bodies_and_sigterm(service, data):
    url, proc, log = service
    queries = data["queries"]
    want = {}
    for name in ("one", "two"):
        rows = expected(data[name], data["support"], queries)
        want[name] = np.array([[r["probabilities"][k] for k in RELATIONS] for r in rows])
    sid = httpx.post(f"{url}/v1/support-sets", json={"support": data["support"]}).json()[
        "support_set_id"]
    versions: dict[str, str] = {}
    answers: list[tuple[str, list[int], np.ndarray]] = []
    failures: list[str] = []

    async def client(http: httpx.AsyncClient, counter: list[int]) -> None:
        while counter[0] < REQUESTS:
            i = counter[0]
            counter[0] += 1
            if i == REQUESTS // 3:  # the swap, from inside the load
                r = await http.post("/admin/load", json={"checkpoint": str(data["two"])},
                                    timeout=120)
                versions["two"] = r.json().get("version", r.text)
                continue
            if i % 50 == 7:  # a hostile body among the good ones
                r = await http.post("/v1/predict", content=b'{"queries": [{"tokens": 5}]',
                                    headers={"content-type": "application/json"})
                if r.status_code != 400:
                    failures.append(f"hostile: {r.status_code} {r.text}")
                continue
            picked = [(i + k) % len(queries) for k in range(1 + i % 3)]
            r = await http.post("/v1/predict", json={"support_set_id": sid, "queries": [
                queries[j] for j in picked]}, timeout=120)
            if r.status_code != 200:
                failures.append(f"{r.status_code} {r.text}")
                continue
            body = r.json()
            probs = np.array([[p["probabilities"][k] for k in RELATIONS]
                              for p in body["predictions"]])
            answers.append((body["version"], picked, probs))

    async def load() -> None:
        counter = [0]
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            await asyncio.gather(*(client(http, counter) for _ in range(CLIENTS)))

    versions["one"] = httpx.get(f"{url}/ready").json()["version"]
    asyncio.run(load())
    assert failures == []
    assert versions["two"].startswith(str(data["two"])) and versions["two"] != versions["one"]
    by_name = {v: k for k, v in versions.items()}
    seen = {by_name.get(v) for v, _, _ in answers}
    assert seen == {"one", "two"}, seen
    for version, picked, probs in answers:
        np.testing.assert_allclose(probs, want[by_name[version]][picked], atol=1e-5)
    for hostile in (b"\xff\xfe", b'{"queries": "' + b"a" * 5_000_000 + b'"}', b"null"):
        r = httpx.post(f"{url}/v1/predict", content=hostile,
                       headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, r.text
    assert httpx.get(f"{url}/health").status_code == 200

    # SIGTERM under load: every request the service took is answered, then it exits 0.
    outcomes: list[str] = []

    async def until_stopped(http: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + 120  # a service that ignores SIGTERM fails, not hangs
        while time.monotonic() < deadline:
            try:
                r = await http.post("/v1/predict", json={"support_set_id": sid,
                                                         "queries": queries}, timeout=60)
            except httpx.TransportError:
                outcomes.append("refused")
                return
            outcomes.append(str(r.status_code))
        outcomes.append("still answering 120 s after SIGTERM")

    async def stop() -> None:
        async with httpx.AsyncClient(base_url=url) as http:
            tasks = [asyncio.create_task(until_stopped(http)) for _ in range(CLIENTS)]
            await asyncio.sleep(1.0)
            proc.send_signal(signal.SIGTERM)
            await asyncio.gather(*tasks)

    asyncio.run(stop())
    assert proc.wait(timeout=60) == 0
    assert set(outcomes) <= {"200", "refused"} and outcomes.count("200") > 0, outcomes
    stopped = re.search(r"stopped: (\d+) requests accepted, (\d+) answered", log.read_text())
    assert stopped and stopped.group(1) == stopped.group(2), log.read_text()[-2000:]
