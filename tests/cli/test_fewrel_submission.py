import json

import pytest
import torch

from cli.fewrel_submission import fewrel_submission, main, read_pid2name
from model.methods.regrab import RegrabHead
from model.predict.predictor import Predictor
from tests.cli.inputs import fewrel_record
from tests.model.predict.test_predictor import tiny_checkpoint
from tests.model.tiny_regrab import toy_table

RELATIONS = ["P5", "P6", "P7", "P8"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A FewRel-format file of 4 toy relations x 5 sentences, and tiny checkpoints."""
    root = tmp_path_factory.mktemp("fewrel_submission")
    data = {}
    for row in toy_table(RELATIONS, 5, seed=5).to_pylist():
        data.setdefault(row["relation"], []).append(fewrel_record(row))
    (root / "val.json").write_text(json.dumps(data))
    return root


def _make(root, ways=3, shots=2, episodes=12, seed=0, relations=True):
    main(["make", "--data", str(root / "val.json"), "--ways", str(ways), "--shots", str(shots),
          "--episodes", str(episodes), "--seed", str(seed), "--out", str(root / "test.json"),
          "--answers", str(root / "gold.json"), *([] if relations else ["--no-relations"])])
    return json.loads((root / "test.json").read_text()), json.loads((root / "gold.json")
                                                                    .read_text())


@pytest.mark.parametrize("relations", [False, True])
@pytest.mark.parametrize("method", ["regrab", "proto"])
def test_round_trip_matches_the_predictor_episode_by_episode(root, method, relations, capsys):
    episodes, gold = _make(root, relations=relations)
    assert all(("relation" in ep) == relations for ep in episodes)
    ckpt = tiny_checkpoint(root, method)
    main(["--checkpoint", str(ckpt), "--input", str(root / "test.json"),  # the bare form
          "--out", str(root / "pred.json"), "--device", "cpu", "--seed", "3"])
    pred = json.loads((root / "pred.json").read_text())
    capsys.readouterr()
    main(["score", "--pred", str(root / "pred.json"), "--answers", str(root / "gold.json")])
    printed = capsys.readouterr().out
    # Independently: one set_support + predict per episode. Without relation ids, Wikidata-like
    # ids outside the toy graph (P1..P9) read no name, so every way gets the fallback prior, as
    # in predict; with them, the ways are the episode's relations, all in the graph.
    predictor = Predictor.from_checkpoint(ckpt, "cpu", seed=3)
    direct = []
    for ep in episodes:
        ids = ep.get("relation") or [f"P{100 + n}" for n in range(len(ep["meta_train"]))]
        predictor.set_support(dict(zip(ids, ep["meta_train"], strict=True)))
        kinds = {"regrab": {"graph" if relations else "fallback"}, "proto": set()}[method]
        assert set(predictor.summary.priors.values()) == kinds
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


def _predict(root, ckpt, name="test.json", *extra):
    return fewrel_submission(["--checkpoint", str(ckpt), "--input", str(root / name), "--out",
                        str(root / "pred.json"), "--device", "cpu", "--seed", "3", *extra])


def test_relation_lists_are_read_and_set_the_prior_kinds(root, capsys, monkeypatch):
    episodes, _ = _make(root)
    data = json.loads((root / "val.json").read_text())
    for ep in episodes:  # one id per way, in way order: the relation its shots were drawn from
        assert [all(r in data[rel] for r in way)
                for rel, way in zip(ep["relation"], ep["meta_train"], strict=True)] == [True] * 3
    ckpt = tiny_checkpoint(root, "regrab")
    graph = _predict(root, ckpt)
    assert graph["priors"] == {"graph": 36, "label": 0, "fallback": 0}
    assert "12 of 12 episodes carry relation ids" in capsys.readouterr().out
    stripped = [{k: v for k, v in ep.items() if k != "relation"} for ep in episodes]
    (root / "stripped.json").write_text(json.dumps(stripped))
    fallback = _predict(root, ckpt, "stripped.json")
    assert fallback["priors"] == {"graph": 0, "label": 0, "fallback": 36}
    # A mixed file: episode 0 names a graph relation, one pid2name names, and one nobody
    # names; episode 1 carries none. Every answer is what the Predictor gives that episode.
    mixed = [{**episodes[0], "relation": ["P5", "P100", "P101"]}, stripped[1]]
    (root / "mixed.json").write_text(json.dumps(mixed))
    (root / "pid2name.json").write_text(json.dumps({"P100": ["verb7 the w3", "a description"],
                                                    "P17": ["country", ""]}))
    seen = []  # the prior means each episode's head gets
    real = RegrabHead.sample_logits
    monkeypatch.setattr(RegrabHead, "sample_logits", lambda self, s, q, h, gen=None: (
        seen.append(h.clone()), real(self, s, q, h, gen))[1])
    named = _predict(root, ckpt, "mixed.json", "--pid2name", str(root / "pid2name.json"))
    means = list(seen)
    assert named["priors"] == {"graph": 1, "label": 1, "fallback": 4}
    assert "1 of 2 episodes carry relation ids" in capsys.readouterr().out
    assert _predict(root, ckpt, "mixed.json")["priors"] == {"graph": 1, "label": 0,
                                                            "fallback": 5}
    predictor = Predictor.from_checkpoint(ckpt, "cpu", seed=3)
    summary = predictor.set_support(dict(zip(mixed[0]["relation"], episodes[0]["meta_train"],
                                             strict=True)), names={"P100": "verb7 the w3"})
    assert summary.priors == {"P5": "graph", "P100": "label", "P101": "fallback"}
    # The prior's own forward pass over the same rows: graph, name, fallback; then fallbacks.
    prior = predictor.model.prior
    assert len(means) == 2 and torch.allclose(
        means[0][0], prior(predictor.model.rows(mixed[0]["relation"])), atol=1e-5)
    assert not torch.allclose(means[0][0, :2], prior.fallback.expand(2, -1))
    assert torch.equal(means[1][0], prior.fallback.expand(3, -1))
    assert named["answers"][0] == summary.relations.index(
        predictor.predict([episodes[0]["meta_test"]]).best[0])
    # Episodes without ids answer exactly as a file without any ids does.
    assert named["answers"][1] == fallback["answers"][1]
    # A checkpoint without a prior reads the ids and counts nothing.
    proto = _predict(root, tiny_checkpoint(root, "proto"), "mixed.json")
    assert proto["priors"] == {} and "every episode: none (no prior)" in capsys.readouterr().out


def test_no_relations_leaves_the_ids_out_and_draws_the_same_episodes(root):
    with_ids, gold = _make(root, episodes=20, seed=4)
    without, same_gold = _make(root, episodes=20, seed=4, relations=False)
    assert all(set(ep) == {"meta_train", "meta_test"} for ep in without)
    assert '"relation"' not in (root / "test.json").read_text()
    assert [{k: v for k, v in ep.items() if k != "relation"} for ep in with_ids] == without
    assert gold == same_gold and all(len(set(ep["relation"])) == 3 for ep in with_ids)


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


@pytest.mark.parametrize(("relation", "words"), [
    (["P5", "P6"], "'relation' lists 2 ids for 3 ways"),
    (["P5", "P6", "P7", "P8"], "lists 4 ids for 3 ways"),
    ("P5", "'relation' is 'P5', not a list"),
    (None, "is None, not a list"),
    (["P5", 6, "P7"], "'relation' holds 6, not a relation id"),
    (["P5", " ", "P7"], "holds ' ', not a relation id"),
    (["P5", "P6\ud800", "P7"], "holds 'P6\\ud800', not a relation id"),
    (["P5", "P6", "P5"], "'relation' gives 'P5' to more than one way"),
])
def test_bad_relation_lists_give_one_error_line(root, capsys, relation, words):
    episodes, _ = _make(root, episodes=3)
    episodes[2]["relation"] = relation
    (root / "bad.json").write_text(json.dumps(episodes))
    out = root / "bad_pred.json"
    err = _error(["--checkpoint", str(tiny_checkpoint(root, "regrab")), "--input",
                  str(root / "bad.json"), "--out", str(out), "--device", "cpu"], capsys, out)
    assert "episode 2: 'relation' " in err and words in err
    assert "give one distinct relation id string per way" in err


@pytest.mark.parametrize(("text", "words"), [
    ('["P17"]', "expected a JSON object"),
    ('{"P17": []}', "'P17' is not [name, description]"),
    ('{"P17": [3, "x"]}', "'P17' is not [name, description]"),
    ('{"P17": "country"}', "'P17' is not [name, description]"),
    ("{", "pid2name"),
])
def test_bad_pid2name_gives_one_error_line(root, capsys, text, words):
    _make(root, episodes=2)
    (root / "p2n.json").write_text(text)
    out, p2n = root / "bad_pred.json", str(root / "p2n.json")
    argv = ["--checkpoint", str(tiny_checkpoint(root, "proto")), "--input",
            str(root / "test.json"), "--device", "cpu", "--pid2name", p2n]
    assert words in _error([*argv, "--out", str(out)], capsys, out)
    assert "is also --pid2name" in _error([*argv, "--out", p2n], capsys)
    assert (root / "p2n.json").read_text() == text


def test_pid2name_placeholder_is_no_description(tmp_path):
    """FewRel writes "No description defined" where Wikidata has none: not a description."""
    path = tmp_path / "pid2name.json"
    path.write_text(json.dumps({"P17": ["country", "No description defined"],
                                "P19": [" place of  birth ", "where\nborn"]}))
    assert read_pid2name(path) == {"P17": ("country", None),
                                   "P19": ("place of birth", "where born")}
