import math

import numpy as np
import pytest
import torch

from model.encoder.frozen_cache import LowerCache, encode_all
from model.episodes import Episodes, episode_accuracy, gather_episodes
from model.evaluation.uncertainty import POINT_SCORES, SCORES, uncertainty_scores
from model.files.checkpoint import Checkpoint, save_checkpoint
from model.methods.registry import build_model
from model.posterior.logits import similarity_logits
from model.predict.predictor import NonFinite, Predictor
from model.predict.sentences import Sentence, parse_marked_text, parse_sentence
from model.prior.graph import RelationGraph
from pipeline.errors import PipelineError
from pipeline.io import read_parquet
from tests.conftest import model_config
from tests.model.tiny_regrab import labels_of, tiny_encoder, toy_graph, toy_table

RELATIONS = ["P6", "P7", "P8"]


def tiny_checkpoint(folder, method="regrab", prior=None, **langevin):
    """A tiny untrained checkpoint (random 2-layer BERT, ring graph over P1..P9); ``prior``
    overrides keys of ``model.prior`` (e.g. ``{"descriptions": True}``; names only by
    default)."""
    enc = folder / "bert"
    if not enc.exists():
        tiny_encoder(enc)
    gpath, fpath = toy_graph(folder)
    graph = RelationGraph.from_tables(read_parquet(gpath), read_parquet(fpath),
                                      read_parquet(labels_of(gpath)))
    cfg = model_config(method, encoder={"name": str(enc), "train_layers": 1},
                       langevin={"noise_eval": True, "likelihood": "gaussian", **langevin},
                       prior={"descriptions": False, **(prior or {})})  # names only unless asked
    torch.manual_seed(1)
    model = build_model(cfg, graph if method == "regrab" else None)
    with torch.no_grad():  # a prior away from zero, so the prior term matters
        for p in model.head.parameters():
            p.add_(0.3 * torch.randn_like(p))
    tag = "-".join(f"{k}{v}" for k, v in {**(prior or {}), **langevin}.items())
    path = folder / f"{method}-{tag}.pt"
    save_checkpoint(path, Checkpoint.of(model, step=0))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("predictor")


@pytest.fixture(scope="module")
def table():
    return toy_table(RELATIONS, 6, seed=3)


def _support(table, shots):
    rows = table.to_pylist()
    out = {}
    for r, k in zip(RELATIONS, shots, strict=True):
        out[r] = [x for x in rows if x["relation"] == r][:k]
    return out


def _queries(table, skip=3):
    """The sentences after the first ``skip`` of each relation, with their relations."""
    rows = table.to_pylist()
    picked = [x for r in RELATIONS for x in [y for y in rows if y["relation"] == r][skip:]]
    return picked, [x["relation"] for x in picked]


# --- sentence parsing -------------------------------------------------------------------------


def test_marked_text_parses_into_tokens_and_spans():
    s = parse_marked_text("[E1]Barack Obama[/E1] was born in [E2]Hawaii[/E2] .")
    assert s.tokens == ("Barack", "Obama", "was", "born", "in", "Hawaii", ".")
    assert s.head == (0, 2) and s.tail == (5, 6)
    assert s.marked() == "[E1]Barack Obama[/E1] was born in [E2]Hawaii[/E2] ."
    assert parse_marked_text(s.marked()) == s
    tail_first = parse_marked_text("in [e2] Hawaii [/e2] , [E1]Obama[/E1] was born")
    assert tail_first.tokens == ("in", "Hawaii", ",", "Obama", "was", "born")
    assert tail_first.head == (3, 4) and tail_first.tail == (1, 2)


@pytest.mark.parametrize("text, match", [
    ("Barack Obama was born in Hawaii .", "no entity markers"),
    ("[E1]Barack Obama was born in [E2]Hawaii[/E2] .", r"\[/E1\] is missing"),
    ("[E1]Obama[/E1] was born in Hawaii[/E2] .", r"\[E2\] is missing"),
    ("[E1]Obama[/E1] [E1]x[/E1] in [E2]Hawaii[/E2]", "occurs twice"),
    ("[E1][/E1] was born in [E2]Hawaii[/E2]", "encloses no word"),
    ("[/E1]Obama[E1] was born in [E2]Hawaii[/E2]", "encloses no word"),
])
def test_bad_markers_are_errors(text, match):
    with pytest.raises(PipelineError, match=match):
        parse_marked_text(text)


def test_fewrel_and_column_records():
    tokens = ["Obama", "was", "born", "in", "Honolulu", ",", "Hawaii"]
    rec = {"tokens": tokens, "h": ["Obama", "Q76", [[0]]], "t": ["Hawaii", "Q782", [[6]]]}
    assert parse_sentence(rec) == Sentence(tuple(tokens), (0, 1), (6, 7))
    two = {**rec, "t": ["Honolulu , Hawaii", "Q1", [[4, 5, 6]]]}
    assert parse_sentence(two).tail == (4, 7)
    cols = {"tokens": tokens, "head_start": 0, "head_end": 1, "tail_start": 4, "tail_end": 5}
    assert parse_sentence(cols).tail == (4, 5)
    with pytest.raises(PipelineError, match="outside the sentence"):
        parse_sentence({**rec, "t": ["x", "Q1", [[7]]]})
    with pytest.raises(PipelineError, match="outside the sentence"):
        parse_sentence({**cols, "head_start": -1})
    with pytest.raises(PipelineError, match="not a FewRel entity"):
        parse_sentence({**rec, "h": "Obama"})
    with pytest.raises(PipelineError, match="no entity spans"):
        parse_sentence({"tokens": tokens})
    with pytest.raises(PipelineError, match="no sentence"):
        parse_sentence({"relation": "P19"})


def test_predictions_carry_the_scores_of_the_uncertainty_module(folder, table):
    """A sampling head gets every score but the tempered ones (no validation temperature in
    an untrained checkpoint); a deterministic head the point scores, and no mutual
    information (0) in its records; the numbers are the uncertainty module's."""
    queries, _ = _queries(table)
    for method, want in (("regrab", [k for k in SCORES if not k.endswith("_ts")]),
                         ("proto", list(POINT_SCORES))):
        pred = Predictor.from_checkpoint(tiny_checkpoint(folder, method), seed=4)
        pred.set_support(_support(table, [2, 2, 2]))
        got = pred.predict(queries)
        assert list(got.scores) == want
        direct = uncertainty_scores(pred.sample_logits(pred.encode(queries)))
        for k in want:
            np.testing.assert_allclose(got.scores[k], direct[k].numpy(), rtol=1e-12)
        recs = got.records()
        assert all(r["entropy"] == pytest.approx(-sum(p * math.log(p) for p in
                                                       r["probabilities"].values() if p))
                   for r in recs)
        if method == "proto":
            assert all(r["mutual_information"] == 0.0 and r["top_logit_var"] is None
                       for r in recs)
        # No stored validation scores: no rule, so no abstain score and no abstention.
        assert all(r["abstain_score"] is None and not r["abstain"] for r in recs)
        # Each score written as what its name says: the top probability, the gap between the
        # two top ones, the largest (sample-averaged) logit; no name says the opposite.
        assert all(r["top_prob"] == pytest.approx(r["confidence"]) for r in recs)
        top_two = [sorted(r["probabilities"].values())[-2:] for r in recs]
        assert [r["top_gap"] for r in recs] == pytest.approx([b - a for a, b in top_two])
        logits = pred.sample_logits(pred.encode(queries)).double()  # (S, Q, N)
        mean_logit = torch.logsumexp(logits, 0) - math.log(logits.shape[0])
        assert [r["top_logit"] for r in recs] == pytest.approx(
            mean_logit.max(-1).values.tolist())
        assert not {"max_prob", "margin", "max_logit", "max_prob_ts"} & set(recs[0])


# --- predictions ------------------------------------------------------------------------------


def test_predict_matches_evaluate_on_the_same_episode(folder, table):
    """Same sentences, same generator seed: predict gives evaluate's predictive exactly."""
    path = tiny_checkpoint(folder)
    pred = Predictor.from_checkpoint(path, seed=11)
    support = _support(table, [2, 2, 2])
    queries, gold = _queries(table)
    pred.set_support(support)
    got = pred.predict(queries)

    # evaluate's path: one encoding of the split through the cache, then the episode.
    model = pred.model
    enc = encode_all(model.encoder, model.encoder.tokenize(table), LowerCache())
    ids = table.column("instance_id").to_pylist()
    sup_rows = np.array([[ids.index(x["instance_id"]) for x in support[r]] for r in RELATIONS])
    qry_rows = np.array([[ids.index(x["instance_id"]) for x in queries
                          if x["relation"] == r] for r in RELATIONS])
    ep = Episodes(np.arange(3)[None], sup_rows[None], qry_rows[None])
    sup, qry, labels = gather_episodes(enc, ep)
    head = model.head
    h = head.prior_means(head.prior_states(), model.rows(RELATIONS)[None])
    want = head.log_predictive(sup, qry, h, torch.Generator().manual_seed(11)).exp()[0].detach()
    assert got.relations == RELATIONS
    np.testing.assert_allclose(got.probs, want.numpy(), atol=1e-5)
    assert got.best == [RELATIONS[i] for i in want.argmax(-1)]
    acc = episode_accuracy(head, enc, ep, model.rows(RELATIONS),
                           generator=torch.Generator().manual_seed(11))
    assert acc[0] == pytest.approx(np.mean(np.array(got.best) == np.array(gold)))
    # a real posterior average: samples disagree a little, so the MI is positive
    assert (got.mutual_information > 0).all()
    assert np.allclose(got.probs.sum(1), 1.0)


def test_batches_and_seeds(folder, table):
    pred = Predictor.from_checkpoint(tiny_checkpoint(folder), seed=5)
    pred.set_support(_support(table, [2, 2, 2]))
    queries, _ = _queries(table)
    whole = pred.predict(queries)
    halves = [pred.predict(queries[:4]), pred.predict(queries[4:])]
    # equal up to the encoder's rounding (padding differs per batch) ...
    np.testing.assert_allclose(whole.probs, np.concatenate([p.probs for p in halves]),
                               atol=1e-6)
    # ... because the prototype samples are the same for every batch. Not bit for bit: the
    # products of 8 and of 4 queries may be summed in other orders (1 thread and 2 both
    # gave rows up to 3.8e-6 apart), while other samples move the logits by whole units.
    q = pred.encode(queries)
    torch.testing.assert_close(pred.sample_logits(q)[:, 4:], pred.sample_logits(q[4:]),
                               rtol=1e-6, atol=1e-4)
    other = Predictor(pred.model, seed=6)
    other.set_support(_support(table, [2, 2, 2]))
    assert not np.allclose(other.predict(queries).probs, whole.probs)
    assert (other.sample_logits(q) - pred.sample_logits(q)).abs().max() > 1e-2


def test_zero_shot_by_id(folder, table):
    pred = Predictor.from_checkpoint(tiny_checkpoint(folder), seed=2)
    queries, _ = _queries(table)
    summary = pred.set_support({}, zero_shot=RELATIONS)
    assert summary.zero_shot == RELATIONS and summary.used_shots == [0, 0, 0]
    got = pred.predict(queries)
    head, model = pred.model.head, pred.model
    q = pred.encode(queries)[None]
    h = head.prior_means(head.prior_states(), model.rows(RELATIONS)[None])
    want = head.log_predictive(torch.zeros(1, 3, 0, q.shape[-1]), q, h,
                               torch.Generator().manual_seed(2)).exp()[0].detach()
    np.testing.assert_allclose(got.probs, want.numpy(), atol=1e-6)
    # mixed: two relations with support, one by id only
    support = _support(table, [2, 2, 0])
    summary = pred.set_support({r: s for r, s in support.items() if s}, zero_shot=["P8"])
    assert summary.zero_shot == ["P8"] and "one episode" in summary.handling
    mixed = pred.predict(queries)
    assert np.allclose(mixed.probs.sum(1), 1.0)
    with pytest.raises(PipelineError, match="not in the checkpoint's relation graph"):
        pred.set_support({"P6": support["P6"]}, zero_shot=["P99"])
    with pytest.raises(PipelineError, match="also given as zero-shot"):
        pred.set_support(support, zero_shot=["P6"])
    proto = Predictor.from_checkpoint(tiny_checkpoint(folder, "proto"))
    with pytest.raises(PipelineError, match="lacks"):
        proto.set_support({"P6": support["P6"]}, zero_shot=["P7"])


def test_abstention(folder, table):
    queries, _ = _queries(table)
    pred = Predictor.from_checkpoint(tiny_checkpoint(folder), seed=0)
    pred.set_support(_support(table, [2, 2, 2]))
    conf = pred.predict(queries).confidence
    cut = float(np.median(conf))
    pred.threshold = cut
    got = pred.predict(queries)
    assert got.abstain.tolist() == (conf < cut).tolist() and 0 < got.abstain.sum() < len(conf)
    assert [lab is None for lab in got.labels] == got.abstain.tolist()
    kept = [b for b, a in zip(got.best, got.abstain, strict=True) if not a]
    assert [lab for lab in got.labels if lab] == kept
    recs = got.records()
    assert all(r["prediction"] is None for r in recs if r["abstain"])
    assert all(math.isclose(sum(r["probabilities"].values()), 1.0) for r in recs)
    with pytest.raises(PipelineError, match="threshold"):
        Predictor(pred.model, threshold=1.5)


def test_unequal_shots_are_one_episode_with_each_ways_own_posterior(folder, table):
    """A way's posterior reads its own support only: with the paper's fixed prior trust, one
    call on the padded support gives each way the logits it has alone."""
    queries, _ = _queries(table)
    pred = Predictor.from_checkpoint(tiny_checkpoint(folder, noise_eval=False,
                                                     prior_trust="fixed"), seed=0)
    support = _support(table, [1, 3, 2])
    summary = pred.set_support(support)
    assert summary.used_shots == [1, 3, 2] and "one episode" in summary.handling
    q = pred.encode(queries)
    mixed = pred.sample_logits(q)  # (1, Q, 3)
    for n, r in enumerate(RELATIONS):
        k = len(support[r])
        other = next(o for o in RELATIONS if o != r)
        alone = {r: support[r], other: (support[other] * 3)[:k]}
        pred.set_support(alone)
        torch.testing.assert_close(mixed[..., n], pred.sample_logits(q)[..., 0])

    # proto scored as trained (prototype_scoring: mean): the prototypes are the plain
    # support means, whatever each way's K
    proto = Predictor.from_checkpoint(tiny_checkpoint(folder, "proto", prototype_scoring="mean"))
    proto.set_support(support)
    got = proto.predict(queries)
    means = torch.stack([proto.encode(support[r]).mean(0) for r in RELATIONS])
    enc = proto.encode(queries)
    cfg = proto.model.config.langevin
    want = torch.softmax(similarity_logits(enc, means, cfg.similarity, cfg.temperature), -1)
    want = want.detach()
    np.testing.assert_allclose(got.probs, want.numpy(), atol=1e-5)  # float32 sums in another order
    assert np.all(got.mutual_information == 0)
    # Euclidean, K = 1: a support sentence is at distance 0 from its own prototype
    one = _support(table, [1, 1, 1])
    proto.set_support(one)
    assert proto.predict([one[r][0] for r in RELATIONS]).best == RELATIONS


def test_softmax_likelihood_oversamples_unequal_shots(folder, table):
    pred = Predictor.from_checkpoint(tiny_checkpoint(folder, likelihood="softmax"), seed=0)
    support = _support(table, [1, 3, 2])
    summary = pred.set_support(support)
    assert summary.used_shots == [1, 3, 2] and "repeated in order up to K=3" in summary.handling
    q = pred.encode(_queries(table)[0])
    got = pred.sample_logits(q)
    # the same as the support written out repeated
    pred.set_support({r: (s * 3)[:3] for r, s in support.items()})
    torch.testing.assert_close(got, pred.sample_logits(q))
    with pytest.raises(PipelineError, match="needs equal K"):
        pred.set_support(_support(table, [1, 3, 0]))


def test_bad_support_and_checkpoint(folder, table):
    pred = Predictor.from_checkpoint(tiny_checkpoint(folder))
    with pytest.raises(PipelineError, match="at least 2"):
        pred.set_support({"P6": _support(table, [2, 2, 2])["P6"]})
    with pytest.raises(PipelineError, match="list of sentences"):
        pred.set_support({"P6": "[E1]w1[/E1] verb6 [E2]w2[/E2]", "P7": []})
    with pytest.raises(PipelineError, match="no support set"):
        Predictor(pred.model).predict(["[E1]w1[/E1] verb6 [E2]w2[/E2]"])
    with pytest.raises(PipelineError, match="not found"):
        Predictor.from_checkpoint(folder / "missing.pt")
    (folder / "junk.pt").write_bytes(b"\x00garbage")
    with pytest.raises(PipelineError, match="unreadable"):
        Predictor.from_checkpoint(folder / "junk.pt")


def test_relations_outside_the_graph_are_read_by_name(folder, table):
    """A named relation the graph lacks gets a label prior; only a nameless one the fallback."""
    pred = Predictor.from_checkpoint(tiny_checkpoint(folder), seed=2)
    support = _support(table, [2, 2, 2])
    renamed = {"P6": support["P6"], "verb7_w1(e1,e2)": support["P7"], "Q77": support["P8"]}
    summary = pred.set_support(renamed)
    assert summary.priors == {"P6": "graph", "verb7_w1(e1,e2)": "label", "Q77": "fallback"}
    assert summary.fallback_prior == ["Q77"]
    line = next(x for x in summary.lines() if x.startswith("prior: "))
    assert "verb7_w1(e1,e2) label" in line and "P6 graph" in line
    # A name given explicitly wins; a bare property id is no name: fallback.
    summary = pred.set_support({"P6": support["P6"], "P99": support["P7"]})
    assert summary.priors["P99"] == "fallback"
    summary = pred.set_support({"P6": support["P6"], "P99": support["P7"]},
                               names={"P99": "verb7"})
    assert summary.priors["P99"] == "label"
    # Zero-shot from a name alone works; the prior mean is the one the head computes.
    summary = pred.set_support({"P6": support["P6"]}, zero_shot=["verb8_w2"])
    assert summary.priors["verb8_w2"] == "label" and summary.zero_shot == ["verb8_w2"]
    assert np.allclose(pred.predict(_queries(table)[0]).probs.sum(1), 1.0)


def _prior_means(pred):
    """The prior mean of every candidate of the support set last given (N, D)."""
    head, model = pred.model.head, pred.model
    return head.prior_means(head.prior_states(), model.rows(pred.relations)[None])[0]


def test_descriptions_reach_a_prior_that_reads_them(folder, table):
    """A described relation outside the graph: name+description when the checkpoint reads
    descriptions (and its prior mean moves), a name alone when it does not (the mean stays).
    The untrained checkpoint never encoded its graph's labels, so P6's prior reads no text."""
    support = _support(table, [2, 2, 2])
    renamed = {"P6": support["P6"], "Q7007": support["P7"], "Q8008": support["P8"]}
    names = {"Q7007": "verb7", "Q8008": "verb8 w1"}
    said = {"Q7007": "w3 of the w4; more words", "P6": "w5 w6"}
    reads = Predictor.from_checkpoint(tiny_checkpoint(folder, prior={"descriptions": True}))
    assert reads.model.prior.config.descriptions
    reads.set_support(renamed, names=names)
    plain = _prior_means(reads)
    summary = reads.set_support(renamed, names=names, descriptions=said)
    assert summary.priors == {"P6": "graph", "Q7007": "label", "Q8008": "label"}
    assert summary.texts == {"P6": "no text", "Q7007": "name+description", "Q8008": "name"}
    assert summary.text_counts == {"name+description": 1, "name": 1, "no text": 1}
    described = _prior_means(reads)
    assert not torch.allclose(described[1], plain[1])  # the description was read
    torch.testing.assert_close(described[[0, 2]], plain[[0, 2]])  # the others are as before
    lines = summary.lines()
    assert any(x.startswith("prior: P6 graph (no text), Q7007 label (name+description), "
                            "Q8008 label (name) (graph: ") for x in lines)
    assert "prior text: name+description 1, name 1, no text 1" in "\n".join(lines)
    # The graph's own label is read for P6, not the text given: a note says so.
    assert any(x.startswith("descriptions not read: P6 (in the checkpoint's relation graph")
               for x in lines)
    # A description with no name to follow (a bare id) is not read either.
    summary = reads.set_support({"P6": support["P6"], "Q77": support["P7"]},
                                descriptions={"Q77": "w3 w4"})
    assert summary.texts["Q77"] == "no text" and summary.priors["Q77"] == "fallback"
    assert any("Q77 (no name to read them after" in x for x in summary.notes)

    names_only = Predictor.from_checkpoint(tiny_checkpoint(folder))
    assert not names_only.model.prior.config.descriptions
    names_only.set_support(renamed, names=names)
    plain = _prior_means(names_only)
    summary = names_only.set_support(renamed, names=names, descriptions=said)
    assert summary.texts == {"P6": "no text", "Q7007": "name", "Q8008": "name"}
    assert summary.text_counts == {"name+description": 0, "name": 2, "no text": 1}
    torch.testing.assert_close(_prior_means(names_only), plain)
    assert any("Q7007 (the checkpoint's prior reads names only" in x for x in summary.notes)

    proto = Predictor.from_checkpoint(tiny_checkpoint(folder, "proto"))
    summary = proto.set_support(renamed, names=names, descriptions=said)
    assert summary.texts == {} and summary.text_counts == {}
    assert not any(x.startswith("prior") for x in summary.lines())
    assert any("has no prior to read them" in x for x in summary.notes)


def test_non_finite_weights_and_outputs_are_refused(folder, table):
    pred = Predictor.from_checkpoint(tiny_checkpoint(folder), seed=0)
    pred.set_support(_support(table, [2, 2, 2]))
    queries, _ = _queries(table)
    real = pred.sample_logits
    pred.sample_logits = lambda query: real(query).index_fill(1, torch.tensor([1]), math.inf)
    with pytest.raises(NonFinite, match=r"for 1 of \d+ queries \(the first: query 1 of the"):
        pred.predict(queries)
    model = pred.model
    with torch.no_grad():
        model.head.sampler.log_variance.fill_(math.nan)
    with pytest.raises(PipelineError, match="weight tensors hold NaN or inf .*log_variance"):
        Predictor(model)


def test_seed_and_batch_size_out_of_range(folder):
    model = Predictor.from_checkpoint(tiny_checkpoint(folder)).model
    for seed in (-1, 2**63):
        with pytest.raises(PipelineError, match=f"seed {seed} is out of range"):
            Predictor(model, seed=seed)
    with pytest.raises(PipelineError, match="batch size 0"):
        Predictor(model, batch_size=0)
    assert Predictor(model, seed=2**63 - 1).seed == 2**63 - 1
