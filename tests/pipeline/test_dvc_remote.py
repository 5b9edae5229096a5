"""The project's DVC remote: `make repro` pulls what dvc.lock names, runs only what the remote
lacks, and pushes what it made; the committed default remote is a folder outside the checkout."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STAGES = {"stages": {
    "first": {"cmd": "echo first >> runs.log && echo one > a.txt", "outs": ["a.txt"]},
    "second": {"cmd": "echo second >> runs.log && cat a.txt a.txt > b.txt",
               "deps": ["a.txt"], "outs": ["b.txt"]},
}}


def default_remote(config: Path) -> str:
    parser = configparser.ConfigParser()
    parser.read(config)
    name = parser["core"]["remote"]
    return parser[f"'remote \"{name}\"'"]["url"]


def test_the_committed_default_remote_is_a_folder_beside_the_checkout():
    url = default_remote(ROOT / ".dvc" / "config")
    assert not os.path.isabs(url) and "://" not in url  # the same place on every machine
    where = (ROOT / ".dvc" / url).resolve()
    assert where.parent == ROOT.parent  # outside the checkout: git clean never removes it


def run(cwd: Path, *cmd: str) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout + done.stderr


def make_repro(project: Path) -> str:
    """The project's own ``make repro`` recipe, run in ``project`` with this venv (a stamp
    newer than its inputs stands for the venv install)."""
    for name in ("pyproject.toml", "constraints.txt", ".stamp"):
        (project / name).touch()
        if name != ".stamp":
            os.utime(project / name, (0, 0))
    return run(project, "make", "-f", str(ROOT / "Makefile"), "repro", f"BIN={BIN}",
               f"STAMP={project / '.stamp'}")


def clone(src: Path, dest: Path, remote: Path | None = None) -> Path:
    run(src.parent, "git", "clone", "-q", str(src), str(dest))
    if remote is not None:  # as a user points a clone elsewhere: config.local, not committed
        run(dest, sys.executable, "-m", "dvc", "remote", "modify", "--local", "store", "url",
            str(remote))
    return dest


@pytest.mark.slow
def test_make_repro_pulls_what_the_remote_holds_and_runs_the_rest(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "dvc.yaml").write_text(yaml.safe_dump(STAGES))
    (src / ".gitignore").write_text("runs.log\n.stamp\npyproject.toml\nconstraints.txt\n")
    run(src, "git", "init", "-q")
    run(src, sys.executable, "-m", "dvc", "init", "-q")
    # As the project commits it: a folder beside the checkout, relative to it.
    run(src, sys.executable, "-m", "dvc", "remote", "add", "-d", "store", "../remote")
    make_repro(src)  # runs both stages, then pushes them
    assert (src / "runs.log").read_text() == "first\nsecond\n"
    assert (tmp_path / "remote" / "files" / "md5").is_dir()
    run(src, "git", "add", "-A")
    run(src, "git", "commit", "-qm", "run")

    filled = clone(src, tmp_path / "filled")
    make_repro(filled)
    assert not (filled / "runs.log").exists()  # no stage ran: the outputs were pulled
    assert (filled / "b.txt").read_text() == "one\none\n"

    (tmp_path / "empty").mkdir()
    for name, remote in (("empty", tmp_path / "empty"), ("missing", tmp_path / "nowhere")):
        fresh = clone(src, tmp_path / f"with-{name}", remote)
        status = run(fresh, sys.executable, "-m", "dvc", "status")  # exit 0, remote unread
        assert "deleted" in status and "ERROR" not in status
        make_repro(fresh)  # no error: the stages run, and their outputs are pushed there
        assert (fresh / "runs.log").read_text() == "first\nsecond\n", name
        assert (fresh / "b.txt").read_text() == "one\none\n"
        assert (remote / "files" / "md5").is_dir()
