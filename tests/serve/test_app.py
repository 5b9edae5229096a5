"""The service's endpoints on a tiny checkpoint, in process (FastAPI's TestClient): answers
equal to the Predictor's, support sets cached by content, validation as one JSON line naming
the field, the token, the version swap and its failure."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from fastapi.testclient import TestClient

from model.predict.predictor import Predictor
from model.predict.sentences import parse_sentence
from serve.app import create_app
from serve.bodies import Limits
from serve.service import Service, Settings
from serve.versions import ModelSpec
from tests.model.predict.test_predictor import tiny_checkpoint
from tests.model.tiny_regrab import toy_table

RELATIONS = ["P6", "P7", "P8"]
LIMITS = Limits(body_bytes=64 * 1024, queries=20, support_sentences=30, relations=5)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    rows = toy_table(RELATIONS, 5, seed=4).to_pylist()
    support = [{"relation": x["relation"], "text": parse_sentence(x).marked()}
               for r in RELATIONS for x in [y for y in rows if y["relation"] == r][:2]]
    queries = [parse_sentence(x).marked() for r in RELATIONS
               for x in [y for y in rows if y["relation"] == r][2:5]]
    return {"one": tiny_checkpoint(root), "two": tiny_checkpoint(root, temperature=0.5),
            "support": support, "queries": queries, "root": root}


def make_client(data, token=None, **settings):
    kw = {"root": data["root"], "device": "cpu", "predictor": {"seed": 0},
          "max_wait_s": 0.002, "max_batch": 64, "cache_sets": 4, "cache_bytes": 2**24,
          **settings}
    service = Service(Settings(**kw))
    app = create_app(service, LIMITS, ModelSpec(checkpoint=data["one"]), token)
    return TestClient(app), service


@pytest.fixture(scope="module")
def client(data):
    tc, service = make_client(data)
    with tc:
        assert tc.get("/ready").json()["ready"] or _wait_ready(tc)
        yield tc


def _wait_ready(tc):
    import time

    for _ in range(200):
        if tc.get("/ready").status_code == 200:
            return True
        time.sleep(0.05)
    raise AssertionError(tc.get("/ready").json())


def expected(path, support, queries):
    """What the Python API answers for the same input."""
    predictor = Predictor.from_checkpoint(path, "cpu", seed=0)
    grouped: dict[str, list] = {}
    for row in support:
        grouped.setdefault(row["relation"], []).append(parse_sentence(row))
    predictor.set_support(grouped)
    return predictor.predict(queries).records()


def test_predict_matches_the_predictor_and_names_the_version(client, data):
    made = client.post("/v1/support-sets", json={"support": data["support"]})
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["relations"] == RELATIONS and body["shots"] == [2, 2, 2]
    again = client.post("/v1/support-sets", json={"support": data["support"]}).json()
    assert again["support_set_id"] == body["support_set_id"]  # content id: same set, same id
    answer = client.post("/v1/predict", json={"support_set_id": body["support_set_id"],
                                              "queries": data["queries"]}).json()
    assert answer["version"].startswith(f"{data['one']}@sha256:")
    assert answer["version"] == client.get("/ready").json()["version"]
    want = expected(data["one"], data["support"], data["queries"])
    got = answer["predictions"]
    assert [r["best"] for r in got] == [r["best"] for r in want]
    for g, w in zip(got, want, strict=True):
        assert set(w) <= set(g) and g["abstain"] == w["abstain"]
        np.testing.assert_allclose([g["probabilities"][r] for r in RELATIONS],
                                   [w["probabilities"][r] for r in RELATIONS], atol=1e-6)
    inline = client.post("/v1/predict", json={"support": data["support"],
                                               "queries": data["queries"][:2]}).json()
    assert inline["support_set_id"] == body["support_set_id"]
    assert [r["best"] for r in inline["predictions"]] == [r["best"] for r in got[:2]]


def test_metrics_count_requests_batches_and_the_version(client, data):
    client.post("/v1/predict", json={"support": data["support"], "queries": data["queries"]})
    text = client.get("/metrics").text
    assert 'regrab_serve_requests_total{endpoint="/v1/predict",status="200"}' in text
    assert "regrab_serve_batch_queries_bucket" in text
    passes = re.search(r"^regrab_serve_pass_seconds_count (\S+)$", text, re.M)
    assert passes and float(passes.group(1)) >= 1, text
    assert 'regrab_serve_model_info{version="' in text
    assert client.get("/health").json() == {"status": "ok"}


def _refused(client, status, field, body=None, raw=None, path="/v1/predict"):
    if raw is not None:
        r = client.post(path, content=raw, headers={"content-type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == status, r.text
    got = r.json()
    assert got["field"] == field and "\n" not in got["error"], got
    return got["error"]


def test_bad_bodies_are_4xx_naming_the_field_and_the_fix(client, data):
    sid = client.post("/v1/support-sets", json={"support": data["support"]}).json()[
        "support_set_id"]
    q = data["queries"][:1]
    assert "not JSON" in _refused(client, 400, "body", raw=b'{"queries": [')
    assert "send a JSON object" in _refused(client, 422, "body", raw=b"[1, 2]")
    assert "add 'queries'" in _refused(client, 422, "queries", {"support_set_id": sid})
    assert "list of sentences" in _refused(client, 422, "queries",
                                           {"support_set_id": sid, "queries": 7})
    assert "register it again" in _refused(client, 404, "support_set_id",
                                           {"support_set_id": "f" * 24, "queries": q})
    assert "[/E2] is missing" in _refused(
        client, 422, "queries[1]", {"support_set_id": sid,
                                    "queries": [data["queries"][0], "[E1]a[/E1] b [E2]c"]})
    span = {"tokens": ["a", "b"], "head_start": 0, "head_end": 1, "tail_start": 1,
            "tail_end": 9}
    assert "outside the sentence" in _refused(client, 422, "queries[0]",
                                              {"support_set_id": sid, "queries": [span]})
    assert "more than the 20" in _refused(client, 413, "queries", {
        "support_set_id": sid, "queries": data["queries"] * 3})
    assert "over 65,536 bytes" in _refused(client, 413, "body", {
        "support_set_id": sid, "queries": ["[E1]a[/E1] [E2]b[/E2] " + "w " * 40000]})
    assert "needs a string 'relation'" in _refused(
        client, 422, "support[0]", {"support": [{"text": "x"}], "queries": q})
    assert "unknown field" in _refused(client, 422, "colour", {"colour": 1, "queries": q})
    assert "not both" in _refused(client, 422, "support", {
        "support_set_id": sid, "support": data["support"], "queries": data["queries"]})
    assert "lone surrogate" in _refused(client, 422, "zero_shot[0]", raw=json.dumps(
        {"zero_shot": ["\ud800", "P6"], "queries": q}).encode())
    assert "nothing predicts it" in _refused(client, 422, "support", {
        "support": data["support"], "zero_shot": ["P999"], "queries": data["queries"][:1]},
        path="/v1/predict")
    nested = b'{"queries": ' + b"[" * 20000 + b"]" * 20000 + b"}"
    _refused(client, 400, "body", raw=nested)
    assert client.get("/health").status_code == 200  # still up


def test_token_guards_everything_but_health_and_ready(data):
    tc, _ = make_client(data, token="s3cret")
    with tc:
        _wait_ready(tc)
        assert tc.get("/metrics").status_code == 401
        r = tc.post("/v1/predict",
                    json={"support": data["support"], "queries": data["queries"][:1]})
        assert r.status_code == 401 and "Bearer" in r.json()["error"]
        ok = tc.post("/v1/predict", headers={"Authorization": "Bearer s3cret"},
                     json={"support": data["support"], "queries": data["queries"][:1]})
        assert ok.status_code == 200


def test_swap_answers_with_the_new_version_and_a_failed_load_keeps_the_old(data, tmp_path):
    tc, service = make_client(data)
    with tc:
        _wait_ready(tc)
        body = {"support": data["support"], "queries": data["queries"]}
        first = tc.post("/v1/predict", json=body).json()
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes(b"junk")
        r = tc.post("/admin/load", json={"checkpoint": str(bad)})
        assert r.status_code == 422 and "still answering with" in r.json()["error"]
        ready = tc.get("/ready").json()
        assert ready["version"] == first["version"] and "bad.safetensors" in ready["last_error"]
        loaded = tc.post("/admin/load", json={"checkpoint": str(data["two"])}).json()
        assert loaded["version"].startswith(str(data["two"]))
        second = tc.post("/v1/predict", json=body).json()
        assert second["version"] == loaded["version"] != first["version"]
        want = expected(data["two"], data["support"], data["queries"])
        np.testing.assert_allclose(
            [r["confidence"] for r in second["predictions"]],
            [r["confidence"] for r in want], atol=1e-6)
        assert tc.get("/ready").json()["last_error"] is None
        neither = tc.post("/admin/load", json={})
        assert neither.status_code == 422 and neither.json()["field"] == "model"


def test_a_support_set_answers_the_same_after_another_was_used(client, data):
    """The predictor holds one support set at a time: switching back restores it whole."""
    body = {"support": data["support"], "queries": data["queries"]}
    first = client.post("/v1/predict", json=body).json()["predictions"]
    other = {"support": data["support"][2:], "zero_shot": ["P9"], "queries": data["queries"]}
    assert client.post("/v1/predict", json=other).json()["relations"] == ["P7", "P8", "P9"]
    again = client.post("/v1/predict", json=body).json()["predictions"]
    assert [r["probabilities"] for r in again] == [r["probabilities"] for r in first]
