"""``regrab-serve --model regrab --watch-registry 1`` in a toy git + DVC project: it answers
with the promoted version, moves to the next one within seconds of its promotion (answers
equal to that version's Predictor output), keeps answering when a promoted version's bytes
cannot be had, with ``/ready`` saying why, and loads that version once they are pushed."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from model.files.checkpoint import read_checkpoint, save_checkpoint
from pipeline import registry
from tests.cli.test_registered_models import (  # noqa: F401 (project: a fixture)
    DVC,
    MEMBER,
    RELATIONS,
    commit,
    git_dvc,
    project,
)
from tests.serve.test_app import expected
from tests.serve.test_real_service import free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # git, dvc and the service in subprocesses


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def probabilities(body: dict) -> np.ndarray:
    return np.array([[p["probabilities"][r] for r in RELATIONS] for p in body["predictions"]])


def wait_for(check, seconds: float, what: str):
    """Poll ``check()`` until it returns something true; fail naming ``what``."""
    deadline, last = time.monotonic() + seconds, None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what} within {seconds} s; last: {last}")


def test_the_service_follows_promotions_and_survives_a_missing_version(project, tmp_path):  # noqa: F811
    root = project["root"]
    registry.promote(root, "v0.1.0")  # the fixture promoted v0.2.0 last
    support, queries = rows(project["support"]), [q["text"] for q in rows(project["queries"])]
    want = {v: np.array([[r["probabilities"][k] for k in RELATIONS]
                         for r in expected(project[v], support, queries)]) for v in ("v1", "v2")}
    assert not np.allclose(want["v1"], want["v2"], atol=1e-4)

    port, log = free_port(), (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "serve.main", "--model", "regrab", "--watch-registry", "1",
         "--port", str(port), "--device", "cpu", "--threads", "1"],
        cwd=root, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"

    def ready() -> dict | None:
        assert proc.poll() is None, Path(log.name).read_text()[-3000:]
        try:
            r = httpx.get(f"{url}/ready")
        except httpx.TransportError:
            return None
        return r.json() if r.status_code == 200 else None

    def predict() -> dict:
        r = httpx.post(f"{url}/v1/predict", json={"support_set_id": sid, "queries": queries},
                       timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    try:
        assert wait_for(ready, 120, "ready")["version"] == "regrab@v0.1.0"
        made = httpx.post(f"{url}/v1/support-sets", json={"support": support}, timeout=60)
        assert made.status_code == 201, made.text
        sid = made.json()["support_set_id"]
        first = predict()
        assert first["version"] == "regrab@v0.1.0"
        np.testing.assert_allclose(probabilities(first), want["v1"], atol=1e-5)

        registry.promote(root, "v0.2.0")
        promoted = time.monotonic()
        second = wait_for(lambda: (b := predict())["version"] == "regrab@v0.2.0" and b, 60,
                          "answers by regrab@v0.2.0")
        took = time.monotonic() - promoted
        np.testing.assert_allclose(probabilities(second), want["v2"], atol=1e-5)
        assert took < 30, f"regrab@v0.2.0 answered {took:.1f} s after its promotion"

        # A third version, committed and registered but never pushed, its cache gone.
        old = read_checkpoint(project["v2"])
        torch.manual_seed(11)
        state = {k: v + torch.randn_like(v) if k.startswith("head.") and v.is_floating_point()
                 else v for k, v in old.state.items()}
        save_checkpoint(root / MEMBER / "model.safetensors", dataclasses.replace(old, state=state))
        commit(root, "third model, never pushed", None)
        registry.register(root)
        shutil.rmtree(root / ".dvc" / "cache")
        registry.promote(root, "v0.3.0")
        status = wait_for(lambda: (s := ready()) and s["last_error"] and s, 60,
                          "/ready naming the failed load")
        assert status["version"] == "regrab@v0.2.0"
        assert "regrab" in status["last_error"] and "dvc push" in status["last_error"], status
        for _ in range(3):  # the watcher does not retry the same version every second
            still = predict()
            assert still["version"] == "regrab@v0.2.0"
            np.testing.assert_allclose(probabilities(still), want["v2"], atol=1e-5)
            time.sleep(1)
        text = Path(log.name).read_text()
        assert text.count("loading regrab beside") == 2, text[-3000:]

        # Its bytes pushed late (as when the promotion was tagged before the push ended):
        # the watcher tries the failed version again, after 10 polls.
        git_dvc(root, *DVC, "add", "-q", "models")  # the cache again, from the workspace
        git_dvc(root, *DVC, "push", "-q")
        status = wait_for(lambda: (s := ready()) and s["version"] == "regrab@v0.3.0" and s,
                          90, "regrab@v0.3.0 loaded once pushed")
        assert status["last_error"] is None
        assert predict()["version"] == "regrab@v0.3.0"
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0, Path(log.name).read_text()[-3000:]
        log.close()
