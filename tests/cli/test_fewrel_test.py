import json

import pytest

from cli.fewrel_test import main
from model.predict.predictor import Predictor
from tests.model.test_predictor import tiny_checkpoint
from tests.model.tiny_regrab import toy_table

RELATIONS = ["P5", "P6", "P7", "P8"]


def _record(row):
    return {"tokens": row["tokens"],
            "h": ["h", "Q1", [list(range(row["head_start"], row["head_end"]))]],
            "t": ["t", "Q2", [list(range(row["tail_start"], row["tail_end"]))]]}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A FewRel-format file of 4 toy relations x 5 sentences, and tiny checkpoints."""
    root = tmp_path_factory.mktemp("fewrel_test")
    data = {}
    for row in toy_table(RELATIONS, 5, seed=5).to_pylist():
        data.setdefault(row["relation"], []).append(_record(row))
    (root / "val.json").write_text(json.dumps(data))
    return root


def _make(root, ways=3, shots=2, episodes=12, seed=0):
    main(["make", "--data", str(root / "val.json"), "--ways", str(ways), "--shots", str(shots),
          "--episodes", str(episodes), "--seed", str(seed), "--out", str(root / "test.json"),
          "--answers", str(root / "gold.json")])
    return json.loads((root / "test.json").read_text()), json.loads((root / "gold.json")
                                                                    .read_text())


@pytest.mark.parametrize("method", ["regrab", "proto"])
def test_round_trip_matches_the_predictor_episode_by_episode(root, method, capsys):
    episodes, gold = _make(root)
    ckpt = tiny_checkpoint(root, method)
    main(["--checkpoint", str(ckpt), "--input", str(root / "test.json"),  # the bare form
          "--out", str(root / "pred.json"), "--device", "cpu", "--seed", "3"])
    pred = json.loads((root / "pred.json").read_text())
    capsys.readouterr()
    main(["score", "--pred", str(root / "pred.json"), "--answers", str(root / "gold.json")])
    printed = capsys.readouterr().out
    # Independently: one set_support + predict per episode; Wikidata-like ids outside the
    # toy graph (P1..P9) read no name, so every way gets the fallback prior, as in predict.
    predictor = Predictor.from_checkpoint(ckpt, "cpu", seed=3)
    direct = []
    for ep in episodes:
        predictor.set_support({f"P{100 + n}": way for n, way in enumerate(ep["meta_train"])})
        assert set(predictor.summary.priors.values()) <= {"fallback"}
        direct.append(predictor.relations.index(predictor.predict([ep["meta_test"]]).best[0]))
    assert pred == direct
    acc = 100 * sum(p == g for p, g in zip(direct, gold, strict=True)) / len(gold)
    assert printed.startswith(f"accuracy {acc:.2f} ± ") and "12 episodes" in printed


def test_answer_files_are_ints_in_range_and_make_repeats(root):
    episodes, gold = _make(root, ways=4, shots=1, episodes=30, seed=1)
    assert len(episodes) == len(gold) == 30
    assert all(type(g) is int and 0 <= g < 4 for g in gold) and len(set(gold)) > 1
    for ep, g in zip(episodes, gold, strict=True):
        assert len(ep["meta_train"]) == 4 and all(len(w) == 1 for w in ep["meta_train"])
        # the query belongs to the gold way's relation and is not one of its shots
        assert ep["meta_test"] not in ep["meta_train"][g]
    assert _make(root, ways=4, shots=1, episodes=30, seed=1) == (episodes, gold)
    main(["predict", "--checkpoint", str(tiny_checkpoint(root, "proto")), "--input",
          str(root / "test.json"), "--out", str(root / "pred.json"), "--device", "cpu"])
    pred = json.loads((root / "pred.json").read_text())
    assert len(pred) == 30 and all(type(p) is int and 0 <= p < 4 for p in pred)


def _error(argv, capsys, out=None):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    if out is not None:
        assert not out.exists() and not list(out.parent.glob(f".{out.name}.*"))
    return err


def test_bad_inputs_give_one_error_line(root, capsys):
    episodes, _ = _make(root, episodes=2)
    ckpt, out = tiny_checkpoint(root, "proto"), root / "bad_pred.json"

    def predict(eps):
        (root / "bad.json").write_text(json.dumps(eps))
        return _error(["--checkpoint", str(ckpt), "--input", str(root / "bad.json"),
                       "--out", str(out), "--device", "cpu"], capsys, out)

    uneven = json.loads(json.dumps(episodes))
    uneven[1]["meta_train"][0] = uneven[1]["meta_train"][0][:1]
    assert "episode 1" in predict(uneven) and "differ in K" in predict(uneven)
    no_entity = json.loads(json.dumps(episodes))
    del no_entity[0]["meta_test"]["h"]
    assert "episode 0 meta_test" in predict(no_entity)
    assert "meta_train" in predict([{"meta_test": episodes[0]["meta_test"]}])
    assert "list of episodes" in predict({"meta_train": []})
    (root / "short.json").write_text("[0, 1]")
    (root / "three.json").write_text("[0, 1, 2]")
    err = _error(["score", "--pred", str(root / "short.json"), "--answers",
                  str(root / "three.json")], capsys)
    assert "2 answers" in err and "3" in err
    (root / "text.json").write_text('["0", 1]')
    assert "integers" in _error(["score", "--pred", str(root / "text.json"), "--answers",
                                 str(root / "short.json")], capsys)
    assert "--ways" in _error(["make", "--data", str(root / "val.json"), "--ways", "9",
                               "--out", str(out), "--answers", str(root / "g.json")], capsys, out)
