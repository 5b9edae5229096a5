"""``regrab-predict`` scores every support sentence's suspicion and flags the mislabelled ones
above the checkpoint's validation cutoff; old checkpoints flag nothing and say why."""

import dataclasses
import json

import pyarrow.parquet as pq
import pytest

from cli.predict import main, predict_files
from model.files.checkpoint import read_checkpoint, save_checkpoint
from model.files.suspicion_cutoff import SuspicionCutoff
from model.predict.sentences import parse_sentence
from tests.model.predict.test_predictor import tiny_checkpoint
from tests.model.tiny_regrab import toy_table

RELATIONS = ["P6", "P7", "P8"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """3 relations with 4 sentences each, a relation's sentences one sentence with another
    word at the end (so that even an untrained encoder puts them close), the last of P6 being
    one of P7's: an obviously mislabelled support sentence."""
    root = tmp_path_factory.mktemp("noise")
    rows = toy_table(RELATIONS, 1, seed=4).to_pylist()
    text = {x["relation"]: [f"{parse_sentence(x).marked()} w{j}" for j in range(6)]
            for x in rows}
    support = [{"relation": r, "text": t} for r in RELATIONS for t in text[r][:4]]
    support[3]["text"] = text["P7"][5]  # P6's 4th sentence is one of P7's
    (root / "support.jsonl").write_text("\n".join(json.dumps(s) for s in support) + "\n")
    (root / "queries.jsonl").write_text("\n".join(
        json.dumps({"relation": r, "text": t}) for r in RELATIONS for t in text[r][4:]) + "\n")
    return {"root": root, "support": root / "support.jsonl", "queries": root / "queries.jsonl"}


def argv(files, ckpt, out, *extra):
    return ["--checkpoint", str(ckpt), "--support", str(files["support"]), "--queries",
            str(files["queries"]), "--out", str(out), "--device", "cpu", *extra]


def with_cutoff(path, out, cutoff):
    record = SuspicionCutoff(5, 5, 200, cutoff, 97.5, 90.0, 1.5, "the highest F1 (a test)")
    save_checkpoint(out, dataclasses.replace(read_checkpoint(path), support_noise=record))
    return out


@pytest.mark.parametrize("method", ["regrab", "proto"])
def test_the_planted_sentence_is_the_most_suspicious_and_flagged(files, tmp_path, capsys,
                                                                 method):
    ckpt = tiny_checkpoint(files["root"], method)
    result = predict_files(argv(files, ckpt, tmp_path / "p.jsonl"))
    scores = result["support_suspicion"]
    assert [(r["relation"], r["index"]) for r in scores] == [
        (r, j) for r in RELATIONS for j in range(4)]
    top = max(scores, key=lambda r: r["suspicion"])
    assert (top["relation"], top["index"]) == ("P6", 3)
    # Old checkpoint: scores, no flags, and the summary says why.
    assert result["support_flagged"] == 0 and result["support_cutoff"] is None
    assert "flagged as possibly mislabelled: 0; this checkpoint keeps no suspicion cutoff" \
        in capsys.readouterr().out
    # With a cutoff between the planted sentence and the rest, it alone is flagged.
    rest = max(r["suspicion"] for r in scores if r is not top)
    cut = with_cutoff(ckpt, tmp_path / "cut.safetensors", (rest + top["suspicion"]) / 2)
    out = tmp_path / "s.parquet"
    result = predict_files(argv(files, cut, tmp_path / "p.jsonl", "--support-scores", str(out)))
    printed = capsys.readouterr().out
    assert result["support_flagged"] == 1
    assert "support sentences flagged as possibly mislabelled: 1 (P6 #3" in printed
    assert "chosen on the validation relations: the highest F1 (a test)" in printed
    table = pq.read_table(out).to_pylist()
    assert [r["flagged"] for r in table] == [r["relation"] == "P6" and r["index"] == 3
                                             for r in table]
    assert table[3]["text"] == json.loads(files["support"].read_text().splitlines()[3])["text"]
    assert [r["suspicion"] for r in table] == pytest.approx([r["suspicion"] for r in scores])


def test_the_cutoff_comes_back_from_a_file_and_bad_ones_are_refused(files, tmp_path, capsys):
    ckpt = tiny_checkpoint(files["root"])
    path = with_cutoff(ckpt, tmp_path / "c.safetensors", 1.25)
    assert read_checkpoint(path).support_noise.cutoff == 1.25
    back = dataclasses.asdict(read_checkpoint(path).support_noise)
    for bad in ({"auroc": 101.0}, {"ways": 0}, {"cutoff": float("nan")}, {"reason": 3}):
        with pytest.raises(ValueError):
            SuspicionCutoff.parse({**back, **bad})
    # The scores file is checked before any work, and never an input.
    for out, words in ((tmp_path / "s.txt", "--support-scores"),
                       (files["support"], "is also --support")):
        with pytest.raises(SystemExit):
            main(argv(files, path, tmp_path / "p.jsonl", "--support-scores", str(out)))
        assert words in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()


@pytest.mark.parametrize("method", ["regrab", "proto"])
def test_a_relation_s_only_sentence_is_not_checked(files, tmp_path, capsys, method):
    """A lone sentence has no sibling to be judged by: null suspicion, never flagged (even
    under a cutoff that flags every other sentence), and the summary counts it."""
    rows = [json.loads(line) for line in files["support"].read_text().splitlines()]
    lone = [r for r in rows if r["relation"] != "P8"] + [r for r in rows
                                                         if r["relation"] == "P8"][:1]
    support = tmp_path / "lone.jsonl"
    support.write_text("\n".join(json.dumps(r) for r in lone) + "\n")
    cut = with_cutoff(tiny_checkpoint(files["root"], method), tmp_path / "c.safetensors", -1e9)
    out = tmp_path / "s.jsonl"
    result = predict_files(["--checkpoint", str(cut), "--support", str(support), "--queries",
                            str(files["queries"]), "--out", str(tmp_path / "p.jsonl"),
                            "--device", "cpu", "--support-scores", str(out)])
    printed = capsys.readouterr().out
    table = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["relation"], r["suspicion"] is None, r["flagged"]) for r in table] == [
        *((r, False, True) for r in ("P6", "P7") for _ in range(4)), ("P8", True, False)]
    assert result["support_flagged"] == 8
    assert "; 1 sentence has no siblings, not checked (P8: a relation's only sentence);" \
        in printed
