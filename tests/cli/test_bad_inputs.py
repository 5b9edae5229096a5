"""Bad input to regrab-predict and regrab-score: one ``error:`` line, exit 2, nothing written."""

import io
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli import predict, score
from model.files.checkpoint import MODEL_FILE
from tests.cli.inputs import one_error as _one_error
from tests.cli.inputs import write_predict_inputs
from tests.conftest import project_params
from tests.model.predict.test_predictor import tiny_checkpoint
from tests.model.tiny_regrab import toy_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny checkpoint, a 3-way 2-shot support file and three good queries."""
    root = tmp_path_factory.mktemp("bad_cli")
    rows = write_predict_inputs(root)
    return {"root": root, "ckpt": tiny_checkpoint(root), "support": root / "support.jsonl",
            "queries": root / "queries.jsonl", "rows": rows}


def _argv(files, out, queries=None, support=None):
    return ["--checkpoint", str(files["ckpt"]), "--support", str(support or files["support"]),
            "--queries", str(queries or files["queries"]), "--out", str(out),
            "--device", "cpu"]


# --------------------------------------------------------------------- span positions (8)


@pytest.mark.parametrize("bad", ["0", 0.5, True])
def test_span_positions_must_be_integers(files, capsys, tmp_path, bad):
    x = files["rows"][0]
    fewrel = {"tokens": x["tokens"], "h": ["h", "Q1", [[bad]]],
              "t": ["t", "Q2", [list(range(x["tail_start"], x["tail_end"]))]]}
    columns = {"tokens": x["tokens"], "head_start": bad, "head_end": x["head_end"],
               "tail_start": x["tail_start"], "tail_end": x["tail_end"]}
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps(fewrel) + "\n" + json.dumps(columns) + "\n")
    out = tmp_path / "out.jsonl"
    err = _one_error(capsys, lambda: predict.main(_argv(files, out, queries)))
    assert "none of the 2 queries" in err and "not an integer token index" in err
    assert not out.exists()
    # In the support file the same record stops the run, naming its line.
    support = tmp_path / "s.jsonl"
    support.write_text(files["support"].read_text() + json.dumps({"relation": "P6", **fewrel})
                       + "\n")
    err = _one_error(capsys, lambda: predict.main(_argv(files, out, support=support)))
    assert f"line {len(support.read_text().splitlines())}" in err
    assert "not an integer token index" in err


# ------------------------------------------------------------------ --device gpu (5)


def test_device_gpu_is_named_not_a_corrupt_checkpoint(files, capsys, tmp_path):
    out = tmp_path / "out.jsonl"
    err = _one_error(capsys, lambda: predict.main(_argv(files, out) + ["--device", "gpu"]))
    assert "--device 'gpu' is not a device" in err and "auto, cpu, cuda" in err
    assert "corrupt" not in err and not out.exists()


# ------------------------------------------------------------- files and outputs (9)


def test_output_format_is_refused_before_predicting(files, capsys, tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before --out was checked")

    monkeypatch.setattr(predict.Predictor, "from_checkpoint", never)
    err = _one_error(capsys, lambda: predict.main(_argv(files, tmp_path / "p.csv")))
    assert "extension .csv" in err


def test_output_folder_that_cannot_be_written(files, capsys, tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before --out was checked")

    monkeypatch.setattr(predict.Predictor, "from_checkpoint", never)
    for out in ("/proc/x/out.jsonl", "/dev/null/out.jsonl"):
        err = _one_error(capsys, lambda out=out: predict.main(_argv(files, out)))
        assert f"output {out} cannot be written" in err
    assert not Path("/proc/x").exists()


def test_deeply_nested_json_line_is_skipped_and_counted(files, capsys, tmp_path):
    queries = tmp_path / "q.jsonl"
    queries.write_text("[" * 100_000 + "]" * 100_000 + "\n" + files["queries"].read_text())
    out = tmp_path / "out.jsonl"
    assert predict.predict_files(_argv(files, out, queries))["skipped"] == 1
    printed = capsys.readouterr().out
    assert "skipped line 1: JSON nested too deeply" in printed
    assert len(out.read_text().splitlines()) == 3
    support = tmp_path / "s.jsonl"
    support.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    err = _one_error(capsys, lambda: predict.main(_argv(files, out, support=support)))
    assert "nested too deeply" in err


def test_fewrel_file_as_queries_names_the_format(files, capsys, tmp_path):
    x = files["rows"][0]
    record = {"tokens": x["tokens"], "h": ["h", "Q1", [[x["head_start"]]]],
              "t": ["t", "Q2", [[x["tail_start"]]]]}
    for name, text in (("one_line.json", json.dumps({"P6": [record, record]})),
                       ("indented.json", json.dumps({"P6": [record], "P7": []}, indent=2))):
        (tmp_path / name).write_text(text + "\n")
        err = _one_error(capsys, lambda name=name: predict.main(
            _argv(files, tmp_path / "out.jsonl", tmp_path / name)))
        assert "is a FewRel-format file" in err and "regrab-score" in err
        assert "record has no sentence" not in err


def test_write_failure_is_one_line_and_leaves_no_file(files, tmp_path, capsys):
    """Disk full or ``ulimit -f``: the JSONL does not fit in 100 bytes (a real file-size limit
    on this process while the command runs; Python ignores SIGXFSZ, so the write fails)."""
    out = tmp_path / "out.jsonl"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    capsys.readouterr()
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, hard))
    try:
        with pytest.raises(SystemExit) as exc:
            predict.main(_argv(files, out))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert exc.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: a write failed (File too large)") and "ulimit -f" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ------------------------------------------------------------------------- regrab-score


@pytest.fixture(scope="module")
def models(files):
    """One untrained checkpoint as a benchmark's models folder, and params to score with."""
    root = files["root"]
    folder = root / "models" / "split_0" / "regrab"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(files["ckpt"], folder / MODEL_FILE)
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump(project_params(
        evaluate={"episodes": 4, "queries": 2, "device": "cpu"})))
    return root / "models", params


def _score(models, data, out, *extra):
    folder, params = models
    return score.score(["--data", str(data), "--models", str(folder), "--out", str(out),
                        "--methods", "regrab", "--settings", "3w1s", "--params", str(params),
                        *extra])


def test_score_own_file_that_is_not_json_names_no_pipeline_fix(models, capsys, tmp_path):
    data = tmp_path / "mine.json"
    data.write_text('{"works_for": [{"tokens": ["a"], ')
    err = _one_error(capsys, lambda: score.main(
        ["--data", str(data), "--models", str(models[0]), "--out", str(tmp_path / "o"),
         "--params", str(models[1])]))
    assert f"{data} is not valid JSON" in err and "FewRel-format" in err
    assert "dvc repro" not in err and "re-fetch" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json"]


def test_score_counts_a_relation_given_with_no_sentences(models, tmp_path, capsys):
    rows = toy_table(["P6", "P7", "P8"], 6, seed=5).to_pylist()
    data = {}
    for r in rows:
        data.setdefault(r["relation"], []).append(
            {"tokens": r["tokens"], "h": ["h", "Q1", [list(range(r["head_start"],
                                                                  r["head_end"]))]],
             "t": ["t", "Q2", [list(range(r["tail_start"], r["tail_end"]))]]})
    data["P9"] = []
    path = tmp_path / "own.json"
    path.write_text(json.dumps(data))
    result = _score(models, path, tmp_path / "scores")  # own.json is --data
    assert result["relations"]["too_few_sentences"] == {"P9": 0}
    assert "skipped 1 with < 3 sentences" in capsys.readouterr().out
    report = json.loads((tmp_path / "scores_report.json").read_text())
    assert report["relations"]["too_few_sentences"] == {"P9": 0}


def test_score_refuses_a_relation_given_twice(models, tmp_path, capsys):
    rows = toy_table(["P6", "P7", "P8"], 6, seed=5).to_pylist()
    data: dict[str, list[str]] = {}
    for r in rows:
        data.setdefault(r["relation"], []).append(json.dumps(
            {"tokens": r["tokens"], "h": ["h", "Q1", [list(range(r["head_start"],
                                                                  r["head_end"]))]],
             "t": ["t", "Q2", [list(range(r["tail_start"], r["tail_end"]))]]}))
    # P6 with its six sentences, then again with one: json kept the one, silently.
    text = ", ".join(f'"{k}": [{", ".join(v)}]' for k, v in data.items())
    path = tmp_path / "own.json"
    path.write_text("{" + text + f', "P6": [{data["P6"][0]}]' + "}")
    err = _one_error(capsys, lambda: score.main(
        ["--data", str(path), "--models", str(models[0]), "--out", str(tmp_path / "s"),
         "--methods", "regrab", "--settings", "3w1s", "--params", str(models[1])]))
    assert f"{path}: key 'P6' is given twice" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own.json"]


def test_score_output_folder_that_cannot_be_written(models, capsys, tmp_path):
    data = tmp_path / "own.json"
    data.write_text("{}")
    err = _one_error(capsys, lambda: score.main(
        ["--data", str(data), "--models", str(models[0]), "--out", "/proc/x/own",
         "--params", str(models[1])]))
    assert "cannot be written" in err


# ------------------------------------------------------------- literal entity markers


@pytest.mark.parametrize("token", ["[E1]", "[e2]Bob[/E2]", "x[/E1]"])
def test_tokens_holding_an_entity_marker_are_refused(files, capsys, tmp_path, token):
    x = files["rows"][0]
    tokens = [*x["tokens"], token]
    fewrel = {"tokens": tokens, "h": ["h", "Q1", [list(range(x["head_start"], x["head_end"]))]],
              "t": ["t", "Q2", [list(range(x["tail_start"], x["tail_end"]))]]}
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps(fewrel) + "\n")
    out = tmp_path / "out.jsonl"
    err = _one_error(capsys, lambda: predict.main(_argv(files, out, queries)))
    assert "none of the 1 queries" in err and "holds the entity marker" in err
    assert not out.exists()
    support = tmp_path / "s.jsonl"
    support.write_text(files["support"].read_text() + json.dumps({"relation": "P6", **fewrel})
                       + "\n")
    err = _one_error(capsys, lambda: predict.main(_argv(files, out, support=support)))
    assert f"token {len(tokens) - 1} {token!r} holds the entity marker" in err
    assert "remove it from the tokens" in err


# ------------------------------------------------------------ lists that name nothing


@pytest.mark.parametrize("value", [",,,", "", " , "])
def test_zero_shot_naming_nothing_is_refused(files, capsys, tmp_path, value):
    out = tmp_path / "out.jsonl"
    err = _one_error(capsys, lambda: predict.main([*_argv(files, out), "--zero-shot", value]))
    assert f"--zero-shot {value!r} names no relation" in err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--methods", "--settings"])
def test_score_lists_naming_nothing_are_refused(models, capsys, tmp_path, flag):
    data = tmp_path / "own.json"
    data.write_text("{}")
    err = _one_error(capsys, lambda: score.main(
        ["--data", str(data), "--models", str(models[0]), "--out", str(tmp_path / "o"),
         "--params", str(models[1]), flag, ",,,"]))
    assert f"{flag} ',,,' names nothing" in err and f"leave {flag} out" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own.json"]


# --------------------------------------------------------------- a FIFO as an input


def test_relations_on_a_fifo_nobody_writes_to_is_refused(files, models, capsys, tmp_path):
    fifo = tmp_path / "names.json"
    os.mkfifo(fifo)
    data = tmp_path / "own.json"
    data.write_text("{}")
    err = _one_error(capsys, lambda: score.main(
        ["--data", str(data), "--models", str(models[0]), "--out", str(tmp_path / "o"),
         "--params", str(models[1]), "--relations", str(fifo)]))
    assert f"--relations {fifo} is not a regular file" in err
    err = _one_error(capsys, lambda: predict.main(
        [*_argv(files, tmp_path / "p.jsonl"), "--relations", str(fifo)]))
    assert f"--relations {fifo} is not a regular file" in err


# ------------------------------------------------------------- an ASCII-only terminal


def test_summary_on_an_ascii_terminal_escapes_what_it_cannot_print(files, tmp_path,
                                                                     monkeypatch):
    support = tmp_path / "s.jsonl"
    support.write_text(files["support"].read_text().replace('"P6"', '"Pé→"'))
    out = tmp_path / "out.jsonl"
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="ascii", errors="strict", write_through=True)
    monkeypatch.setattr(sys, "stdout", stdout)
    predict.main(_argv(files, out, support=support))
    stdout.flush()
    printed = raw.getvalue().decode("ascii")
    assert "P\\xe9\\u2192" in printed and "wrote 3 rows" in printed
    assert "Pé→" in out.read_text(encoding="utf-8")


# ------------------------------------------------- a checkpoint of a billion Langevin steps


@pytest.mark.slow
def test_a_checkpoint_of_a_billion_steps_answers_or_says_what_it_would_cost(files, capsys,
                                                                              tmp_path):
    import signal

    # 10^12 steps: past a week of this machine's time however fast it is (10^9 steps of the
    # tiny model's softmax chain take about a day on an idle core, under the week's bound).
    gaussian = tiny_checkpoint(files["root"], steps=10**12)
    out = tmp_path / "out.jsonl"
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("no answer")))
    signal.alarm(120)  # the chain stops at its fixed point: seconds, not hours
    try:
        predict.main(_argv({**files, "ckpt": gaussian}, out))
        assert len(out.read_text().splitlines()) == 3
        softmax = tiny_checkpoint(files["root"], steps=10**12, likelihood="softmax")
        err = _one_error(capsys, lambda: predict.main(_argv({**files, "ckpt": softmax},
                                                            tmp_path / "o2.jsonl")))
    finally:
        signal.alarm(0)
    assert "this checkpoint's posterior (1,000,000,000,000 Langevin steps per chain) would take " \
           "about" in err and "measured here" in err and "fewer model.langevin.steps" in err
    assert not (tmp_path / "o2.jsonl").exists()


@pytest.mark.parametrize(("model", "git", "says"), [
    ("regrab", False, "is not inside a git repository, so it has no model registry"),
    ("regrab", True, "no version of regrab is assigned to prod"),
    ("regrab@v9.0.0", True, "regrab@v9.0.0 is not registered (versions: none)"),
    ("regrab#prod:nyt25/split_0", True, "is not one the registry reads"),
])
def test_a_version_that_cannot_be_had_is_one_line(files, capsys, tmp_path, monkeypatch, model,
                                                  git, says):
    if git:
        subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    argv = _argv(files, tmp_path / "out.jsonl")
    argv[1] = model
    assert says in _one_error(capsys, lambda: predict.main(argv))
    assert sorted(p.name for p in tmp_path.iterdir()) == ([".git"] if git else [])


# ------------------------------------------------------------------ symbolic link loops


@pytest.mark.parametrize("flag", ["--out", "--support-scores", "--support", "--queries"])
def test_a_path_that_is_a_looping_link_is_one_line(files, capsys, tmp_path, monkeypatch, flag):
    monkeypatch.setattr(predict.Predictor, "from_checkpoint", _never_loaded)
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)  # resolve() raised RuntimeError: a traceback
    argv = {"--out": _argv(files, loop), "--support": _argv(files, tmp_path / "o.jsonl",
                                                            support=loop),
            "--queries": _argv(files, tmp_path / "o.jsonl", queries=loop),
            "--support-scores": [*_argv(files, tmp_path / "o.jsonl"), flag, str(loop)]}[flag]
    err = _one_error(capsys, lambda: predict.main(argv))
    assert f"{loop} is a symbolic link that loops" in err and "remove the link" in err
    assert loop.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["loop.jsonl"]


def test_export_of_a_looping_link_is_one_line(files, capsys, tmp_path):
    from cli import models

    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    for argv in (["export", str(a), "--out", str(tmp_path / "m"), "--no-encoder"],
                 ["export", str(files["ckpt"]), "--out", str(a), "--no-encoder"],
                 ["convert", str(files["ckpt"]), "--out", str(a)]):
        err = _one_error(capsys, lambda argv=argv: models.main(argv))
        assert f"{a} is a symbolic link that loops" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def _never_loaded(*args, **kwargs):
    raise AssertionError("the checkpoint was loaded before the paths were checked")
