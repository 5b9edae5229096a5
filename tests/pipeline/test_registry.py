"""The model registry: GTO-convention tags, promotion, roll-back, and copies out of DVC."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gto import api as gto_api

from pipeline import registry
from pipeline.errors import PipelineError

DVC = [sys.executable, "-m", "dvc"]
MEMBER = Path("models") / registry.DEFAULT_MEMBER


def run(cwd: Path, *cmd: str) -> None:
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)


def commit_model(repo: Path, text: str) -> None:
    """Write the default member's checkpoint as ``text``, track it with DVC and commit."""
    (repo / MEMBER).mkdir(parents=True, exist_ok=True)
    (repo / MEMBER / registry.MODEL_FILE).write_text(text)
    (repo / MEMBER / "dvclive").mkdir(exist_ok=True)
    (repo / MEMBER / "dvclive" / "curve.tsv").write_text("step\tloss\n")
    run(repo, *DVC, "add", "-q", "models")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", text)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git + DVC project with a local DVC remote and one committed model."""
    root = tmp_path / "project"
    root.mkdir()
    run(root, "git", "init", "-q")
    run(root, "git", "config", "user.email", "t@example.com")
    run(root, "git", "config", "user.name", "t")
    run(root, *DVC, "init", "-q")
    run(root, *DVC, "remote", "add", "-d", "local", str(tmp_path / "remote"))
    commit_model(root, "one")
    return root


def test_parse_ref_forms() -> None:
    assert registry.parse_ref("regrab") == registry.Ref("regrab", None, "prod",
                                                        registry.DEFAULT_MEMBER)
    assert registry.parse_ref("regrab@v1.2.0:fewrel/split_0/proto") == registry.Ref(
        "regrab", "v1.2.0", None, "fewrel/split_0/proto")
    assert registry.parse_ref("regrab#staging").stage == "staging"
    with pytest.raises(PipelineError, match="regrab-models list"):
        registry.parse_ref("regrab@1.2")
    assert registry.looks_like_ref("regrab@v1.0.0")
    assert not registry.looks_like_ref("models/nyt25/split_0/regrab/model.safetensors")


@pytest.mark.slow
def test_register_promote_rollback_and_checkout(repo: Path) -> None:
    first = registry.register(repo, message="headline 79.2")
    assert first.version == "v0.1.0" and first.message == "headline 79.2"
    with pytest.raises(PipelineError, match="no version of regrab is assigned to prod"):
        registry.resolve(repo, "regrab")
    registry.promote(repo, "v0.1.0")
    commit_model(repo, "two")
    second = registry.register(repo)
    assert second.version == "v0.2.0" and second.stages == ()
    time.sleep(1.1)
    registry.promote(repo, "v0.2.0")
    assert [(v.version, v.stages) for v in registry.versions(repo)] == [
        ("v0.1.0", ()), ("v0.2.0", ("prod",))]
    path = registry.checkout(repo, "regrab")
    assert path.read_text() == "two"
    assert not (path.parent / "dvclive").exists()  # curves are not copied
    time.sleep(1.1)  # GTO orders assignments by their tags' dates, to the second
    assert registry.rollback(repo).version == "v0.1.0"
    assert registry.checkout(repo, "regrab#prod").read_text() == "one"
    assert registry.assignments(repo) == ["v0.1.0", "v0.2.0", "v0.1.0"]
    # The tags are GTO's: its own reader agrees on what is in prod.
    shown = gto_api.show(str(repo), "regrab")
    assert [(v["version"], [s["stage"] for s in v["stages"]]) for v in shown] == [
        ("v0.2.0", []), ("v0.1.0", ["prod"])]


@pytest.mark.slow
def test_checkout_pulls_from_the_remote(repo: Path) -> None:
    registry.promote(repo, registry.register(repo).version)
    run(repo, *DVC, "push", "-q")
    shutil.rmtree(repo / ".dvc" / "cache")
    assert registry.checkout(repo, "regrab@v0.1.0").read_text() == "one"


@pytest.mark.slow
def test_checkout_refuses_missing_bytes_and_members(repo: Path) -> None:
    registry.register(repo)
    shutil.rmtree(repo / ".dvc" / "cache")  # never pushed
    with pytest.raises(PipelineError, match="dvc push"):
        registry.checkout(repo, "regrab@v0.1.0")
    with pytest.raises(PipelineError, match="not registered"):
        registry.checkout(repo, "regrab@v3.0.0")
    with pytest.raises(PipelineError, match="no model fewrel/split_0/regrab"):
        registry.checkout(repo, "regrab@v0.1.0:fewrel/split_0/regrab")
    assert not (repo / registry.CHECKOUT_DIR / "regrab" / "v0.1.0" / "nyt25").exists()
