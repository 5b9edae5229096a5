"""How the commands show and name registered versions (no DVC here: tests/cli runs them)."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline import registry, versions
from pipeline.errors import PipelineError


def version(v: str, stages: tuple[str, ...] = ()) -> registry.Version:
    return registry.Version("regrab", v, "0123456789abcdef", datetime(2026, 11, 29, 3, 39,
                                                                      tzinfo=UTC),
                            stages, "")


def test_the_listing_says_dash_where_a_version_has_no_metric():
    rows = [versions.Row(version("v0.1.0"), {"nyt25": {"5w1s": 79.24, "10w5s": 80.394},
                                              "fewrel": {}}),
            versions.Row(version("v0.2.0", ("prod",)), {})]
    lines = versions.format_listing(rows)
    assert lines[1].split() == ["v0.1.0", "-", "2026-11-29", "03:39", "0123456",
                                "79.24/-/-/80.39", "-"]
    assert lines[2].split() == ["v0.2.0", "prod", "2026-11-29", "03:39", "0123456", "-", "-"]
    assert lines[-1].startswith("promoted (prod): regrab@v0.2.0")
    assert versions.format_listing(rows[:1])[-1].startswith("no version is promoted")
    assert "no version of regrab is registered" in versions.format_listing([])[0]


def test_headline_at_a_commit(tmp_path):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "nyt25_headline.json").write_text(json.dumps(
        {"nyt25": {"5w1s": 79.24, "best": {"5w1s": 77.8}, "flag": True}}))
    (tmp_path / "metrics" / "fewrel_headline.json").write_text("not json")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m")
    head = git("rev-parse", "HEAD")
    (tmp_path / "metrics" / "nyt25_headline.json").write_text("{}")  # not committed: unread
    assert versions.headline_at(tmp_path, head, "nyt25") == {"5w1s": 79.24}
    assert versions.headline_at(tmp_path, head, "fewrel") == {}
    assert versions.headline_at(tmp_path, head, "semeval") == {}


def test_what_is_a_reference(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert versions.is_reference("regrab") and versions.is_reference("regrab@v0.2.0:fewrel")
    assert not versions.is_reference("models/nyt25/split_0/regrab/model.safetensors")
    (tmp_path / "regrab").mkdir()  # a folder of that name wins
    assert not versions.is_reference("regrab")
    assert versions.checkout_model("regrab") == (Path("regrab"), None)


def test_score_and_promote_refuse_what_names_no_benchmark_or_version():
    with pytest.raises(PipelineError, match="after the colon give a benchmark only"):
        versions.checkout_benchmark("regrab:nyt25/split_0/regrab")
    for text in ("regrab", "regrab#prod", "regrab@v0.2.0:nyt25/split_0/regrab"):
        with pytest.raises(PipelineError, match="promote takes one version"):
            versions.promote(text)


def test_register_tags_a_commit_once_and_only_one_with_models(tmp_path):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c",
                               "user.email=t@x", *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q", "-b", "main")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "README").write_text("no models yet\n")
    git("add", "-A")
    git("commit", "-qm", "no lock")
    with pytest.raises(PipelineError, match="has no dvc.lock, so it names no models"):
        versions.register("HEAD", tmp_path)
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    git("add", "-A")
    git("commit", "-qm", "a run's results")
    git("branch", "retrain/weekly")
    said = versions.register("retrain/weekly", tmp_path)
    assert said.startswith("registered regrab@v0.1.0 (commit ") and "not promoted" in said
    (made,) = registry.versions(tmp_path)
    assert made.commit == git("rev-parse", "HEAD") and made.stages == ()
    with pytest.raises(PipelineError, match=r"is regrab@v0\.1\.0 already"):
        versions.register("HEAD", tmp_path)
    with pytest.raises(PipelineError, match="names no commit"):
        versions.register("retrain/nothing", tmp_path)
