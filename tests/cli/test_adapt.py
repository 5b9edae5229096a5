"""``regrab-adapt``: a user's sentences in, an adapted checkpoint out; bad input is one
``error:`` line with nothing written, and an interrupted run leaves no file behind."""

import hashlib
import json

import pytest

from cli import adapt as command
from model.files.loader import load_model
from model.files.model_folder import adaptation_lines
from tests.model.predict.test_predictor import tiny_checkpoint
from tests.model.tiny_regrab import toy_table


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapt_cli")
    rows = toy_table(["P1", "P2", "P3"], 6, seed=4).to_pylist()
    marked = root / "domain.jsonl"
    marked.write_text("".join(json.dumps({k: r[k] for k in (
        "tokens", "head_start", "head_end", "tail_start", "tail_end")}) + "\n" for r in rows))
    plain = root / "plain.txt"  # no markers: two words are drawn as entities
    plain.write_text("".join(" ".join(r["tokens"]) + "\n" for r in rows))
    return {"root": root, "ckpt": tiny_checkpoint(root), "marked": marked, "plain": plain}


def _argv(files, sentences, out, *extra):
    return ["--checkpoint", str(files["ckpt"]), "--sentences", str(sentences), "--out",
            str(out), "--device", "cpu", "--steps", "2", "--batch-size", "4", *extra]


def _one_error(capsys, call) -> str:
    with pytest.raises(SystemExit) as exc:
        call()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


@pytest.mark.parametrize("source", ["marked", "plain"])
def test_adapts_and_writes_a_checkpoint_that_loads(files, source, tmp_path, capsys):
    out = tmp_path / "adapted.safetensors"
    record = command.run(_argv(files, files[source], out))
    printed = capsys.readouterr()
    assert "adapted by masked to 18 sentences" in printed.out
    assert "estimate: about" in printed.err
    assert ("no entity markers" in printed.err) == (source == "plain")
    _, ckpt = load_model(out)
    stored = ckpt.summary["adaptation"][-1]
    assert stored["digest"] == record["digest"] and stored["steps"] == 2
    assert any("`masked` on 18 sentences" in line
               for line in adaptation_lines(ckpt.summary["adaptation"]))


def test_an_empty_file_is_one_line(files, tmp_path, capsys):
    empty, out = tmp_path / "empty.txt", tmp_path / "out.safetensors"
    empty.write_text("\n\n")
    err = _one_error(capsys, lambda: command.main(_argv(files, empty, out)))
    assert "has no sentences" in err and not out.exists()


def test_an_unreadable_file_is_one_line(files, tmp_path, capsys):
    out = tmp_path / "out.safetensors"
    err = _one_error(capsys, lambda: command.main(_argv(files, tmp_path, out)))
    assert "extension" in err or "folder" in err
    binary = tmp_path / "bad.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    err = _one_error(capsys, lambda: command.main(_argv(files, binary, out)))
    assert "not readable UTF-8" in err and not out.exists()


def test_a_sentence_over_the_encoders_length_is_one_line_or_skipped(files, tmp_path, capsys):
    long = tmp_path / "long.txt"
    long.write_text(files["plain"].read_text() + " ".join(["w1"] * 300) + "\n")
    out = tmp_path / "out.safetensors"
    err = _one_error(capsys, lambda: command.main(_argv(files, long, out)))
    assert "longer than the encoder's" in err and "--skip-long" in err and not out.exists()
    record = command.run(_argv(files, long, out, "--skip-long"))
    assert record["sentences"] == 18 and record["skipped"] == 1 and out.exists()


def test_a_budget_that_cannot_fit_one_step_is_one_line(files, tmp_path, capsys):
    out = tmp_path / "out.safetensors"
    err = _one_error(capsys, lambda: command.main(
        _argv(files, files["marked"], out, "--minutes", "1e-6")))
    assert "cannot fit one step" in err and "--minutes" in err and not out.exists()


@pytest.mark.parametrize("bad", [["--minutes", "-1"], ["--lr", "0"], ["--seed", "-1"],
                                 ["--share", "0"], ["--share", "1.5"]])
def test_bad_numbers_are_one_line(files, tmp_path, capsys, bad):
    out = tmp_path / "out.safetensors"
    _one_error(capsys, lambda: command.main(_argv(files, files["marked"], out, *bad)))
    assert not out.exists()


def test_an_output_over_an_input_is_refused(files, tmp_path, capsys):
    err = _one_error(capsys, lambda: command.main(_argv(files, files["marked"], files["ckpt"])))
    assert "--out" in err
    err = _one_error(capsys, lambda: command.main(
        _argv(files, files["marked"], tmp_path / "out.jsonl")))
    assert ".safetensors" in err


def test_an_interrupted_adaptation_leaves_no_file(files, tmp_path, capsys, monkeypatch):
    import model.adapt.run as run

    calls = []
    step = run._step

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:  # the timing step, one real step, then Ctrl-C
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    monkeypatch.setattr(run, "_step", interrupted)
    out = tmp_path / "out.safetensors"
    with pytest.raises(SystemExit) as exc:
        command.main(_argv(files, files["marked"], out, "--steps", "5"))
    assert exc.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: ")
    assert list(tmp_path.iterdir()) == []


def _relations(root, texts):
    path = root / "relations.json"
    path.write_text(json.dumps(texts))
    return path


def test_pseudo_reads_the_relations_and_records_their_file(files, tmp_path, capsys):
    rel = _relations(tmp_path, {"R1": ["verb1", "w1 verb1 w2"], "R2": ["verb2"],
                                "R3": ["verb3", ""]})
    out = tmp_path / "adapted.safetensors"
    record = command.run(_argv(files, files["marked"], out, "--objective", "pseudo",
                               "--relations", str(rel), "--share", "0.5"))
    assert "adapted by pseudo to 18 sentences" in capsys.readouterr().out
    _, ckpt = load_model(out)
    stored = ckpt.summary["adaptation"][-1]
    assert stored["relations"] == 3 and stored["loss"] == "cross-entropy"
    assert stored["relations_sha256"] == record["relations_sha256"] == hashlib.sha256(
        rel.read_bytes()).hexdigest()
    assert stored["labelling"][0]["most_per_relation"] <= 3  # ceil(0.5 * 18 / 3)
    card = "\n".join(adaptation_lines(ckpt.summary["adaptation"]))
    assert "labelled by the prior with 3 relations" in card and "cross-entropy" in card


def test_pseudo_without_relations_and_relations_without_pseudo_are_one_line(files, tmp_path,
                                                                           capsys):
    out = tmp_path / "out.safetensors"
    err = _one_error(capsys, lambda: command.main(
        _argv(files, files["marked"], out, "--objective", "pseudo")))
    assert "--relations FILE" in err
    rel = _relations(tmp_path, {"R1": ["verb1"], "R2": ["verb2"]})
    err = _one_error(capsys, lambda: command.main(
        _argv(files, files["marked"], out, "--relations", str(rel), "--objective", "masked")))
    assert "pseudo only" in err
    assert list(tmp_path.iterdir()) == [rel]


def test_relations_without_an_objective_choose_pseudo(files, tmp_path, capsys):
    rel = _relations(tmp_path, {"R1": ["verb1"], "R2": ["verb2"], "R3": ["verb3"]})
    out = tmp_path / "adapted.safetensors"
    command.run(_argv(files, files["marked"], out, "--relations", str(rel), "--steps", "2"))
    assert "adapted by pseudo" in capsys.readouterr().out


@pytest.mark.parametrize("content", ['{"R1": ["verb1"]}', '{"R1": [""], "R2": ["verb2"]}',
                                     "not json", None])
def test_bad_relations_are_one_line(files, tmp_path, capsys, content):
    rel = tmp_path / "relations.json"
    if content is not None:
        rel.write_text(content)
    out = tmp_path / "out.safetensors"
    err = _one_error(capsys, lambda: command.main(
        _argv(files, files["marked"], out, "--objective", "pseudo", "--relations", str(rel))))
    assert "--relations" in err or "relation" in err
    assert not out.exists()


def test_an_interrupted_pseudo_run_leaves_no_file(files, tmp_path, capsys, monkeypatch):
    import model.adapt.run as run

    rel = _relations(files["root"], {"R1": ["verb1"], "R2": ["verb2"]})
    labelled = []
    first = run.pseudo_labels

    def interrupted(*args, **kwargs):
        labelled.append(1)
        if len(labelled) > 1:  # Ctrl-C while labelling again half-way
            raise KeyboardInterrupt
        return first(*args, **kwargs)

    monkeypatch.setattr(run, "pseudo_labels", interrupted)
    out = tmp_path / "out.safetensors"
    with pytest.raises(SystemExit) as exc:
        command.main(_argv(files, files["marked"], out, "--steps", "4", "--objective", "pseudo",
                           "--relations", str(rel)))
    assert exc.value.code == 130 and len(labelled) == 2
    assert list(tmp_path.iterdir()) == []
