"""Tiny inputs for the model and stage tests: a random 2-layer BERT, toy splits, toy graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

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
    write_parquet(pa.table({"relation": relations,
                            "label": [f"verb{i % 10} the w{i}" for i in range(len(relations))],
                            "triple_count": [1] * len(relations)}),
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
