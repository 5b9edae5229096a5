"""Prediction throughput: ``Predictor.predict`` vs the raw encoder forward on the same sentences.

A 10-way 5-shot support set (10 relations of a split's test set, 5 sentences each) is
encoded once; then ``--queries`` sentences (the split's train, val and test sentences, cycled)
are predicted in chunks, as ``regrab-predict`` does. The peer is the encoder alone: the plain
forward (``SentenceEncoder.forward``, whole model, batches of the same size, sorted by length
as ``predict`` sorts them) on the same query sentences, i.e. the floor any predictor pays.

The checkpoint is ``--checkpoint`` when given
(e.g. ``models/nyt25/split_0/regrab/model.safetensors``),
otherwise an untrained REGRAB built from ``params.yaml``'s ``model`` section and the relation
graph in ``data/`` (speed does not depend on the weights).

Usage:
    python benchmarks/bench_predict.py [--queries 10000] [--threads 2] [--checkpoint PATH]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from model.files.checkpoint import Checkpoint, save_checkpoint
from model.methods.registry import build_model, config_for_method
from model.predict.predictor import Predictor
from model.predict.sentences import parse_sentence, sentences_table
from model.prior.graph import RelationGraph
from pipeline.io import read_parquet
from pipeline.schemas import FEWSHOT_SCHEMA


def untrained_checkpoint(folder: Path, data: Path) -> Path:
    """An untrained REGRAB checkpoint with the project's config and relation graph."""
    params = yaml.safe_load(Path("params.yaml").read_text())
    graph = RelationGraph.from_tables(read_parquet(data / "graph" / "graph.parquet"),
                                      read_parquet(data / "features" / "transe.parquet"))
    model = build_model(config_for_method(params["model"], "regrab"), graph)
    path = folder / "model.safetensors"
    save_checkpoint(path, Checkpoint.of(model, step=0))
    return path


def test_support(split: Path, ways: int = 10, shots: int = 5) -> dict[str, list[dict]]:
    """The first ``shots`` test sentences of each of the first ``ways`` test relations of a
    split (sorted by id): the support set the prediction benchmarks set once."""
    rows = read_parquet(split / "test.parquet", FEWSHOT_SCHEMA).to_pylist()
    relations = sorted({r["relation"] for r in rows})[:ways]
    return {r: [x for x in rows if x["relation"] == r][:shots] for r in relations}


def cpu_predictor(checkpoint: Path | None, data: Path, seed: int, batch_size: int) -> Predictor:
    """A CPU predictor of ``checkpoint``, or of :func:`untrained_checkpoint` when None."""
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint or untrained_checkpoint(Path(tmp), data)
        return Predictor.from_checkpoint(ckpt, "cpu", seed=seed, batch_size=batch_size)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", type=Path, default=Path("data/splits/split_0"))
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--queries", type=int, default=10000)
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    support = test_support(args.split)
    used = {x["instance_id"] for s in support.values() for x in s}
    pool = [x for part in ("train", "val", "test") for x in read_parquet(
        args.split / f"{part}.parquet", FEWSHOT_SCHEMA).to_pylist() if x["instance_id"] not in used]
    queries = [parse_sentence(pool[i % len(pool)]) for i in range(args.queries)]

    predictor = cpu_predictor(args.checkpoint, args.data, 0, args.batch_size)
    t0 = time.perf_counter()
    predictor.set_support(support)
    t_support = time.perf_counter() - t0

    t0 = time.perf_counter()
    probs = [predictor.predict(queries[s : s + args.chunk]).probs
             for s in range(0, len(queries), args.chunk)]
    t_predict = time.perf_counter() - t0
    assert np.allclose(np.concatenate(probs).sum(1), 1.0)

    encoder = predictor.model.encoder.eval()
    t0 = time.perf_counter()
    tokens = encoder.tokenize(sentences_table(queries))
    order = np.argsort([len(x) for x in tokens.ids], kind="stable")
    with torch.no_grad():
        for s in range(0, len(order), args.batch_size):
            encoder(tokens.batch(order[s : s + args.batch_size]))  # (B, D)
    t_raw = time.perf_counter() - t0

    cfg = predictor.model.config
    n = len(queries)
    print(f"checkpoint: {'untrained ' if args.checkpoint is None else ''}{cfg.method}, encoder "
          f"{cfg.encoder.name}, S={cfg.langevin.samples}, threads={torch.get_num_threads()}")
    print(f"support 10-way 5-shot encoded once: {t_support:.2f} s")
    print(f"predict {n} queries: {t_predict:.1f} s -> {n / t_predict:.0f} sentences/s")
    print(f"raw encoder forward, same sentences: {t_raw:.1f} s -> {n / t_raw:.0f} sentences/s")
    print(f"predict / raw encoder speed: {t_raw / t_predict:.2f}")


if __name__ == "__main__":
    main()
