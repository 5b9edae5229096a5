"""Hostile input to the commands: one ``error:`` line (exit 2), nothing written, no garbage.

NaN weights or outputs, relation ids with commas inside parentheses, 1-way settings, control
characters and lone surrogates in names and sentences, out-of-range numbers (seeds, threads,
episodes) and a folder where a file belongs.
"""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from cli import fewrel_submission, predict, score
from cli.files import write_predictions
from cli.text import EscapingStream, lone_surrogate, printable
from model.files.checkpoint import MODEL_FILE
from pipeline.errors import PipelineError
from tests.cli.inputs import RELATIONS, fewrel_record, write_predict_inputs
from tests.cli.inputs import one_error as _one_error
from tests.conftest import project_params
from tests.model.predict.test_predictor import tiny_checkpoint
from tests.model.tiny_regrab import toy_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny checkpoint (also as a models folder), support, queries, FewRel data, params."""
    root = tmp_path_factory.mktemp("hostile_users")
    rows = write_predict_inputs(root)
    fewrel: dict[str, list] = {}
    for r in toy_table(RELATIONS, 6, seed=5).to_pylist():
        fewrel.setdefault(r["relation"], []).append(fewrel_record(r))
    (root / "val.json").write_text(json.dumps(fewrel))
    ckpt = tiny_checkpoint(root)
    folder = root / "models" / "split_0" / "regrab"
    folder.mkdir(parents=True)
    shutil.copy(ckpt, folder / MODEL_FILE)
    (root / "params.yaml").write_text(yaml.safe_dump(project_params(
        evaluate={"episodes": 4, "queries": 2, "device": "cpu"})))
    return {"root": root, "ckpt": ckpt, "support": root / "support.jsonl",
            "queries": root / "queries.jsonl", "val": root / "val.json",
            "models": root / "models", "params": root / "params.yaml", "rows": rows,
            "fewrel": fewrel}


def _argv(files, out, queries=None, support=None):
    return ["--checkpoint", str(files["ckpt"]), "--support", str(support or files["support"]),
            "--queries", str(queries or files["queries"]), "--out", str(out),
            "--device", "cpu"]


def _score_argv(files, out, data=None, *extra):
    return ["--data", str(data or files["val"]), "--models", str(files["models"]),
            "--out", str(out), "--methods", "regrab", "--settings", "3w1s",
            "--params", str(files["params"]), *extra]


def _last_error(capsys, call) -> str:
    """The error line of a command stopped while its progress bar was drawn (the bar is
    closed first, on a line of its own)."""
    with pytest.raises(SystemExit) as exc:
        call()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.endswith("\n"), err
    line = err.splitlines()[-1]
    assert line.startswith("error: "), err
    return line


def _never(*args, **kwargs):
    raise AssertionError("the work started before the input was checked")


# ------------------------------------------------------------- 1. NaN weights and outputs


def test_nan_outputs_stop_predict_naming_the_line(files, tmp_path, capsys, monkeypatch):
    real = predict.Predictor.sample_logits

    def nan_second(self, query):
        logits = real(self, query)
        logits[:, 1] = math.nan  # the second query of the batch
        return logits

    monkeypatch.setattr(predict.Predictor, "sample_logits", nan_second)
    out = tmp_path / "out.jsonl"
    err = _one_error(capsys, lambda: predict.main(_argv(files, out) + ["--threshold", "0.5"]))
    assert "non-finite probabilities (NaN or inf) for 1 of 3 queries" in err
    assert f"{files['queries']} line 2" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_jsonl_is_strict_json(tmp_path):
    row = {"line": 1, "id": None, "text": "t", "prediction": "P6", "best": "P6",
           "confidence": math.nan, "abstain": False, "entropy": 0.0,
           "mutual_information": 0.0, "probabilities": {"P6": math.nan}, "gold": None}
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_predictions([row], ["P6"], tmp_path / "out.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_fewrel_test_nan_probabilities_stop_predict(files, tmp_path, capsys, monkeypatch):
    inputs, _ = fewrel_submission.make_episodes(files["fewrel"], 2, 1, 3, 0)
    data = tmp_path / "test.json"
    data.write_text(json.dumps(inputs))

    def nan_log_probs(logits):
        return torch.full((*logits.shape[:-3], *logits.shape[-2:]), math.nan)

    monkeypatch.setattr(fewrel_submission, "mc_log_probs", nan_log_probs)
    err = _last_error(capsys, lambda: fewrel_submission.main(
        ["predict", "--checkpoint", str(files["ckpt"]), "--input", str(data), "--out",
         str(tmp_path / "pred.json"), "--device", "cpu"]))
    assert "non-finite probabilities" in err and "episode 0" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.json"]


def test_fewrel_test_make_refuses_nan_it_would_write(files, tmp_path, capsys):
    data = tmp_path / "nan.json"
    fewrel = json.loads(json.dumps(files["fewrel"]))
    for records in fewrel.values():
        for record in records:
            record["score"] = math.nan  # json.loads reads a bare NaN; strict readers do not
    data.write_text(json.dumps(fewrel))
    err = _one_error(capsys, lambda: fewrel_submission.main(
        ["make", "--data", str(data), "--ways", "2", "--episodes", "2",
         "--out", str(tmp_path / "t.json"), "--answers", str(tmp_path / "a.json")]))
    assert "would hold NaN or Infinity, which is not JSON" in err and str(data) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.json"]


# -------------------------------------------------------- 2. commas inside parentheses


def test_zero_shot_ids_keep_commas_inside_parentheses(files, tmp_path, capsys):
    assert predict.split_relations("Cause-Effect(e2,e1), P19 ,P27") == [
        "Cause-Effect(e2,e1)", "P19", "P27"]
    assert predict.split_relations("odd(name") == ["odd(name"]  # no comma: one id
    with pytest.raises(PipelineError, match="parentheses do not pair up"):
        predict.split_relations("a(b,c")
    out = tmp_path / "out.jsonl"
    predict.predict_files(_argv(files, out) + ["--zero-shot", "Cause-Effect(e2,e1)",
                                               "--zero-shot", "Other(e1,e2),Instrument"])
    row = json.loads(out.read_text().splitlines()[0])
    assert list(row["probabilities"]) == [*RELATIONS, "Cause-Effect(e2,e1)",
                                          "Other(e1,e2)", "Instrument"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        predict.main(["--help"])
    assert "inside parentheses does not split" in " ".join(capsys.readouterr().out.split())


# ------------------------------------------------------------------- 3. 1-way settings


@pytest.mark.parametrize("settings", ["1w1s", "3w1s,1w5s", "0w1s"])
def test_score_refuses_fewer_than_two_ways(files, tmp_path, capsys, monkeypatch, settings):
    monkeypatch.setattr(score, "score_table", _never)
    err = _one_error(capsys, lambda: score.main(
        [*_score_argv(files, tmp_path / "s"), "--settings", settings]))
    assert "every method would score 100%; give 2 or more ways" in err
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------- 4. control characters


def test_printable_escapes_controls_and_surrogates():
    assert printable("a\x1b[2Jb\x07\x00\r\x7f\x9b\ud800\tc\n") == (
        "a\\x1b[2Jb\\x07\\x00\\x0d\\x7f\\x9b\\ud800\tc\n")
    written = []

    class Sink:
        def write(self, text):
            written.append(text)

    stream = EscapingStream(Sink())
    stream.write("\rbar 50%\r\x1b")  # a progress bar's leading return stays
    assert written == ["\rbar 50%\\x0d\\x1b"]
    assert lone_surrogate({"k": ["\udcff"]}) and lone_surrogate("\ud800")
    pair = json.loads('{"k": "\\ud83d\\ude00"}')  # JSON joins an escaped pair into one
    assert not lone_surrogate(pair) and not lone_surrogate("\U0001f600")


def _predict_on_fds(capfd, argv):
    """``regrab-predict argv`` as its console script runs it (in this process, so torch is
    not imported again); returns the exit code and what reached file descriptors 1 and 2."""
    capfd.readouterr()
    try:
        predict.main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capfd.readouterr()
    return code, out, err


def test_control_characters_never_reach_the_terminal(files, tmp_path, capfd):
    support = tmp_path / "s.jsonl"
    rows = [json.loads(line) for line in files["support"].read_text().splitlines()]
    for row in rows[:2]:
        row["relation"] = "P6\x1b[2J"  # its sentences, under a hostile name
    rows.append({"relation": "P9\x1b]0;owned\x07\x00"})  # NUL only a file can carry
    support.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    run = _argv(files, out, support=support)
    code, stdout, stderr = _predict_on_fds(
        capfd, [*run, "--zero-shot", "Q\x1b[31m", "--name", "Q\x1b[31m=a \x07name"])
    assert code == 0, stderr[-2000:]
    for stream in (stdout, stderr):
        assert not any(c in stream for c in "\x1b\x07\x00")
    assert "P6\\x1b[2J K=2" in stdout and "Q\\x1b[31m K=0" in stdout
    assert "P9\\x1b]0;owned\\x07\\x00 K=0" in stdout
    # The file keeps the names as given (JSON escapes them).
    assert "P6\x1b[2J" in json.loads(out.read_text().splitlines()[0])["probabilities"]
    # An error line naming one is escaped too.
    code, _, stderr = _predict_on_fds(capfd, [*run, "--zero-shot", "P6\x1b[2J"])
    assert code == 2 and stderr.count("\n") == 1, stderr[-2000:]
    assert "\x1b" not in stderr and "relation P6\\x1b[2J has support" in stderr


# ------------------------------------------------------------ 5. types and surrogates


def _bad(files, **fields):
    x = files["rows"][0]
    return {**fewrel_record(x), **fields}


@pytest.mark.parametrize(("record", "words"), [
    ({"tokens": 5}, "'tokens' must be a list of strings, not int"),
    ({"tokens": {"a": 1}}, "'tokens' must be a list of strings, not dict"),
    ({"tokens": [1, 2, 3]}, "'tokens' must be a list of strings; it holds 1"),
    ({"tokens": ["a", "\ud800", "b", "c"]}, "holds a lone surrogate"),
])
def test_sentence_of_wrong_types_or_lone_surrogates(files, tmp_path, capsys, record, words):
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps(_bad(files, **record)) + "\n" + files["queries"].read_text())
    out = tmp_path / "out.jsonl"
    assert predict.predict_files(_argv(files, out, queries))["skipped"] == 1
    assert f"skipped line 1: {words}" in capsys.readouterr().out
    support = tmp_path / "s.jsonl"
    support.write_text(files["support"].read_text()
                       + json.dumps({"relation": "P6", **_bad(files, **record)}) + "\n")
    err = _one_error(capsys, lambda: predict.main(_argv(files, tmp_path / "o2.jsonl",
                                                        support=support)))
    assert f"line {len(support.read_text().splitlines())}: " in err and words in err
    assert not (tmp_path / "o2.jsonl").exists()


def test_lone_surrogates_in_names_and_fields(files, tmp_path, capsys):
    support = tmp_path / "s.jsonl"
    support.write_text(files["support"].read_text() + '{"relation": "P\\ud800"}\n')
    out = tmp_path / "out.jsonl"
    err = _one_error(capsys, lambda: predict.main(_argv(files, out, support=support)))
    assert "lone surrogate" in err and "line 7" in err
    # An undecodable byte on the command line arrives as a lone surrogate.
    for flag in (["--zero-shot", "P\udcff"], ["--name", "P6=\udcff"]):
        err = _one_error(capsys, lambda flag=flag: predict.main(_argv(files, out) + flag))
        assert "'P\\udcff'" in err or "'P6=\\udcff'" in err
        assert "is not valid text" in err
    queries = tmp_path / "q.jsonl"
    queries.write_text(files["queries"].read_text().rstrip("\n")[:-1]
                       + ', "id": "\\udc80"}\n')  # the last query's id
    assert predict.predict_files(_argv(files, out, queries))["skipped"] == 1
    assert "skipped line 3: holds a lone surrogate" in capsys.readouterr().out
    assert not list(tmp_path.glob(".*.tmp"))
    # FewRel's test input reaches the sentence parser itself.
    episodes = json.loads(json.dumps(
        fewrel_submission.make_episodes(files["fewrel"], 2, 1, 2, 0)[0]))
    episodes[1]["meta_test"]["tokens"][0] = "\ud800"
    test = tmp_path / "test.json"
    test.write_text(json.dumps(episodes))
    err = _one_error(capsys, lambda: fewrel_submission.main(
        ["--checkpoint", str(files["ckpt"]), "--input", str(test), "--out",
         str(tmp_path / "p.json"), "--device", "cpu"]))
    assert "episode 1 meta_test: token 0 '\\ud800' holds a lone surrogate" in err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("where", ["token", "relation"])
def test_score_refuses_lone_surrogates(files, tmp_path, capsys, monkeypatch, where):
    monkeypatch.setattr(score, "score_table", _never)
    data = json.loads(json.dumps(files["fewrel"]))
    if where == "token":
        data["P7"][2]["tokens"][0] = "\ud800"
    else:
        data["P\udfff"] = data.pop("P8")
    path = tmp_path / "own.json"
    path.write_text(json.dumps(data))
    err = _one_error(capsys, lambda: score.main(_score_argv(files, tmp_path / "s", path)))
    assert "holds a lone surrogate" in err
    assert ("record 2 of relation 'P7'" if where == "token" else "relation 'P\\udfff'") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own.json"]


# ------------------------------------------------------------------ 5. out-of-range numbers


@pytest.mark.parametrize(("extra", "words"), [
    (["--seed", str(2**70)], f"--seed {2**70} is out of range; give a seed from 0 to"),
    (["--seed", "-1"], "--seed -1 is out of range"),
    (["--threads", "100000"], "--threads 100000: give 0 (torch's default) or 1 to"),
    (["--threads", "-2"], "--threads -2: give 0"),
])
def test_predict_numbers_out_of_range(files, tmp_path, capsys, monkeypatch, extra, words):
    monkeypatch.setattr(predict.Predictor, "from_checkpoint", _never)
    err = _one_error(capsys, lambda: predict.main(_argv(files, tmp_path / "o.jsonl") + extra))
    assert words in err
    assert list(tmp_path.iterdir()) == []


def test_fewrel_test_numbers_out_of_range(files, tmp_path, capsys):
    def make(*extra):
        return lambda: fewrel_submission.main(["make", "--data", str(files["val"]), "--out",
                                         str(tmp_path / "t.json"), "--answers",
                                         str(tmp_path / "a.json"), "--ways", "2", *extra])

    assert "--seed -1 is out of range" in _one_error(capsys, make("--seed", "-1"))
    err = _one_error(capsys, make("--episodes", str(10**12)))
    assert f"--episodes {10**12} would need about" in err and "give at most" in err
    test = tmp_path / "test.json"
    test.write_text(json.dumps(fewrel_submission.make_episodes(files["fewrel"], 2, 1, 2, 0)[0]))
    for extra, words in ((["--seed", str(2**70)], "out of range"),
                         (["--threads", "100000"], "--threads 100000"),
                         (["--batch-size", "0"], "--batch-size must be >= 1")):
        err = _one_error(capsys, lambda extra=extra: fewrel_submission.main(
            ["predict", "--checkpoint", str(files["ckpt"]), "--input", str(test), "--out",
             str(tmp_path / "p.json"), "--device", "cpu", *extra]))
        assert words in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.json"]


def test_score_episodes_beyond_memory_stop_before_drawing(files, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.setattr(score, "score_table", _never)
    err = _one_error(capsys, lambda: score.main(
        _score_argv(files, tmp_path / "s", None, "--episodes", str(10**12))))
    assert f"--episodes {10**12} would need about" in err and "give at most" in err
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(project_params(
        evaluate={"episodes": 10**12, "queries": 2, "device": "cpu"})))
    err = _one_error(capsys, lambda: score.main(
        [*_score_argv(files, tmp_path / "s"), "--params", str(params)]))
    assert f"{params} evaluate.episodes {10**12} would need" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_a_folder_where_a_file_belongs(files, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(score, "score_table", _never)
    for flag in ("--params", "--data"):
        err = _one_error(capsys, lambda flag=flag: score.main(
            [*_score_argv(files, tmp_path / "s"), flag, str(tmp_path)]))
        assert f"{flag} {tmp_path} is a folder; give a file" in err
    err = _one_error(capsys, lambda: fewrel_submission.main(
        ["score", "--pred", str(tmp_path), "--answers", str(files["val"])]))
    assert f"--pred {tmp_path} is a folder" in err
    assert list(tmp_path.iterdir()) == []
