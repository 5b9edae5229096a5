"""Bad input and a full disk in the stages: one ``error:`` line, exit 2, nothing half-written."""

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestration.overrides import resolve
from pipeline.errors import PipelineError, run_cli
from pipeline.io import write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA
from stages import evaluate, split_nyt, train
from tests.conftest import fewrel_record, project_params
from tests.model.tiny_regrab import labels_of, toy_project, toy_table

ROOT = Path(__file__).resolve().parents[2]
TRAIN = {"methods": ["proto"], "steps": 2, "ways": [2], "shots": [1], "queries": 2,
         "val_every": 2, "val_episodes": 3, "val_settings": ["2w1s"], "dvclive": False,
         "device": "cpu"}
EVALUATE = {"methods": ["proto"], "settings": ["2w1s", "3w1s"], "episodes": 4, "queries": 2,
            "floor": False, "device": "cpu", "nota_rates": []}
OUTPUTS = ["metrics/nyt25.json", "metrics/nyt25_report.json", "metrics/nyt25.md",
           "plots/nyt25.png", "plots/nyt25_reliability.png", "plots/nyt25_selective.csv"]


def run_limited(args: list[str], max_bytes: int | None = None) -> subprocess.CompletedProcess:
    """``python -m ARGS`` from the project root, with files limited to ``max_bytes``."""

    def limit():
        if max_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, preexec_fn=limit)


def run_limited_here(capsys, module, args: list[str],
                     max_bytes: int) -> subprocess.CompletedProcess:
    """:func:`run_limited` for a stage that imports torch: run in this process, as its
    ``python -m`` entry does (:func:`run_cli`), under the same file-size limit, set and then
    restored (Python ignores SIGXFSZ, so the write fails as in a child)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    capsys.readouterr()
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, hard))
    try:
        run_cli(module.main, args)
        code = 0
    except SystemExit as exc:
        code = exc.code
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def assert_no_room_line(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    # A progress bar ends in a carriage return, so the error line starts at the left.
    lines = [ln.rsplit("\r", 1)[-1] for ln in done.stderr.split("\n") if ln.strip()]
    assert lines[-1].startswith("error: a write failed (File too large)"), lines[-5:]
    assert "ulimit -f" in lines[-1] and "Traceback" not in done.stderr


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*"))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """Toy splits, graph and params, one trained proto model, and its evaluation."""
    root = tmp_path_factory.mktemp("bad_stages")
    enc, splits, graph, features = toy_project(root)
    params = project_params(model={"encoder": {"name": str(enc), "train_layers": 1}},
                            train=TRAIN, evaluate=EVALUATE)
    p = root / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    train_args = ["--splits", str(splits), "--graph", str(graph), "--features", str(features),
                  "--relations", str(labels_of(graph)), "--out", str(root / "models")]
    train.main([*train_args, "--params", str(p)])
    evaluate.main(evaluate_args(root, splits, p))
    return {"root": root, "splits": splits, "params": params, "train_args": train_args}


def evaluate_args(root: Path, splits: Path, params: Path) -> list[str]:
    return ["--splits", str(splits), "--models", str(root / "models"),
            "--metrics", str(root / "metrics" / "nyt25.json"),
            "--plot", str(root / "plots" / "nyt25.png"), "--params", str(params)]


def with_params(project, tmp_path, **sections) -> Path:
    params = project["params"]
    for name, values in sections.items():
        params = {**params, name: {**params[name], **values}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def outputs(root: Path) -> dict[str, bytes]:
    return {name: (root / name).read_bytes() for name in OUTPUTS}


# ------------------------------------------------------------ write failures (1)


def test_split_nyt_prepare_and_parse_end_in_one_line_when_the_disk_is_full(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    records = {f"P{i}": [fewrel_record(["a", "b", "c", "d"] * 8, [0], [2])] * 30
               for i in range(1, 9)}
    (raw / "val_nyt.json").write_text(json.dumps(records))
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(project_params(
        prepare_fewshot={"datasets": ["val_nyt"]},
        split_nyt={"seeds": [1, 2], "train_relations": 3, "val_relations": 2,
                   "test_relations": 3, "min_instances": 5})))
    prepare = ["stages.prepare_fewshot", "--raw", str(raw), "--out", str(tmp_path / "fewshot"),
               "--params", str(params)]
    assert_no_room_line(run_limited(prepare, 2000))
    assert not (tmp_path / "fewshot").exists() and hidden(tmp_path) == []
    assert run_limited(prepare).returncode == 0
    split = ["stages.split_nyt", "--data", str(tmp_path / "fewshot" / "val_nyt.parquet"),
             "--out", str(tmp_path / "splits"), "--params", str(params)]
    assert_no_room_line(run_limited(split, 2000))
    assert not (tmp_path / "splits").exists() and hidden(tmp_path) == []
    triples = tmp_path / "triples.tsv"
    triples.write_text("".join(f"Q{i}\tP{i % 7}\tQ{i + 1}\n" for i in range(3000)))
    parse = ["stages.parse_wikidata", "--out", str(tmp_path / "wd" / "triples.parquet"),
             "--workers", "0", "--no-progress", str(triples)]
    assert_no_room_line(run_limited(parse, 2000))
    assert not (tmp_path / "wd" / "triples.parquet").exists()


def test_train_write_failure_is_one_line_and_leaves_no_checkpoint(project, tmp_path, capsys):
    p = with_params(project, tmp_path)
    args = [*project["train_args"][:-1], str(tmp_path / "models"), "--params", str(p)]
    assert_no_room_line(run_limited_here(capsys, train, args, 4000))
    folder = tmp_path / "models" / "split_0" / "proto"
    assert not any(folder.glob("*.safetensors")) and hidden(tmp_path / "models") == []


def test_evaluate_write_failure_keeps_every_old_output(project, tmp_path, capsys):
    root = project["root"]
    before = outputs(root)
    p = with_params(project, tmp_path, evaluate={"episodes": 6})  # other numbers
    # The metrics JSON fits in 20 kB, the plots do not: all six stay as they were.
    assert_no_room_line(run_limited_here(capsys, evaluate, evaluate_args(root, project["splits"],
                                                                         p), 20_000))
    assert outputs(root) == before
    assert hidden(root / "metrics") == [] and hidden(root / "plots") == []


# ------------------------------------------------------------------ bad params (5, 6)


def test_device_gpu_is_one_line_naming_the_key(project, tmp_path):
    p = with_params(project, tmp_path, train={"device": "gpu"}, evaluate={"device": "gpu"})
    with pytest.raises(PipelineError,
                       match=r"params.yaml train.device = 'gpu': expected auto, cpu, cuda"):
        train.main([*project["train_args"][:-1], str(tmp_path / "models"), "--params", str(p)])
    assert not (tmp_path / "models").exists()
    with pytest.raises(PipelineError,
                       match=r"params.yaml evaluate.device = 'gpu': expected auto, cpu, cuda"):
        evaluate.main(evaluate_args(tmp_path, project["splits"], p))
    assert not (tmp_path / "metrics").exists() and not (tmp_path / "plots").exists()


def test_empty_evaluate_settings_are_refused_before_any_output(project, tmp_path):
    p = with_params(project, tmp_path, evaluate={"settings": []})
    shutil.copytree(project["root"] / "models", tmp_path / "models")
    with pytest.raises(PipelineError, match="evaluate.settings is empty"):
        evaluate.main(evaluate_args(tmp_path, project["splits"], p))
    assert not (tmp_path / "metrics").exists() and not (tmp_path / "plots").exists()
    # The flow checks an override the same way, before any stage runs.
    with pytest.raises(PipelineError, match="-S evaluate.settings=.*evaluate.settings is empty"):
        resolve(ROOT / "params.yaml", {"evaluate.settings": "[]"})


def test_zero_shot_settings_with_no_zero_shot_method_is_nothing_to_train(project, tmp_path):
    p = with_params(project, tmp_path, train={"per_setting": ["5w0s"], "methods": ["proto"]})
    with pytest.raises(PipelineError, match="nothing to train") as err:
        train.main([*project["train_args"][:-1], str(tmp_path / "models"), "--params", str(p)])
    assert "regrab" in str(err.value) and "\n" not in str(err.value)
    assert not list((tmp_path / "models").rglob("*.json"))


# ------------------------------------------------------------ another split's test (7)


def test_test_file_of_another_split_is_refused(project, tmp_path):
    other = tmp_path / "splits"
    shutil.copytree(project["splits"], other)
    # Train and val files as trained on; test.parquet holding two training relations.
    write_parquet(toy_table(["P1", "P2", "P6"], 12, seed=7), other / "split_0" / "test.parquet",
                  FEWSHOT_SCHEMA)
    shutil.copytree(project["root"] / "models", tmp_path / "models")
    with pytest.raises(PipelineError) as err:
        evaluate.main(evaluate_args(tmp_path, other, project["root"] / "params.yaml"))
    message = str(err.value)
    assert "['P1', 'P2']" in message and "test.parquet" in message and "--splits" in message
    assert not (tmp_path / "metrics").exists()


# ---------------------------------------------------------------- spans in split_nyt (8)


def test_split_nyt_refuses_a_span_outside_its_sentence(tmp_path):
    rows = toy_table([f"P{i}" for i in range(1, 9)], 6, seed=1).to_pylist()
    rows[7]["head_start"], rows[7]["head_end"] = 1_000_000, 1_000_001
    import pyarrow as pa

    data = tmp_path / "nyt.parquet"
    write_parquet(pa.Table.from_pylist(rows, schema=FEWSHOT_SCHEMA), data, FEWSHOT_SCHEMA)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(project_params(split_nyt={
        "seeds": [1], "train_relations": 3, "val_relations": 2, "test_relations": 3,
        "min_instances": 2})))
    with pytest.raises(PipelineError) as err:
        split_nyt.main(["--data", str(data), "--out", str(tmp_path / "splits"),
                        "--params", str(params)])
    message = str(err.value)
    assert rows[7]["instance_id"] in message and "head [1000000, 1000001)" in message
    assert "rebuild it" in message and not (tmp_path / "splits").exists()


# ------------------------------------------------------------ stale temporaries (11)


def test_evaluate_removes_its_stale_temporaries_only(project, tmp_path):
    shutil.copytree(project["root"] / "models", tmp_path / "models")
    stale = [tmp_path / "metrics" / ".nyt25.json.k1ll3d.tmp",
             tmp_path / "metrics" / "..nyt25.json.k1ll3d.tmp.a1b2.tmp",
             tmp_path / "plots" / ".nyt25_reliability.png.x9.tmp"]
    other = tmp_path / "metrics" / ".fewrel.json.live.tmp"  # another stage's write
    for path in [*stale, other]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    evaluate.main(evaluate_args(tmp_path, project["splits"], project["root"] / "params.yaml"))
    assert not any(path.exists() for path in stale)
    assert other.exists() and (tmp_path / "metrics" / "nyt25.json").exists()
