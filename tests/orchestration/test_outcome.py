"""orchestration/outcome.py: which metrics a run publishes, and the webhook."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from orchestration.outcome import (
    failure_markdown,
    notify,
    ran_stage,
    select_metrics,
    summary_markdown,
)

PRODUCERS = {"metrics/nyt25_headline.json": "headline@nyt25",
             "metrics/fewrel_headline.json": "headline@fewrel",
             "metrics/tiny.json": "evaluate"}


def test_only_the_files_this_run_made_are_published():
    chosen = select_metrics(PRODUCERS, {"headline@nyt25"},
                            differs=lambda p: p == "metrics/tiny.json")
    assert chosen == {
        "metrics/nyt25_headline.json": "written by stage headline@nyt25 in this run",
        "metrics/tiny.json": "restored by stage evaluate from DVC's cache, new since the "
                             "start commit"}


def test_a_run_that_made_nothing_publishes_no_metrics():
    assert select_metrics(PRODUCERS, set(), differs=lambda p: False) == {}


def test_ran_stage_reads_dvc_repro_lines():
    assert ran_stage("Running stage 'train@nyt25':") == "train@nyt25"
    assert ran_stage("Stage 'train@nyt25' didn't change, skipping") is None
    assert ran_stage("Stage 'x' is cached - skipping run, checking out outputs") is None


def test_summaries_say_what_happened():
    text = summary_markdown("run-1", "a" * 40, "not promoted: nyt25 5w1s -3.00 points",
                            ["stale stages: train"], {"train": 1.5},
                            [{"benchmark": "nyt25", "setting": "5w1s", "diff": -3.0}])
    assert "**not promoted: nyt25 5w1s -3.00 points**" in text
    assert "| train | 1.5 |" in text and "| nyt25 | 5w1s | -3 |" in text
    failed = failure_markdown("run-1", "b" * 40, "train", "boom", "/tmp/ws")
    assert "failed at stage `train`" in failed and "no metrics published" in failed
    assert "`/tmp/ws`" in failed


class Receiver:
    """A webhook receiver on 127.0.0.1 that records what it was sent."""

    def __init__(self, status: int = 200) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers["Content-Length"])
                received.append((self.headers["Content-Type"],
                                 json.loads(self.rfile.read(length))))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


def test_webhook_posts_the_decision_as_json(receiver):
    logged = []
    payload = {"run": "run-1", "decision": "not promoted", "table": [{"diff": -3.0}]}
    assert notify(receiver.url, payload, logged.append)
    assert receiver.received == [("application/json", payload)]
    assert logged == [f"webhook {receiver.url} answered 200"]


def test_a_webhook_that_fails_is_logged_not_raised():
    logged = []
    with Receiver(status=500) as down:
        assert not notify(down.url, {"run": "r"}, logged.append)
    assert "failed" in logged[0]
    logged.clear()
    assert not notify(down.url, {"run": "r"}, logged.append, timeout_s=2)  # nothing listens
    assert "failed" in logged[0]
    assert not notify("", {"run": "r"}, logged.append)  # none configured: nothing sent


def test_promote_benchmarks_must_be_trained_ones(tmp_path):
    import yaml

    from orchestration.champion_gate import check_benchmarks
    from pipeline.errors import PipelineError
    from pipeline.gate import PromoteConfig

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"benchmarks": {"nyt25": {"splits": "s", "title": "t"}}}))
    cfg = PromoteConfig(benchmarks=("nyt25", "fewrel"), settings=("5w1s",), headline_margin=0,
                        setting_margin=2, episodes=0, webhook="")
    with pytest.raises(PipelineError, match="promote.benchmarks names fewrel"):
        check_benchmarks(params, cfg)
    check_benchmarks(params, PromoteConfig(**{**cfg.__dict__, "benchmarks": ("nyt25",)}))
