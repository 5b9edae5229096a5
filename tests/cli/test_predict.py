import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from cli.predict import main, predict_files, read_queries, read_support
from model.predict.sentences import parse_sentence
from pipeline.io import write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA
from tests.model.predict.test_predictor import tiny_checkpoint
from tests.model.tiny_regrab import toy_table

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "predict"
RELATIONS = ["P6", "P7", "P8"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny checkpoint, a 3-way 2-shot support file and queries with two bad lines."""
    root = tmp_path_factory.mktemp("cli")
    table = toy_table(RELATIONS, 5, seed=4)
    rows = table.to_pylist()
    support, queries = [], []
    for r in RELATIONS:
        mine = [x for x in rows if x["relation"] == r]
        support += [{"relation": r, "text": parse_sentence(x).marked()} for x in mine[:2]]
        queries += [{"id": x["instance_id"], "relation": r, "text": parse_sentence(x).marked()}
                    for x in mine[2:4]]
    x = rows[-1]  # the FewRel form of the same kind of sentence
    queries.append({"id": "fewrel", "tokens": x["tokens"],
                    "h": ["h", "Q1", [list(range(x["head_start"], x["head_end"]))]],
                    "t": ["t", "Q2", [list(range(x["tail_start"], x["tail_end"]))]]})
    lines = [json.dumps(q) for q in queries]
    lines.insert(2, '{"text": "[E1]w1[/E1] verb6 w2 [/E2] ."}')  # line 3: unbalanced
    lines.insert(4, "{not json")  # line 5
    (root / "support.jsonl").write_text("\n".join(json.dumps(s) for s in support) + "\n")
    (root / "queries.jsonl").write_text("\n".join(lines) + "\n")
    write_parquet(table, root / "queries.parquet", FEWSHOT_SCHEMA)
    return {"root": root, "ckpt": tiny_checkpoint(root), "support": root / "support.jsonl",
            "queries": root / "queries.jsonl", "parquet": root / "queries.parquet",
            "n_queries": len(queries),
            "reads_descriptions": tiny_checkpoint(root, prior={"descriptions": True})}


def _run(files, out, *extra, support=True, queries=None):
    argv = ["--checkpoint", str(files["ckpt"]), "--queries", str(queries or files["queries"]),
            "--out", str(out), "--device", "cpu", *extra]
    if support:
        argv += ["--support", str(files["support"])]
    return main(argv)


def test_jsonl_out_skips_bad_queries_and_sums_to_one(files, capsys):
    out = files["root"] / "preds.jsonl"
    _run(files, out, "--seed", "3")
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == files["n_queries"]
    assert [r["line"] for r in rows] == [1, 2, 4, 6, 7, 8, 9]
    for r in rows:
        assert set(r["probabilities"]) == set(RELATIONS)
        assert sum(r["probabilities"].values()) == pytest.approx(1.0)
        assert r["best"] == max(r["probabilities"], key=r["probabilities"].get)
        assert r["prediction"] == r["best"] and not r["abstain"]
        assert r["entropy"] >= r["mutual_information"] >= 0
    assert "2 skipped" in printed and "line 3: unbalanced markers" in printed
    assert "line 5: not JSON" in printed and "equal K=2" in printed
    assert "accuracy on the 6 queries" in printed


def test_parquet_out_threshold_and_zero_shot(files, capsys):
    out = files["root"] / "preds.parquet"
    _run(files, out, "--threshold", "0.999", "--zero-shot", "P9")
    printed = capsys.readouterr().out
    table = pq.read_table(out)
    assert table.num_rows == files["n_queries"]
    probs = table.column("probabilities").to_pylist()
    assert all(list(p) == RELATIONS + ["P9"] for p in probs)
    assert np.allclose([sum(p.values()) for p in probs], 1.0)
    abstain = table.column("abstain").to_pylist()
    assert abstain == [c < 0.999 for c in table.column("confidence").to_pylist()]
    assert all((p is None) == a for p, a in
               zip(table.column("prediction").to_pylist(), abstain, strict=True))
    assert "zero-shot from the prior: P9" in printed and "one episode" in printed


def test_parquet_queries_and_zero_shot_only(files, capsys):
    out = files["root"] / "zs.jsonl"
    _run(files, out, "--zero-shot", "P6,P7,P8", support=False, queries=files["parquet"])
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 15 and all(r["gold"] in RELATIONS for r in rows)
    assert "accuracy on the 15 queries" in printed and "equal K=0" in printed


def _error(files, capsys, out, *extra, **kw):
    with pytest.raises(SystemExit) as exc:
        _run(files, out, *extra, **kw)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.*"))
    return err


def test_bad_input_is_one_error_line_and_no_output(files, capsys, tmp_path):
    out = tmp_path / "never.jsonl"
    assert "not in the checkpoint's relation graph" in _error(
        files, capsys, out, "--zero-shot", "P999")
    assert "not found" in _error(files, capsys, out, "--checkpoint", str(tmp_path / "x.pt"))
    (tmp_path / "junk.pt").write_bytes(b"junk")
    assert "unreadable" in _error(files, capsys, out, "--checkpoint", str(tmp_path / "junk.pt"))
    (tmp_path / "empty.jsonl").write_text("\n")
    assert "no records" in _error(files, capsys, out, queries=tmp_path / "empty.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"text": "no markers here"}\n')
    assert "none of the 1 queries" in _error(files, capsys, out, queries=tmp_path / "bad.jsonl")
    (tmp_path / "q.csv").write_text("x\n")
    assert "extension .csv" in _error(files, capsys, out, queries=tmp_path / "q.csv")
    assert "extension .csv" in _error(files, capsys, tmp_path / "out.csv")
    bad_support = tmp_path / "support.jsonl"
    bad_support.write_text('{"relation": "P6", "text": "[E1]w1[/E1] verb6 w2"}\n')
    err = _error(files, capsys, out, "--support", str(bad_support), support=False)
    assert "line 1" in err and "[E2] is missing" in err
    bad_support.write_text('{"relation": "P6", "tokens": ["w1", "w2"], '
                           '"h": ["w1", "Q1", [[0]]], "t": ["w9", "Q2", [[5]]]}\n')
    err = _error(files, capsys, out, "--support", str(bad_support), support=False)
    assert "outside the sentence" in err


def test_shipped_examples_parse():
    support = read_support(EXAMPLES / "support.jsonl", ["P452"])
    assert {r: len(s) for r, s in support.items()} == {"P40": 2, "P166": 2, "P463": 2,
                                                       "P452": 0}
    queries, skipped = read_queries(EXAMPLES / "queries.jsonl")
    assert len(queries) == 6 and skipped == []
    assert queries[0]["sentence"].marked().startswith("[E1]Robert Kennedy[/E1]")
    assert queries[2]["sentence"].tail == (6, 8)


def test_names_from_support_rows_and_the_command_line(files, tmp_path, capsys):
    rows = [json.loads(x) for x in files["support"].read_text().splitlines()]
    for r in rows:  # P7 becomes a relation the graph lacks, named in the file; P8 on the CLI
        r["relation"] = {"P7": "Q7007", "P8": "Q8008"}.get(r["relation"], r["relation"])
        if r["relation"] == "Q7007":
            r["name"] = "verb7"
    support = tmp_path / "named.jsonl"
    support.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["--checkpoint", str(files["ckpt"]), "--support", str(support), "--queries",
          str(files["queries"]), "--out", str(tmp_path / "o.jsonl"), "--device", "cpu",
          "--name", "Q8008=verb8 w1"])
    out = capsys.readouterr().out
    assert "prior: P6 graph (no text), Q7007 label (name), Q8008 label (name)" in out
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(files["ckpt"]), "--support", str(support), "--queries",
              str(files["queries"]), "--out", str(tmp_path / "o.jsonl"), "--name", "Q8008"])
    assert "write it as RELATION=NAME" in capsys.readouterr().err


def _renamed_support(files, path, **fields):
    """The fixture's support with P7 and P8 renamed to relations the graph lacks (Q7007,
    Q8008); ``fields`` adds ``{relation: {field: value}}`` to those relations' rows."""
    rows = [json.loads(x) for x in files["support"].read_text().splitlines()]
    for r in rows:
        r["relation"] = {"P7": "Q7007", "P8": "Q8008"}.get(r["relation"], r["relation"])
        r.update(fields.get(r["relation"], {}))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_relations_file_and_description_fields_reach_the_prior(files, tmp_path, capsys):
    """Q7007's name and description come from --relations, Q8008's name from --name (over
    the file's) and its description from its support rows: a checkpoint that reads
    descriptions reads both, one that does not reads the names alone and says so."""
    support = _renamed_support(files, tmp_path / "s.jsonl",
                               Q8008={"description": "w3 of the w4"})
    relations = tmp_path / "relations.json"
    relations.write_text(json.dumps({"Q7007": ["verb7", "w1 w2 the w5"], "Q8008": ["verb8"],
                                     "Q9999": ["not a candidate", "ignored"]}))
    argv = ["--support", str(support), "--relations", str(relations), "--name",
            "Q8008=verb8 w1", "--queries", str(files["queries"]), "--device", "cpu"]
    result = predict_files(["--checkpoint", str(files["reads_descriptions"]),
                            "--out", str(tmp_path / "a.jsonl"), *argv])
    out = capsys.readouterr().out
    # The untrained checkpoint never encoded its graph's labels: P6 reads no text.
    assert ("prior: P6 graph (no text), Q7007 label (name+description), "
            "Q8008 label (name+description)") in out
    assert "prior text: name+description 2, name 0, no text 1" in out
    assert result["text_counts"] == {"name+description": 2, "name": 0, "no text": 1}
    assert result["texts"]["Q7007"] == "name+description"
    assert result["priors"] == {"P6": "graph", "Q7007": "label", "Q8008": "label"}

    main(["--checkpoint", str(files["ckpt"]), "--out", str(tmp_path / "b.jsonl"), *argv])
    out = capsys.readouterr().out
    assert "Q7007 label (name), Q8008 label (name)" in out
    assert "prior text: name+description 0, name 2, no text 1" in out
    assert "descriptions not read: Q7007, Q8008 (the checkpoint's prior reads names only" in out
    assert len((tmp_path / "b.jsonl").read_text().splitlines()) == files["n_queries"]


def test_bad_relations_files_are_one_error_line(files, capsys, tmp_path):
    out = tmp_path / "never.jsonl"
    support = _renamed_support(files, tmp_path / "s.jsonl")
    bad = tmp_path / "relations.json"

    def error(text, *extra, rows=support):
        bad.write_text(text)
        return _error(files, capsys, out, "--support", str(rows), "--relations", str(bad),
                      *extra, support=False)

    assert "--relations" in error("{not json") and "not valid JSON" in error("{not json")
    assert "expected a JSON object" in error('[["verb7"]]')
    assert "not [name, description]" in error('{"Q7007": "verb7"}')
    assert "not [name, description]" in error('{"Q7007": ["  ", "a description"]}')
    assert "not [name, description]" in error('{"Q7007": ["verb7", "d", "extra"]}')
    err = error('{"Q7007": ["verb7", "w1"], "Q7007": ["verb7", "w2"]}')
    assert "'Q7007' is given twice with different text" in err and "keep one entry" in err
    assert "lone surrogate" in error('{"Q7007": ["verb7", "\\ud800"]}')
    # The file and a support row disagree; --name settles a name, never a description.
    named = _renamed_support(files, tmp_path / "named.jsonl",
                             Q7007={"name": "verb7 w9", "description": "w1 w3"})
    err = error('{"Q7007": ["verb7", "w1 w2"]}', rows=named)
    assert "two different names" in err and "--name REL=NAME overrides both" in err
    err = error('{"Q7007": ["verb7", "w1 w2"]}', "--name", "Q7007=verb7", rows=named)
    assert "two different descriptions" in err and "line 3" in err
    same = tmp_path / "relations.jsonl"  # an output extension, so only the path is wrong
    same.write_text('{"Q7007": ["verb7"]}')
    with pytest.raises(SystemExit) as exc:
        _run(files, same, "--relations", str(same))
    assert exc.value.code == 2 and "is also --relations" in capsys.readouterr().err
    assert same.read_text() == '{"Q7007": ["verb7"]}'
    numbers = _renamed_support(files, tmp_path / "numbers.jsonl", Q8008={"description": 7})
    bad.write_text('{"Q7007": ["verb7"]}')
    err = _error(files, capsys, out, "--support", str(numbers), "--relations", str(bad),
                 support=False)
    assert "'description' is int, not text" in err
    # The same text twice is no conflict.
    bad.write_text('{"Q7007": ["verb7", "w1"], "Q7007": [" verb7 ", "w1 "]}')
    main(["--checkpoint", str(files["ckpt"]), "--support", str(support), "--relations",
          str(bad), "--queries", str(files["queries"]), "--out", str(out), "--device", "cpu"])
    assert "Q7007 label (name)" in capsys.readouterr().out


def test_fewrels_no_description_placeholder_is_no_description(tmp_path):
    """FewRel's own pid2name.json writes "No description defined" where Wikidata has none: read
    as no description, not as a key given twice with different text."""
    from cli.predict import read_relation_texts

    path = tmp_path / "pid2name.json"
    path.write_text('{"P2389": ["organization directed from the office or person", '
                    '"No description defined"], "P17": ["country", "sovereign state"]}')
    assert read_relation_texts(path) == {
        "P2389": ("organization directed from the office or person", None),
        "P17": ("country", "sovereign state")}


def test_help_says_where_the_abstain_threshold_comes_from(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--abstain-rate R" in text and "--abstain-score NAME" in text
    assert "validation relations (never test relations)" in text
    assert "Default 0.05" in text and "overrides --abstain-rate and --abstain-score" in text


def test_abstain_rate_by_the_checkpoint_s_validation_scores(files, tmp_path, capsys):
    """Stored quantiles 0, 0.01, ..., 1 for every score: a rate of 0.5 cuts max_prob at 0.5,
    so exactly the queries whose top probability is below 0.5 abstain; the summary says by
    which score, cutoff and setting, and every score gets its column."""
    from model.files.checkpoint import read_checkpoint
    from tests.model.training.test_val_scores import synthetic, with_scores

    proto = tiny_checkpoint(files["root"], "proto")
    stored = [synthetic(ways=3, shots=1), synthetic(ways=5, shots=5, spread=0.5)]
    path = with_scores(proto, tmp_path / "proto.safetensors", stored)
    assert read_checkpoint(path).val_scores == tuple(stored)
    out = tmp_path / "p.parquet"
    result = predict_files(["--checkpoint", str(path), "--support", str(files["support"]),
                            "--queries", str(files["queries"]), "--out", str(out),
                            "--device", "cpu", "--abstain-rate", "0.5"])
    printed = capsys.readouterr().out
    table = pq.read_table(out).to_pylist()
    assert [r["abstain"] for r in table] == [r["confidence"] < 0.5 for r in table]
    # The abstain score is written as the top probability, as its name says, and the rule
    # reads "below" it.
    assert [r["abstain_score"] for r in table] == pytest.approx([r["confidence"] for r in table])
    assert all(r["top_prob"] == r["abstain_score"] and r["top_prob_ts"] is not None
               and r["mutual_information"] == 0.0 and r["top_logit_var"] is None
               and "max_prob" not in r for r in table)
    assert (result["abstain_score"], result["abstain_setting"]) == ("top_prob", "3w1s")
    assert result["abstain_cutoff"] == pytest.approx(0.5)
    assert f"{result['abstained']} abstained (abstain when: top_prob below 0.5, its 0.5 " \
           "quantile on in-set queries of the checkpoint's validation setting 3w1s, nearest " \
           "this 3-way 2-shot support)" in printed
    # The default rate, and a score this proto checkpoint lacks.
    predict_files(["--checkpoint", str(path), "--support", str(files["support"]),
                   "--queries", str(files["queries"]), "--out", str(out), "--device", "cpu",
                   "--abstain-score", "top_logit"])
    assert "top_logit below -0.95, its 0.05 quantile" in capsys.readouterr().out
    err = _error(files, capsys, tmp_path / "x.jsonl", "--checkpoint", str(path),
                 "--abstain-score", "mutual_information")
    assert "does not apply to this proto checkpoint (it has no posterior samples)" in err


def test_a_checkpoint_without_validation_scores(files, tmp_path, capsys):
    """An older checkpoint never abstains by default and says why; an explicit rate is an
    error naming what to do; --abstain-rate 0 and --threshold work."""
    out = tmp_path / "o.jsonl"
    _run(files, out)
    assert "0 abstained (abstain when: never: this checkpoint stores no uncertainty on " \
           "validation relations" in capsys.readouterr().out
    err = _error(files, capsys, tmp_path / "x.jsonl", "--abstain-rate", "0.1")
    assert "stores no uncertainty on validation relations to set an abstain rate by" in err
    assert "--threshold P" in err
    assert "not a share in [0, 1)" in _error(files, capsys, tmp_path / "x.jsonl",
                                            "--abstain-rate", "1")
    _run(files, out, "--abstain-rate", "0")
    _run(files, out, "--threshold", "0.9", "--abstain-rate", "0.2")
    printed = capsys.readouterr().out
    assert "top probability below the threshold 0.9 (overrides the abstain rate" in printed
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["abstain"] for r in rows] == [r["confidence"] < 0.9 for r in rows]
    with pytest.raises(SystemExit):
        _run(files, out, "--abstain-score", "confidence")
    assert "invalid choice: 'confidence'" in capsys.readouterr().err
