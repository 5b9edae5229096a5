"""Tiny inputs for the model and stage tests: a random 2-layer BERT, toy splits, toy graph;
and what the tests of the few-shot methods share (registering a method, training and
evaluating it end to end, checks of per-candidate-way heads such as ``gnn`` and ``snail``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.io import write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA, GRAPH_SCHEMA, RELATIONS_SCHEMA, embeddings_schema

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[", "]", "{", "}", "<", ">"]
WORDS = [f"w{i}" for i in range(30)] + [f"verb{i}" for i in range(10)] + ["the", "of", "."]


def tiny_encoder(folder: Path, layers: int = 2, hidden: int = 32) -> Path:
    """Save a random BertModel and a word-level tokenizer into ``folder``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    BertTokenizer(vocab=vocab, do_lower_case=True).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=hidden,
                        num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=128)
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    return folder


def toy_table(relations: list[str], per_relation: int, seed: int) -> pa.Table:
    """Sentences whose relation shows in a verb word, entities at random places."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in relations:
        verb = f"verb{int(r[1:]) % 10}"
        for i in range(per_relation):
            words = [f"w{j}" for j in rng.integers(0, 30, size=int(rng.integers(6, 12)))]
            h = int(rng.integers(0, len(words) - 3))
            words.insert(h + 2, verb)
            t = h + 3
            rows.append({"instance_id": f"{r}-{seed}-{i}", "relation": r, "relation_name": r,
                         "tokens": words, "head_start": h, "head_end": h + 1 + (i % 2),
                         "tail_start": t, "tail_end": t + 1, "head_id": "Q1", "tail_id": "Q2"})
    return pa.Table.from_pylist(rows, schema=FEWSHOT_SCHEMA)


def toy_splits(folder: Path, n_splits: int = 1, per_relation: int = 12) -> Path:
    """split_i/{train,val,test}.parquet with 3 / 2 / 3 relations."""
    for s in range(n_splits):
        parts = {"train": ["P1", "P2", "P3"], "val": ["P4", "P5"], "test": ["P6", "P7", "P8"]}
        for name, rels in parts.items():
            write_parquet(toy_table(rels, per_relation, seed=s * 10 + len(name)),
                          folder / f"split_{s}" / f"{name}.parquet", FEWSHOT_SCHEMA)
    return folder


def toy_graph(folder: Path, relations: list[str] | None = None, dim: int = 8) -> tuple[Path, Path]:
    """A ring graph over ``relations`` (default P1..P9) with random features.

    Also writes ``relations.parquet`` (their labels, :func:`labels_of`) next to the graph.
    """
    relations = relations or [f"P{i}" for i in range(1, 10)]
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(len(relations), dim)).astype(np.float32)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1)), dim)
    fpath, gpath = folder / "features.parquet", folder / "graph.parquet"
    write_parquet(pa.table({"relation": relations, "embedding": emb}), fpath,
                  embeddings_schema(dim))
    src, dst = [], []
    for i, r in enumerate(relations):
        j = relations[(i + 1) % len(relations)]
        src += [r, j]
        dst += [j, r]
    write_parquet(pa.table({"src": src, "dst": dst,
                            "weight": pa.array([1.0] * len(src), pa.float32())}),
                  gpath, GRAPH_SCHEMA)
    n = len(relations)
    write_parquet(pa.table({"relation": relations,
                            "label": [f"verb{i % 10} the w{i}" for i in range(n)],
                            "triple_count": [1] * n,
                            "description": [f"the w{i} of the subject" if i % 2 else None
                                            for i in range(n)],
                            "aliases": [[] for _ in range(n)],
                            "label_source": ["pid2name"] * n,
                            "description_source": [("pid2name" if i % 2 else None)
                                                   for i in range(n)]},
                           schema=RELATIONS_SCHEMA),
                  labels_of(gpath), RELATIONS_SCHEMA)
    return gpath, fpath


def labels_of(graph: Path) -> Path:
    """The relations table :func:`toy_graph` wrote next to ``graph``."""
    return Path(graph).parent / "relations.parquet"


def toy_project(root: Path, n_splits: int = 1) -> tuple[Path, Path, Path, Path]:
    """Everything ``train`` reads, under ``root``: (encoder, splits, graph, features)."""
    enc = tiny_encoder(root / "bert")
    splits = toy_splits(root / "splits", n_splits=n_splits)
    graph, features = toy_graph(root)
    return enc, splits, graph, features


def toy_train_sections(enc: Path) -> dict:
    """``params.yaml`` sections that train a toy project's regrab and proto in seconds (for
    :func:`tests.conftest.project_params`)."""
    return {
        "model": {"encoder": {"name": str(enc), "train_layers": 1, "freeze_top_kv": True,
                              "normalize": 5.0}, "langevin": {"samples": 2, "steps": 2}},
        "train": {"methods": ["regrab", "proto"], "steps": 2, "ways": [2, 3], "shots": [1, 2],
                  "queries": 2, "val_every": 2, "val_episodes": 3, "val_settings": ["2w1s"],
                  "dvclive": False, "device": "cpu"},
        "evaluate": {"queries": 2, "device": "cpu"},
    }


@contextmanager
def registered(*methods):
    """Register ``methods`` (:class:`model.methods.registry.Method`) for the length of a test.

    The registry is loaded first, so they take the last places, as one more module in
    ``registry.MODULES`` would give them. Afterwards the methods that were not registered
    before are removed again; those already there (their module is in ``MODULES``) stay.
    """
    from model.methods import registry

    before = registry.names()
    for method in methods:
        registry.register(method)
    try:
        yield methods
    finally:
        for method in methods:
            if method.name not in before:
                registry._REGISTRY.pop(method.name)


def train_evaluate_reload(root: Path, methods: list[str],
                          settings: tuple[str, ...] = ("2w1s", "3w2s"), **train):
    """Train ``methods`` for 3 steps with the tiny encoder on the toy project under ``root``
    (``stages.train``), load the first one back from its checkpoint, and evaluate them all on
    ``settings`` (``stages.evaluate``).

    ``train`` overrides keys of the train section (e.g. ``ways=[2], shots=[1]``). Returns
    the reloaded model of ``methods[0]`` and the metrics; the models are in ``root/models``.
    """
    import yaml

    from model.files.loader import load_model
    from stages import evaluate
    from stages import train as train_stage
    from tests.conftest import project_params

    enc, splits, graph, features = toy_project(root)
    params = project_params(**{
        "model": {"encoder": {"name": str(enc), "train_layers": 1, "freeze_top_kv": True,
                              "normalize": 5.0}},
        "train": {"methods": list(methods), "steps": 3, "queries": 2, "ways": [2, 3],
                  "shots": [1, 2], "val_every": 3, "val_episodes": 3, "val_settings": ["2w1s"],
                  "dvclive": False, "device": "cpu", **train},
        "evaluate": {"methods": list(methods), "settings": list(settings), "episodes": 5,
                     "queries": 2, "device": "cpu", "nota_rates": []},
    })
    p = root / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    models = root / "models"
    train_stage.main(["--splits", str(splits), "--graph", str(graph), "--features",
                      str(features), "--relations", str(labels_of(graph)), "--out", str(models),
                      "--params", str(p)])
    model, _ = load_model(models / "split_0" / methods[0] / "model.safetensors")
    metrics = evaluate.main([
        "--splits", str(splits), "--models", str(models), "--metrics", str(root / "m.json"),
        "--plot", str(root / "p.png"), "--params", str(p)])
    return model, metrics


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread: for tiny tensors a second thread only adds waits (on a busy
    machine, a time slice per operation when the other thread is descheduled)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def random_episode(n: int, k: int, q: int, dim: int = 8, b: int = 2, seed: int = 1):
    """Random float64 support (B, N, K, D) and queries (B, Q, D)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, n, k, dim, generator=g, dtype=torch.double),
            torch.randn(b, q, dim, generator=g, dtype=torch.double))


class CandidateWayHeadChecks:
    """Checks every head that scores each candidate way in its own graph or sequence
    (``gnn``, ``snail``) passes. A test module subclasses it as ``Test...`` and sets:

    * ``head(dim=8, **sizes)``: a float64 head of encoding size ``dim``, seeded;
    * ``one_episode_per_chunk()``: a float64 head of D = 8 whose chunks hold one episode;
    * ``learner()``: a small float32 head of D = 16 (built after ``torch.manual_seed(0)``);
    * ``ways_shots``: the (N, K) of :meth:`test_any_ways_and_shots_and_chunks_are_exact`.
    """

    ways_shots: list[tuple[int, int]] = []

    def test_it_is_a_head_whose_ways_are_coupled(self):
        from model.methods.base import Head

        h = self.head()
        assert isinstance(h, Head) and h.couples_ways and h.prior is None

    @pytest.mark.parametrize("n, k", [(4, 1), (4, 3), (2, 1)])
    def test_predictions_are_equivariant_to_permuting_the_ways(self, n, k):
        import torch

        h = self.head()
        support, query = random_episode(n, k, 5)
        log_p = h.log_predictive(support, query)
        for perm in (torch.randperm(n, generator=torch.Generator().manual_seed(s))
                     for s in range(3)):
            permuted = h.log_predictive(support[:, perm], query)
            torch.testing.assert_close(permuted, log_p[..., perm])
        shots = torch.randperm(k, generator=torch.Generator().manual_seed(5))
        torch.testing.assert_close(h.log_predictive(support[:, :, shots], query), log_p)
        # The property is not trivial: ways get different scores, so the labels are read.
        swapped = torch.arange(n).roll(1)
        assert not torch.allclose(log_p[..., swapped], log_p, atol=1e-3)

    def test_predictions_do_not_depend_on_other_queries(self):
        import torch

        h = self.head()
        support, query = random_episode(3, 2, 6)
        log_p = h.log_predictive(support, query)
        for j in range(6):
            torch.testing.assert_close(h.log_predictive(support, query[:, j:j + 1])[:, 0],
                                       log_p[:, j])
        other = query.clone()
        other[:, 1:] = torch.randn_like(other[:, 1:]) * 3
        torch.testing.assert_close(h.log_predictive(support, other)[:, 0], log_p[:, 0])

    def test_any_ways_and_shots_and_chunks_are_exact(self):
        """Three episodes of 7 queries for each (N, K): a finite predictive of the right shape
        that sums to 1, and the same from a head of the same weights that takes one episode
        per chunk."""
        import torch

        h = self.head()
        small = self.one_episode_per_chunk()
        small.load_state_dict(h.state_dict())
        for n, k in self.ways_shots:
            support, query = random_episode(n, k, 7, b=3)
            log_p = h.log_predictive(support, query)
            assert log_p.shape == (3, 7, n) and torch.isfinite(log_p).all()
            assert h.sample_logits(support, query).shape == (3, 1, 7, n)
            torch.testing.assert_close(log_p.exp().sum(-1),
                                       torch.ones(3, 7, dtype=torch.double))
            torch.testing.assert_close(small.log_predictive(support, query), log_p)

    def test_zero_shots_are_refused(self):
        from pipeline.errors import PipelineError

        support, query = random_episode(3, 0, 2)
        with pytest.raises(PipelineError, match="K >= 1"):
            self.head().log_predictive(support, query)

    def test_it_learns_to_classify_by_the_support_labels(self):
        """Episodes of fresh random classes: only reading which support has which label
        helps. 60 Adam steps on 3-way 2-shot episodes, then 5-way 1-shot ones (an N and K
        it did not train on)."""
        import torch
        from torch.nn import functional

        torch.manual_seed(0)
        h = self.learner()
        opt = torch.optim.Adam(h.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(0)

        def batch(n=3, k=2, q=4, b=8):
            centers = torch.randn(b, n, 1, 16, generator=g) * 2
            support = centers + 0.3 * torch.randn(b, n, k, 16, generator=g)
            y = torch.randint(n, (b, q), generator=g)
            query = centers[torch.arange(b)[:, None], y, 0] + 0.3 * torch.randn(b, q, 16,
                                                                                generator=g)
            return support, query, y

        for _ in range(60):
            support, query, y = batch()
            loss = functional.nll_loss(h.log_predictive(support, query).reshape(-1, 3),
                                       y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            support, query, y = batch(n=5, k=1, q=10, b=20)  # unseen N and K
            acc = (h.log_predictive(support, query).argmax(-1) == y).double().mean()
        assert acc > 0.8
