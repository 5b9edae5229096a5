"""scripts/gpu_pack.py and gpu_table.py on the CPU: pack, the device calls one by one.

The same commands a lent GPU runs, on a toy project with a tiny encoder and a tiny preset over
params-gpu-mpnet.yaml (bf16 autocast runs on the CPU too), so the script cannot rot between
the times a GPU is lent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.model.tiny_regrab import labels_of, tiny_encoder, toy_graph, toy_splits

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"

TINY = {
    "model": {"langevin": {"samples": 2, "steps": 2}},
    "train": {"steps": 4, "ways": [2, 3], "shots": [1, 2], "queries": 2, "val_episodes": 3,
              "val_settings": ["2w1s"], "device": "cpu", "threads": 1, "encode_batch": 16},
    "evaluate": {"settings": ["2w1s", "3w2s"], "episodes": 5, "queries": 2, "device": "cpu",
                 "nota_rates": [], "temperature_episodes": 0, "threads": 1, "workers": 1,
                 # the toy splits test 3 relations: too few for 5-way unequal-shot episodes
                 "unequal_settings": []},
}


#: Run as on a bare GPU machine: the packages it lacks cannot be imported.
BARE = '''import sys

MISSING = {"hydra", "omegaconf", "orjson", "dask", "distributed", "prefect", "ruamel", "dvc",
           "dvclive"}


class Missing:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in MISSING:
            raise ImportError(f"{name} is not on the GPU machine")


sys.meta_path.insert(0, Missing)
'''


def _script(name: str, *args: str, cwd: Path = ROOT, bare: Path | None = None
            ) -> subprocess.CompletedProcess:
    path = str(ROOT) if bare is None else f"{ROOT}{os.pathsep}{bare}"
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run([sys.executable, str(SCRIPTS / name), *args], cwd=cwd, env=env,
                         capture_output=True, text=True, check=False, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    data = root / "data"
    toy_splits(data / "splits", n_splits=2)
    graph, features = toy_graph(root)
    for src, dst in ((graph, "graph/graph.parquet"), (features, "features/transe.parquet"),
                     (labels_of(graph), "wikidata/relations.parquet")):
        (data / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, data / dst)
    names = {f"P{i}": [f"relation {i}", f"what relation {i} says"] for i in range(1, 10)}
    (data / "raw" / "fewrel").mkdir(parents=True)
    (data / "raw" / "fewrel" / "pid2name.json").write_text(json.dumps(names))
    preset = root / "tiny.yaml"
    preset.write_text(yaml.safe_dump(TINY))
    bundle = root / "bundle"
    res = _script("gpu_pack.py", "--encoder", str(tiny_encoder(root / "bert")),
                  "--data", str(data), "--dest", str(bundle),
                  "--preset", str(ROOT / "params-gpu-mpnet.yaml"), "--preset", str(preset),
                  "--part-size", "40000")
    return root, bundle, res.stdout


def _call(root: Path, bundle: Path, carry: list[str], i: int, *extra: str):
    """One device call: a bundle holding only what the call carries, the same command."""
    there = root / f"call{i}"
    for c in carry:
        shutil.copytree(bundle / Path(c).name, there / Path(c).name)
    out = root / f"out{i}"
    bare = root / "bare"
    bare.mkdir(exist_ok=True)
    (bare / "sitecustomize.py").write_text(BARE)
    res = _script("gpu_table.py", "--bundle", str(there), "--work", str(root / "work"),
                  "--out", str(out), "--min-steps", "2", "--eval-reserve", "5", "--margin", "1",
                  *extra, bare=bare)
    return out, res.stdout


@pytest.mark.slow
@pytest.mark.long(minutes=2)
def test_pack_carry_and_run_the_table_on_the_cpu(packed):
    root, bundle, printed = packed
    calls = json.loads((bundle / "calls.json").read_text())["calls"]
    assert len(calls) >= 2 and all(len(c) == 1 for c in calls[:-1])
    assert calls[-1][-1].endswith("main")  # the data and version travel with the last part
    assert "PYTHONPATH=$PWD python3 scripts/gpu_table.py --budget 450 --out $OUT" in printed
    version = json.loads((bundle / "main" / "version.json").read_text())
    assert len(version["commit"]) == 40 and version["code_sha256"]
    for i, carry in enumerate(calls[:-1], 1):  # parts only: kept under --work, nothing run
        out, stdout = _call(root, bundle, carry, i)
        assert f"{i} of {len(calls)} encoder parts" in stdout or "encoder parts" in stdout
        assert not (out / "run.json").exists()
    # A budget no load on a CI machine can eat: the preset's own steps always fit.
    out, stdout = _call(root, bundle, calls[-1], len(calls), "--budget", "100000")
    assert "s/step (median of steps 3-12" in stdout
    assert stdout.index("s/step") < stdout.index("plan:") < stdout.index("stages.train")
    record = json.loads((out / "run.json").read_text())
    assert record["plan"]["steps"] == 4  # the tiny preset's steps fit the budget
    assert record["splits"] == ["split_0", "split_1"]
    assert record["version"]["code_as_packed"] and record["calibration"]["step_s"] > 0
    params = yaml.safe_load((out / "params.yaml").read_text())
    assert params["train"]["precision"] == "bf16" and params["train"]["steps"] == 4
    assert params["model"]["encoder"]["name"] == str(root / "work" / "encoder")
    metrics = json.loads((out / "nyt25_gpu_mpnet.json").read_text())
    text = json.dumps(metrics)
    for method in ("regrab", "proto_label", "regrab_no_prior", "proto"):
        assert method in text
    assert (out / "nyt25_gpu_mpnet.md").exists() and (out / "log.txt").exists()
    bench = (out / "bench_train.txt").read_text()
    assert "encoder alone, bf16" in bench and "regrab step, fp32 (old path)" in bench
    names = [p.name for p in out.iterdir()]
    assert len(names) <= 8  # what one device call brings back

    # A rerun on the warm machine with too little time: the floor of steps, one split
    # only (none after the first past the deadline), the table written again, no benchmark.
    out, stdout = _call(root, bundle, calls[-1], len(calls) + 1, "--budget", "1")
    record = json.loads((out / "run.json").read_text())
    assert record["plan"]["steps"] == 2  # the floor, since nothing fits one second
    assert record["splits"] == ["split_0"]  # no split after the first past the deadline
    assert "not starting split_1" in stdout and "bench_train.py skipped" in stdout


# ------------------------------------------------------------------ bad arguments


def _refused(name: str, *args: str, cwd: Path = ROOT) -> str:
    """Run a script that must stop with one ``error:`` line and exit 2; returns the line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, str(SCRIPTS / name), *args], cwd=cwd, env=env,
                         capture_output=True, text=True, check=False, timeout=300)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: "), res.stderr[-2000:]
    return res.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--budget", "-5"], "--budget -5.0"),
    (["--budget", "nan"], "--budget nan"),
    (["--budget", "inf"], "--budget inf"),
    (["--methods", "bogus"], "unknown method(s) ['bogus']"),
    (["--methods", "proto", "proto"], "more than once"),
    (["--calibration-steps", "1"], "--calibration-steps 1"),
    (["--min-steps", "0"], "--min-steps 0"),
    (["--margin", "-1"], "--margin -1.0"),
    (["--out", "/proc/no/such/out"], "--out /proc/no/such/out cannot be made"),
])
def test_gpu_table_refuses_bad_arguments_before_any_work(tmp_path, args, words):
    work = tmp_path / "work"
    err = _refused("gpu_table.py", "--bundle", str(tmp_path / "bundle"), "--work", str(work),
                   *(["--out", str(tmp_path / "out")] if "--out" not in args else []), *args)
    assert words in err, err
    assert list(tmp_path.iterdir()) == []  # neither --out nor --work was made


def _stub_data(root: Path) -> Path:
    """A data folder whose files exist (pack reads them only after the checks)."""
    from scripts.gpu_pack import DATA

    data = root / "data"
    for rel in DATA:
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text("")
    return data


@pytest.mark.parametrize(("args", "words"), [
    (["--encoder", "bogus"], "--encoder bogus is not"),
    (["--encoder", "/no/such/folder", "--no-export"], "--encoder /no/such/folder is not"),
    (["--part-size", "-1"], "--part-size -1"),
    (["--budget", "0"], "--budget 0"),
    (["--dest", "/proc/no/such/.gpu", "--encoder", "minilm"],
     "--dest /proc/no/such/.gpu cannot be made"),
])
def test_gpu_pack_refuses_bad_arguments_and_leaves_no_dest(tmp_path, args, words):
    data = _stub_data(tmp_path)
    dest = ["--dest", str(tmp_path / "bundle")] if "--dest" not in args else []
    err = _refused("gpu_pack.py", "--data", str(data), *dest, *args)
    assert words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


@pytest.mark.slow  # exports a tiny encoder (torch)
def test_gpu_pack_that_fails_after_the_export_leaves_no_dest(tmp_path):
    data = _stub_data(tmp_path)
    err = _refused("gpu_pack.py", "--data", str(data), "--dest", str(tmp_path / "bundle"),
                   "--encoder", str(tiny_encoder(tmp_path / "bert")), "--part-size", "100")
    assert "--part-size 100 cuts" in err and "parts" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert", "data"]
