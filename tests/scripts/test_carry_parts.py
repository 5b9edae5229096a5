"""scripts/carry_parts.sh: an encoder folder cut into parts comes back byte for byte."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "carry_parts.sh"


def carry(*args: str, part_size: str = "1000") -> subprocess.CompletedProcess:
    env = {**os.environ, "PART_SIZE": part_size}
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True,
                           text=True, env=env, check=False)


@pytest.fixture()
def encoder(tmp_path: Path) -> Path:
    src = tmp_path / "enc"
    src.mkdir()
    (src / "model.safetensors").write_bytes(os.urandom(3500))
    (src / "config.json").write_text('{"a": 1}')
    (src / "tokenizer.json").write_text("{}")
    return src


def gather(tmp_path: Path, prefix: Path) -> Path:
    """What the device calls do: copy every part's folder into one folder."""
    into = tmp_path / "gathered"
    into.mkdir()
    for folder in sorted(prefix.parent.glob(prefix.name + "[0-9]*")):
        for f in folder.iterdir():
            shutil.copy(f, into)
    return into


def test_split_then_join_is_identical(tmp_path, encoder):
    prefix = tmp_path / "mp"
    assert carry("split", encoder, prefix).returncode == 0
    folders = sorted(tmp_path.glob("mp[0-9]*"))
    assert [f.name for f in folders] == ["mp1", "mp2", "mp3", "mp4"]  # 3500 bytes / 1000
    assert all(sum(p.stat().st_size for p in f.glob("*.part*")) <= 1000 for f in folders)
    assert (folders[-1] / "config.json").exists() and (folders[-1] / "SHA256SUMS").exists()
    out = tmp_path / "joined"
    res = carry("join", gather(tmp_path, prefix), out)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in encoder.iterdir())
    for f in encoder.iterdir():
        assert (out / f.name).read_bytes() == f.read_bytes()


def test_join_with_a_part_missing_fails_and_writes_nothing(tmp_path, encoder):
    prefix = tmp_path / "mp"
    carry("split", encoder, prefix)
    shutil.rmtree(tmp_path / "mp2")
    out = tmp_path / "joined"
    res = carry("join", gather(tmp_path, prefix), out)
    assert res.returncode == 2
    assert res.stderr.startswith("error: the joined weights do not match SHA256SUMS")
    assert not out.exists()
    assert not list(tmp_path.glob("joined.tmp*"))


def test_split_refuses_existing_folders(tmp_path, encoder):
    (tmp_path / "mp1").mkdir()
    res = carry("split", encoder, tmp_path / "mp")
    assert res.returncode == 2 and "folders exist" in res.stderr
    assert not list(tmp_path.glob("mp.tmp*"))


def test_split_without_weights_names_the_fix(tmp_path):
    res = carry("split", tmp_path, tmp_path / "mp")
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error:") and "export_encoder_fp16" in res.stderr
