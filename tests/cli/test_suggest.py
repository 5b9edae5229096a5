"""regrab-suggest: the pool ranked by a strategy, in JSONL, CSV or Parquet; bad input is one
``error:`` line with nothing written."""

import csv
import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from cli import suggest
from model.evaluation.uncertainty import uncertainty_scores
from model.predict.predictor import Predictor
from model.predict.typiclust import typiclust_pick
from tests.cli.inputs import one_error, write_predict_inputs
from tests.model.predict.test_predictor import tiny_checkpoint


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Tiny regrab and proto checkpoints, a 3-way 2-shot support and a pool of six
    sentences (one with an id), plus a line that is not JSON."""
    root = tmp_path_factory.mktemp("suggest")
    rows = write_predict_inputs(root)
    pool = [{"text": json.loads(x)["text"]} for x in
            (root / "queries.jsonl").read_text().splitlines()]
    pool += [{"tokens": r["tokens"], "head_start": r["head_start"], "head_end": r["head_end"],
              "tail_start": r["tail_start"], "tail_end": r["tail_end"]} for r in rows[3::4]]
    pool[1]["id"] = "s-2"
    (root / "pool.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pool)
                                     + "{broken\n")
    return {"root": root, "regrab": tiny_checkpoint(root),
            "proto": tiny_checkpoint(root, method="proto"), "support": root / "support.jsonl",
            "pool": root / "pool.jsonl"}


def fitted(files, method):
    """The checkpoint's predictor, seed 0, fitted to the support file as the command reads it."""
    pred = Predictor.from_checkpoint(files[method], "cpu", seed=0)
    support = {}
    for line in files["support"].read_text().splitlines():
        rec = json.loads(line)
        support.setdefault(rec["relation"], []).append(rec)
    pred.set_support(support)
    return pred


def _argv(files, out, method="regrab", *extra):
    return ["--checkpoint", str(files[method]), "--support", str(files["support"]),
            "--pool", str(files["pool"]), "--out", str(out), "--device", "cpu", *extra]


def test_ranks_the_pool_by_bald_for_regrab(files, tmp_path, capsys):
    out = tmp_path / "ranked.jsonl"
    result = suggest.suggest(_argv(files, out, "regrab", "--strategy", "bald"))
    assert result["strategy"] == "bald" and result["samples"] > 1
    assert result["ranked"] == 6 and result["skipped"] == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["rank"] for r in rows] == list(range(1, 7))
    assert sorted(r["line"] for r in rows) == list(range(1, 7))
    scores = [r["score"] for r in rows]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0
    assert {r["best"] for r in rows} <= {"P6", "P7", "P8"}
    assert all(1 / 3 <= r["probability"] <= 1 for r in rows)
    assert next(r for r in rows if r["line"] == 2)["id"] == "s-2"
    assert all("[E1]" in r["text"] and "[/E2]" in r["text"] for r in rows)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("ranked 6 pool sentences (1 skipped) for 3 relations by "
                                 f"bald; label first: line {rows[0]['line']}")
    assert printed[1].startswith("  skipped line 7: not JSON")
    # The scores are the mutual information of the model's own per-sample logits.
    pred = fitted(files, "regrab")
    logits = pred.sample_logits(pred.encode([r["text"] for r in rows]))
    mi = uncertainty_scores(logits)["mutual_information"].numpy()
    np.testing.assert_allclose(scores, mi, rtol=1e-4, atol=1e-7)


def test_proto_ranks_by_entropy_and_writes_csv_and_parquet(files, tmp_path):
    out = tmp_path / "ranked.csv"
    assert suggest.suggest(_argv(files, out, "proto", "--strategy", "entropy"))["strategy"] \
        == "entropy"
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["rank", "line", "id", "text", "score", "best", "probability"]
    assert [int(r["rank"]) for r in rows] == list(range(1, 7))
    out = tmp_path / "ranked.parquet"
    suggest.suggest(_argv(files, out, "proto", "--strategy", "margin"))
    table = pq.read_table(out)
    assert table.column_names == ["rank", "line", "id", "text", "score", "best",
                                  "probability"]
    margin = table.column("score").to_pylist()
    assert margin == sorted(margin, reverse=True) and all(0 <= m <= 1 for m in margin)


def test_typiclust_is_the_default_and_ranks_by_repeated_picks_for_any_method(files,
                                                                             tmp_path):
    out = tmp_path / "ranked.jsonl"
    assert suggest.suggest(_argv(files, out))["strategy"] == "typiclust"  # regrab
    result = suggest.suggest(_argv(files, out, "proto", "--chunk", "4", "--picks", "2"))
    assert result["strategy"] == "typiclust" and result["ranked"] == 6
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5, 6]
    # The first is the pick on the support's and the pool's encodings, from --seed.
    pred = fitted(files, "proto")
    assert pred.support_encodings.shape[0] == 6  # 3 ways x 2 shots, no padding
    pool = pred.encode([r["text"] for r in sorted(rows, key=lambda r: r["line"])])
    # The score is each sentence's typicality in the pool, not its place in the order: the
    # inverse mean distance to its nearest pool sentences (all 5 others here), the same for
    # a sentence wherever the picks put it; the ranks after the picks follow it.
    want = 1 / (torch.cdist(pool.double(), pool.double()).sum(1) / 5)
    by_line = {r["line"]: r["score"] for r in rows}
    assert [by_line[i] for i in range(1, 7)] == pytest.approx(want.tolist(), rel=1e-4)
    assert [r["score"] for r in rows[2:]] == sorted((r["score"] for r in rows[2:]),
                                                     reverse=True)
    first = typiclust_pick(pred.support_encodings, pool, torch.ones(6, dtype=torch.bool),
                           torch.Generator().manual_seed(0))
    assert rows[0]["line"] == first + 1


def test_more_picks_than_the_pool_are_clamped_and_said(files, tmp_path, capsys, monkeypatch):
    """--picks 1000000000 ran with no word: now one note, and a bar of the picks."""
    monkeypatch.setattr(suggest, "PROGRESS_PICKS", 2)
    out = tmp_path / "ranked.jsonl"
    capsys.readouterr()
    result = suggest.suggest(_argv(files, out, "proto", "--picks", "1000000000"))
    err = capsys.readouterr().err
    assert "note: --picks 1,000,000,000 is more than the pool's 6 sentences; every pool " \
           "sentence is ranked by repeated picks (6 picks" in err
    assert "typiclust picks: 100%" in err and "6/6" in err
    same = tmp_path / "same.jsonl"  # clamped: the ranking of --picks 6
    suggest.suggest(_argv(files, same, "proto", "--picks", "6"))
    assert result["ranked"] == 6 and out.read_text() == same.read_text()
    assert "note:" not in capsys.readouterr().err


def test_random_is_seeded(files, tmp_path):
    orders = []
    for seed in (1, 1, 2):
        out = tmp_path / f"r{len(orders)}.jsonl"
        suggest.suggest(_argv(files, out, "proto", "--strategy", "random", "--seed", str(seed)))
        orders.append([json.loads(x)["line"] for x in out.read_text().splitlines()])
    assert orders[0] == orders[1] and orders[0] != orders[2]


def test_bald_without_posterior_samples_is_one_error(files, tmp_path, capsys):
    out = tmp_path / "ranked.jsonl"
    err = one_error(capsys, lambda: suggest.main(_argv(files, out, "proto", "--strategy",
                                                       "bald")))
    assert "strategy bald" in err and "(proto) has none" in err
    assert "--strategy typiclust, entropy or margin" in err and not out.exists()


def test_bad_output_is_refused_before_the_model_is_loaded(files, tmp_path, capsys,
                                                          monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before --out was checked")

    monkeypatch.setattr(suggest.Predictor, "from_checkpoint", never)
    err = one_error(capsys, lambda: suggest.main(_argv(files, tmp_path / "ranked.txt")))
    assert "extension .txt" in err and ".jsonl, .csv, .parquet" in err
    err = one_error(capsys, lambda: suggest.main(_argv(files, files["pool"])))
    assert "is also --pool" in err
    err = one_error(capsys, lambda: suggest.main(_argv(files, "/proc/x/ranked.jsonl")))
    assert "cannot be written" in err


@pytest.mark.parametrize("text, expected", [
    ("", "has no records"),
    ("no markers here\n{broken\n", "none of the 2 sentences in the pool"),
])
def test_an_unusable_pool_is_one_error(files, tmp_path, capsys, text, expected):
    pool = tmp_path / "pool.jsonl"
    pool.write_text(text)
    out = tmp_path / "ranked.jsonl"
    argv = _argv(files, out)
    argv[argv.index("--pool") + 1] = str(pool)
    err = one_error(capsys, lambda: suggest.main(argv))
    assert expected in err and not out.exists()


def test_nan_scores_stop_naming_the_pool_line(files, tmp_path, capsys, monkeypatch):
    real = suggest.Predictor.sample_logits

    def nan_third(self, query):
        logits = real(self, query)
        if logits.shape[1] > 1:  # not the one-sentence probe
            logits[:, 2] = math.nan
        return logits

    monkeypatch.setattr(suggest.Predictor, "sample_logits", nan_third)
    out = tmp_path / "ranked.jsonl"
    err = one_error(capsys, lambda: suggest.main(_argv(files, out)))
    assert "non-finite probabilities (NaN or inf) for 1 of 6 queries" in err
    assert f"{files['pool']} line 3" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra, words", [
    (["--seed", "-1"], "--seed -1 is out of range"),
    (["--threads", "100000"], "--threads 100000: give 0"),
    (["--chunk", "0"], "--batch-size and --chunk must be >= 1"),
    (["--picks", "0"], "--picks 0: rank at least one pool sentence"),
])
def test_numbers_out_of_range_stop_before_loading(files, tmp_path, capsys, monkeypatch, extra,
                                                  words):
    monkeypatch.setattr(suggest.Predictor, "from_checkpoint", None)
    err = one_error(capsys, lambda: suggest.main(_argv(files, tmp_path / "r.jsonl") + extra))
    assert words in err and list(tmp_path.iterdir()) == []
