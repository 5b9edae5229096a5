import logging

import pyarrow as pa
import pytest
import torch

from model.prior.gcn import GraphPrior, GraphPriorConfig
from model.prior.graph import RelationGraph
from model.prior.labels import label_sentence, relation_name
from model.prior.mix import fit_mix
from pipeline.errors import PipelineError
from pipeline.schemas import FEWSHOT_SCHEMA, GRAPH_SCHEMA, RELATIONS_SCHEMA


def _config(layers=1, hidden=5, kind="gcn", text=False, descriptions=False, mix="fixed",
            named="graph_mean"):
    """A full GraphPriorConfig (the dataclass has no defaults)."""
    return GraphPriorConfig(kind=kind, layers=layers, hidden=hidden, normalize_features=True,
                            scale=1.0, text=text, descriptions=descriptions, mix=mix,
                            zero_shot_mean=False, named=named)


def _graph(dim=6):
    rel = ["P1", "P2", "P3", "P4"]
    feats = torch.randn(4, dim, generator=torch.Generator().manual_seed(0))
    features = pa.table({"relation": rel, "embedding": pa.FixedSizeListArray.from_arrays(
        pa.array(feats.numpy().reshape(-1)), dim)})
    edges = pa.table({"src": ["P1", "P2", "P2", "P3", "P9"], "dst": ["P2", "P1", "P3", "P2", "P1"],
                      "weight": pa.array([1.0, 1.0, 0.5, 0.5, 1.0], pa.float32())},
                     schema=GRAPH_SCHEMA)
    return RelationGraph.from_tables(edges, features), feats


def test_from_tables_drops_edges_to_unknown_nodes():
    g, feats = _graph()
    assert g.edge_index.shape == (2, 4)  # the P9 edge is gone
    assert torch.allclose(g.features, feats)


@pytest.mark.parametrize("layers", [1, 2])
def test_prior_shapes_and_fallback(layers):
    g, _ = _graph()
    prior = GraphPrior(_config(layers=layers, hidden=5), g, out_dim=10)
    rows = prior.index(["P2", "P77", "P1"])
    assert rows.tolist() == [1, -1, 0]
    h = prior(rows[None])
    assert h.shape == (1, 3, 10)
    assert torch.equal(h[0, 1], prior.fallback)
    assert prior.node_states().shape == (4, 10)
    h.sum().backward()  # gradients reach the GCN weights and the fallback
    # The fallback row is summed once per output dimension: its gradient is all ones.
    assert torch.equal(prior.fallback.grad, torch.ones(10))
    assert prior.convs[0].lin.weight.grad.abs().sum() > 0


def test_coverage_warns_and_falls_back(caplog):
    g, _ = _graph()
    prior = GraphPrior(_config(), g, out_dim=4)
    with caplog.at_level(logging.WARNING):
        assert prior.coverage(["P1", "P99"]) == ["P99"]
    assert "P99" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # another domain: every way gets the fallback
        assert prior.coverage(["P98", "P99"]) == ["P98", "P99"]
    assert "none of the 2" in caplog.text
    h = prior(prior.index(["P98", "P99"]))
    assert torch.equal(h, prior.fallback.expand(2, -1))


@pytest.mark.parametrize("layers", [1, 2])
def test_precomputed_propagation_equals_gcnconv(layers):
    g, _ = _graph()
    prior = GraphPrior(_config(layers=layers, hidden=5), g, out_dim=7)
    x = prior.features
    for i, conv in enumerate(prior.convs):
        x = conv(x, prior.edge_index, prior.edge_weight)
        if i < layers - 1:
            x = torch.relu(x)
    assert torch.allclose(prior.node_states(), x * prior.scale, atol=1e-5)
    rows = torch.tensor([[3, 0], [1, 1]])
    assert torch.allclose(prior(rows), (x * prior.scale)[rows], atol=1e-5)


@pytest.mark.parametrize("layers", [1, 2])
def test_mlp_prior_is_a_feed_forward_network_over_each_embedding(layers):
    g, feats = _graph()
    prior = GraphPrior(_config(layers=layers, kind="mlp"), g, out_dim=3)
    x = feats / feats.norm(dim=1, keepdim=True)
    for i, conv in enumerate(prior.convs):
        x = conv.lin(x) + conv.bias
        if i < layers - 1:
            x = torch.relu(x)
    assert torch.allclose(prior.node_states(), x, atol=1e-6)
    assert torch.allclose(prior(torch.tensor([0, 2])), x[[0, 2]], atol=1e-6)


def _labelled_graph(labels):
    g, _ = _graph()
    edges = pa.table({"src": ["P1"], "dst": ["P2"], "weight": pa.array([1.0], pa.float32())},
                     schema=GRAPH_SCHEMA)
    features = pa.table({"relation": g.relations, "embedding": pa.FixedSizeListArray.from_arrays(
        pa.array(g.features.numpy().reshape(-1)), g.features.shape[1])})
    relations = pa.table({"relation": list(labels), "label": list(labels.values()),
                          "triple_count": [1] * len(labels)},
                         schema=pa.schema([RELATIONS_SCHEMA.field(c) for c in
                                           ("relation", "label", "triple_count")]))
    return RelationGraph.from_tables(edges, features, relations)


def test_labels_follow_the_graph_order_and_blank_ones_are_none():
    g = _labelled_graph({"P3": "author", "P1": "place of birth", "P2": "  ", "P7": "x"})
    assert g.labels == ["place of birth", None, "author", None]
    with pytest.raises(PipelineError, match="labels none"):
        _labelled_graph({"P8": "x"})


def test_label_sentence_puts_the_label_between_the_entities():
    row = label_sentence("P19", "place of birth")
    assert row["tokens"] == ["subject", "place", "of", "birth", "object"]
    assert (row["head_start"], row["head_end"], row["tail_start"], row["tail_end"]) == (0, 1, 4, 5)


@pytest.mark.parametrize("layers", [1, 2])
def test_text_term_is_centred_gained_and_matches_fresh_encodings(layers):
    g = _labelled_graph({"P1": "a", "P3": "b c"})
    prior = GraphPrior(_config(layers=layers, text=True), g, out_dim=3)
    rows, table = prior.label_rows()
    assert rows == [0, 2] and table.column("relation").to_pylist() == ["P1", "P3"]
    enc = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    plain = GraphPrior(_config(layers=layers), g, out_dim=3)
    plain.load_state_dict({k: v for k, v in prior.state_dict().items()
                           if not k.startswith("text")})
    prior.set_text(rows, enc)
    with torch.no_grad():
        prior.text_gain.fill_(2.0)
    idx = torch.tensor([0, 1, 2])
    centred = torch.tensor([[-1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, -1.0]])
    expect = plain(idx) + 2.0 * centred  # the unlabelled P2 gets no text term
    assert torch.allclose(prior(idx), expect, atol=1e-6)
    assert torch.allclose(prior.node_states()[idx], expect, atol=1e-6)
    fresh = torch.tensor([[1.0, 2.0, 3.0], [float("nan")] * 3, [3.0, 2.0, 1.0]],
                         requires_grad=True)
    h = prior(idx, fresh)
    assert torch.allclose(h, expect, atol=1e-6)
    h.sum().backward()
    assert fresh.grad[0].abs().sum() > 0
    # The gain reaches the sum only through centred terms, which add up to zero.
    assert torch.equal(prior.text_gain.grad, torch.zeros_like(prior.text_gain))


def test_text_buffer_travels_in_the_state_dict_without_labels():
    g = _labelled_graph({"P1": "a", "P2": "b"})
    prior = GraphPrior(_config(text=True), g, out_dim=3)
    prior.set_text(*[prior.label_rows()[0], torch.randn(2, 3)])
    bare = RelationGraph(g.relations, torch.zeros_like(g.features), g.edge_index, g.edge_weight)
    loaded = GraphPrior(_config(text=True), bare, out_dim=3)
    loaded.load_state_dict(prior.state_dict(), strict=True)
    loaded.features.copy_(prior.features)
    loaded.propagated.copy_(prior.propagated)
    assert torch.allclose(loaded.node_states(), prior.node_states())
    with pytest.raises(PipelineError, match="--relations"):
        loaded.label_rows()


@pytest.mark.parametrize("key, name", [
    ("gene_found_in_organism", "gene found in organism"),
    ("Cause-Effect(e1,e2)", "cause effect"),
    ("Entity-Destination(e2, e1)", "entity destination"),
    ("place of birth", "place of birth"),
    ("P17", None),
    ("3", None),
    ("Q42", None),
    ("(e1,e2)", None),
])
def test_relation_names_are_read_from_keys(key, name):
    assert relation_name(key) == name


def _tiny_encoder(tmp_path):
    from model.encoder.sentence import EncoderConfig, SentenceEncoder
    from tests.model.tiny_regrab import tiny_encoder

    cfg = EncoderConfig(name=str(tiny_encoder(tmp_path / "bert")), pooling="markers",
                        markers=True, marker_init="tokens", train_layers=0, max_length=32,
                        dropout=0.0, freeze_top_kv=False, normalize=0.0, block_norm=False)
    return SentenceEncoder.from_config(cfg).eval()


def test_named_relations_outside_the_graph_get_a_label_prior(tmp_path):
    encoder = _tiny_encoder(tmp_path)
    g = _labelled_graph({"P1": "w1", "P2": "w2 w3"})
    prior = GraphPrior(_config(text=True, named="fallback"), g, out_dim=encoder.out_dim)
    prior.set_text([0, 1], torch.randn(2, encoder.out_dim, generator=torch.Generator()
                                       .manual_seed(1)))
    with torch.no_grad():
        prior.text_gain.fill_(1.5)
        prior.fallback.normal_()
    prior.add_names({"P1": "ignored: in the graph", "w4_w5(e1,e2)": "w4 w5", "P99": None},
                    encoder)
    assert prior.named == ["w4_w5(e1,e2)"]
    rows = prior.index(["P1", "w4_w5(e1,e2)", "P99", "P3"])
    assert rows.tolist() == [0, 4, -1, 2]
    assert [prior.prior_kind(r) for r in ("P1", "w4_w5(e1,e2)", "P99", "P3")] == [
        "graph", "label", "fallback", "graph"]
    # Independently: the name's template sentence through the encoder, centred, gained.
    table = pa.Table.from_pylist([label_sentence("x", "w4 w5")], schema=FEWSHOT_SCHEMA)
    with torch.no_grad():
        e = encoder(encoder.tokenize(table).batch([0]))[0]
    expect = prior.fallback + 1.5 * (e - prior.text_mean)
    h = prior(rows)
    assert torch.allclose(h[1], expect, atol=1e-5)
    assert torch.equal(h[2], prior.fallback)
    states = prior.node_states()
    assert states.shape[0] == 5 and torch.allclose(states[rows[[0, 1, 3]]], h[[0, 1, 3]])
    # Naming again replaces the names; a graph-only prior reads none.
    prior.add_names({}, encoder)
    assert prior.index(["w4_w5(e1,e2)"]).tolist() == [-1] and prior.node_states().shape[0] == 4
    plain = GraphPrior(_config(), g, out_dim=encoder.out_dim)
    plain.add_names({"w4_w5": "w4 w5"}, encoder)
    assert plain.prior_kind("w4_w5") == "fallback"


@pytest.mark.parametrize("mix", ["fixed", "heldout"])
def test_named_relations_sit_where_the_graph_relations_do(tmp_path, mix):
    """``named: graph_mean``: a named relation's prior is the graph term's mean over the graph
    plus its label term, not the fallback vector (which only relations absent from the
    training graph train); an unnamed unknown relation keeps the fallback."""
    encoder = _tiny_encoder(tmp_path)
    g = _labelled_graph({"P1": "w1", "P2": "w2 w3"})
    prior = GraphPrior(_config(text=True, mix=mix), g, out_dim=encoder.out_dim).eval()
    prior.set_text([0, 1], torch.randn(2, encoder.out_dim, generator=torch.Generator()
                                       .manual_seed(1)))
    with torch.no_grad():
        prior.text_gain.fill_(1.5)
        prior.fallback.normal_()
        prior.convs[0].bias.add_(3.0)  # the graph term far from the fallback
        if mix == "heldout":
            prior.mix.copy_(torch.tensor([0.5, 0.75]))
    prior.add_names({"w4_w5": "w4 w5"}, encoder)
    with torch.no_grad():
        graph_term = prior.node_states()[:4] - prior._label_gain() * prior.text
        rows = prior.index(["w4_w5", "P99"])
        h = prior(rows)
    table = pa.Table.from_pylist([label_sentence("x", "w4 w5")], schema=FEWSHOT_SCHEMA)
    with torch.no_grad():
        e = encoder(encoder.tokenize(table).batch([0]))[0]
    gain = 1.5 * (0.75 if mix == "heldout" else 1.0)
    expect = graph_term.mean(0) + gain * (e - prior.text_mean)
    assert torch.allclose(h[0], expect, atol=1e-5)
    assert torch.allclose(prior.node_states()[4], expect, atol=1e-5)
    assert not torch.allclose(h[0], prior.fallback + gain * (e - prior.text_mean), atol=1e-2)
    assert torch.equal(h[1], prior.fallback)


def _mixed_prior(layers=1):
    g = _labelled_graph({"P1": "a", "P2": "b", "P3": "b c"})
    prior = GraphPrior(_config(layers=layers, text=True, mix="heldout"), g, out_dim=3)
    prior.set_text([0, 1, 2], torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    return prior


@pytest.mark.parametrize("layers", [1, 2])
def test_heldout_mix_weights_the_graph_deviation_and_the_label_only_outside_training(layers):
    prior = _mixed_prior(layers)
    idx = torch.tensor([0, 1, 2, 3])
    trained = prior(idx).detach()
    with torch.no_grad():
        prior.mix.copy_(torch.tensor([0.0, 0.5]))
    assert torch.allclose(prior(idx), trained)  # training mode: h_r as trained
    graph_term = (prior.node_states() - prior.text_gain * prior.text).detach()  # (R, D)
    expect = graph_term.mean(0) + 0.5 * prior.text_gain.detach() * prior.text[idx]
    prior.eval()
    with torch.no_grad():
        assert torch.allclose(prior(idx), expect, atol=1e-6)  # (0, .5): centre + half label
        assert torch.allclose(prior.node_states(), expect, atol=1e-6)
        prior.mix.copy_(torch.tensor([1.0, 1.0]))
        assert torch.allclose(prior(idx), trained, atol=1e-6)  # (1, 1): as trained


def test_fit_mix_picks_the_weights_that_read_held_out_sentences_best():
    torch.manual_seed(0)
    prior = _mixed_prior()
    with torch.no_grad():  # a graph term that points the wrong way, a label term that is right
        prior.convs[0].lin.weight.mul_(20.0)
    prior.eval()
    rows = torch.tensor([0, 1, 2])
    with torch.no_grad():
        prior.mix.copy_(torch.tensor([0.0, 1.0]))
        label_only = prior(rows)
    groups = [label_only[i] + 0.05 * torch.randn(6, 3) for i in range(3)]
    prior.train()
    weights = fit_mix(prior, groups, rows, temperature=1.0)
    assert weights[0] == 0.0  # the graph term is dropped
    assert prior.training  # the mode it was called in is restored
    plain = GraphPrior(_config(text=True), _labelled_graph({"P1": "a"}), out_dim=3)
    assert fit_mix(plain, groups, rows, 1.0) is None  # mix: fixed chooses nothing
    assert "mix" not in plain.state_dict()


def test_kind_none_reads_no_graph_only_the_label():
    g = _labelled_graph({"P1": "a", "P2": "b", "P3": "b c"})
    prior = GraphPrior(_config(kind="none", text=True), g, out_dim=3)
    prior.start_at(torch.tensor([1.0, 2.0, 3.0]))
    prior.set_text([0, 1, 2], torch.eye(3))
    idx = torch.tensor([0, 1, 2, 3])
    expect = torch.tensor([1.0, 2.0, 3.0]) + prior.text_gain * prior.text[idx]
    assert torch.allclose(prior(idx), expect, atol=1e-6)  # b + g (e_r - mean), no graph
