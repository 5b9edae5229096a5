"""Training after a hard kill: no stale temporaries cached with ``models/``, and dvclive
curves that hold one row per step however often the run was resumed."""

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from model.training import jobs
from stages import train
from tests.conftest import ROOT, project_params
from tests.model.tiny_regrab import labels_of, tiny_encoder, toy_graph, toy_splits

pytest.importorskip("dvclive")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_hardening")
    enc = tiny_encoder(root / "bert")
    splits = toy_splits(root / "splits")
    graph, features = toy_graph(root)
    return root, enc, splits, graph, features


def _run(inputs, out: Path, **train_kw) -> dict:
    root, enc, splits, graph, features = inputs
    params = project_params(**{
        "model": {"encoder": {"name": str(enc), "train_layers": 1},
                  "langevin": {"samples": 2, "steps": 2}},
        "train": {"methods": ["regrab"], "splits": [], "per_setting": [], "steps": 4,
                  "ways": [2, 3], "shots": [1, 2], "queries": 2, "val_every": 2,
                  "val_episodes": 10, "val_settings": ["2w1s"], "checkpoint_every": 2,
                  "dvclive": False, "device": "cpu", "threads": 1, **train_kw},
    })
    path = out.parent / f"{out.name}.params.yaml"
    path.write_text(yaml.safe_dump(params))
    return train.main(["--splits", str(splits), "--graph", str(graph), "--features",
                       str(features), "--relations", str(labels_of(graph)),
                       "--out", str(out), "--params", str(path)])


def _kill_at(monkeypatch, step: int) -> None:
    """Make the next run stop (as a kill would) right after ``step``."""
    original = train.train_one

    def killed(*args, **kw):
        def hook(done: int) -> None:
            if done == step:
                raise KeyboardInterrupt

        return original(*args, **kw, on_step=hook)

    monkeypatch.setattr(train, "train_one", killed)


def _sigkill_during_atomic_write(target: Path) -> None:
    """Start an atomic write of ``target`` in a child process and SIGKILL it mid-write."""
    code = (
        "import os, signal, sys\n"
        "from pipeline.io import atomic_path\n"
        "with atomic_path(sys.argv[1]) as tmp:\n"
        "    tmp.write_bytes(b'half a checkpoint')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(target)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.returncode == -signal.SIGKILL


def _stale(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*.tmp"))


def test_rerun_after_kill_mid_checkpoint_removes_the_temporary(inputs, tmp_path, monkeypatch):
    model_dir = tmp_path / "m/split_0/regrab"
    _kill_at(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        _run(inputs, tmp_path / "m")
    monkeypatch.undo()
    _sigkill_during_atomic_write(model_dir / "state.safetensors")
    assert len(_stale(model_dir)) == 1 and _stale(model_dir)[0].startswith(".state.safetensors.")
    summary = _run(inputs, tmp_path / "m")
    assert summary["models"][0]["steps"] == 4
    assert _stale(tmp_path / "m") == []
    assert sorted(p.name for p in model_dir.iterdir()) == ["model.safetensors"]


def test_rerun_of_a_finished_model_removes_the_temporary(inputs, tmp_path):
    model_dir = tmp_path / "m/split_0/regrab"
    first = _run(inputs, tmp_path / "m")
    _sigkill_during_atomic_write(model_dir / "model.safetensors")
    assert _stale(model_dir)
    _sigkill_during_atomic_write(tmp_path / "m/summary.json")
    again = _run(inputs, tmp_path / "m")  # unchanged params: the model is reused
    assert again["models"] == first["models"]
    assert _stale(tmp_path / "m") == []


def _curve(model_dir: Path, metric: str) -> list[tuple[int, str]]:
    """(step, value) rows of one dvclive TSV curve."""
    path = model_dir / "dvclive" / "plots" / "metrics" / f"{metric}.tsv"
    with path.open(newline="") as fh:
        return [(int(row["step"]), row[metric.split("/")[-1]])
                for row in csv.DictReader(fh, delimiter="\t")]


@pytest.mark.parametrize("kill_at", [1, 3])
def test_dvclive_curves_after_resume_have_one_row_per_step(inputs, tmp_path, monkeypatch,
                                                           kill_at):
    _run(inputs, tmp_path / "full", dvclive=True)
    # Killed after step 1 (no checkpoint yet: starts over) or step 3 (resumes at step 2,
    # after step 3's rows were logged).
    _kill_at(monkeypatch, kill_at)
    with pytest.raises(KeyboardInterrupt):
        _run(inputs, tmp_path / "killed", dvclive=True)
    monkeypatch.undo()
    _run(inputs, tmp_path / "killed", dvclive=True)
    full, killed = tmp_path / "full/split_0/regrab", tmp_path / "killed/split_0/regrab"
    loss = _curve(killed, "train/loss")
    assert [step for step, _ in loss] == [0, 1, 2, 3]
    # Resume is bit-identical, so the curves are the uninterrupted run's, row for row.
    assert loss == _curve(full, "train/loss")
    assert _curve(killed, "val/acc") == _curve(full, "val/acc")
    assert len(_curve(killed, "val/acc")) == 2


def test_dvclive_resume_tolerates_a_row_cut_by_the_kill(inputs, tmp_path, monkeypatch):
    _run(inputs, tmp_path / "full", dvclive=True)
    _kill_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        _run(inputs, tmp_path / "killed", dvclive=True)
    monkeypatch.undo()
    killed = tmp_path / "killed/split_0/regrab"
    tsv = killed / "dvclive/plots/metrics/train/loss.tsv"
    with tsv.open("a") as fh:
        # A kill while dvclive wrote step 10's row leaves "1" and no newline: it must not
        # pass for step 1, nor glue itself to the next row logged.
        fh.write("1")
    _run(inputs, tmp_path / "killed", dvclive=True)
    assert _curve(killed, "train/loss") == _curve(tmp_path / "full/split_0/regrab",
                                                  "train/loss")


def test_a_crash_while_trimming_a_curve_leaves_it_whole(tmp_path, monkeypatch):
    tsv = tmp_path / "dvclive" / "plots" / "metrics" / "train" / "loss.tsv"
    tsv.parent.mkdir(parents=True)
    rows = "timestamp\tstep\tloss\n1\t0\t0.5\n2\t1\t0.4\n3\t2\t0.3\n"
    tsv.write_text(rows)
    real = Path.write_text

    def crash(self, text, *args, **kwargs):  # half the text reaches the disk, then a kill
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", crash)
    with pytest.raises(KeyboardInterrupt):
        jobs.dvclive_logger(tmp_path, step=2)  # drops step 2's row, then resumes
    assert tsv.read_text() == rows and sorted(p.name for p in tsv.parent.iterdir()) == [
        "loss.tsv"]
