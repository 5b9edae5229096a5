"""Frozen encoders side by side on NYT-25: encoding speed and untrained proto accuracy.

Every encoder gets the project's SentenceEncoder (entity markers, marker pooling,
``train_layers: 0``), the same sentences and the same episodes. For each it prints sentences
per second through :func:`model.encoder.frozen_cache.encode_all` on this machine's CPU threads, and
the accuracy of Euclidean prototypes (``proto``'s head with no training) and of cosine
prototypes on ``--episodes`` 5-way 1-shot and 5-shot episodes over all 25 NYT relations (no
split: nothing is trained, so no relation is seen before its episodes).

Usage: python -m benchmarks.bench_encoders --encoders minilm mpnet [--per-relation 40]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from model.encoder.frozen_cache import encode_all
from model.encoder.sentence import EncoderConfig, SentenceEncoder
from model.episodes import EpisodeSampler, episode_accuracy, mean_ci95
from model.methods.base import PrototypeHead
from pipeline.fewrel import convert


def _nyt_table(path: Path, per_relation: int, seed: int):
    """NYT-25 as a FEWSHOT_SCHEMA table, ``per_relation`` sentences of each relation."""
    table, _ = convert("val_nyt", json.loads(path.read_text()), {})
    rng = np.random.default_rng(seed)
    rel = np.asarray(table.column("relation").to_pylist())
    keep = np.concatenate([rng.permutation(np.flatnonzero(rel == r))[:per_relation]
                           for r in sorted(set(rel))])
    return table.take(np.sort(keep))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--encoders", nargs="+", default=["minilm", "mpnet"])
    mirror = os.environ.get("REGRAB_DATA_MIRROR", "data/raw")
    parser.add_argument("--nyt", type=Path, default=Path(mirror) / "fewrel" / "val_nyt.json")
    parser.add_argument("--per-relation", type=int, default=40)
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--queries", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    table = _nyt_table(args.nyt, args.per_relation, seed=0)
    sampler = EpisodeSampler(table.column("relation").to_pylist(), "NYT-25")
    settings = [(5, 1), (5, 5)]
    episodes = {f"{n}w{k}s": sampler.sample(np.random.default_rng([0, n, k]), n, k,
                                            args.queries, args.episodes) for n, k in settings}
    rows = torch.full((len(sampler.relations),), -1)
    heads = {"euclid": PrototypeHead("euclidean", 1.0), "cosine": PrototypeHead("dot", 1.0)}
    print(f"{table.num_rows} sentences, {args.episodes} episodes per setting, "
          f"{torch.get_num_threads()} threads")
    for name in args.encoders:
        cfg = EncoderConfig(name=name, pooling="markers", markers=True, marker_init="tokens",
                            train_layers=0, max_length=128, dropout=0.0, freeze_top_kv=False,
                            normalize=0.0, block_norm=False)
        encoder = SentenceEncoder.from_config(cfg).eval()
        tokens = encoder.tokenize(table)
        t0 = time.perf_counter()
        enc = encode_all(encoder, tokens, None, args.batch)  # (n, D)
        rate = table.num_rows / (time.perf_counter() - t0)
        unit = torch.nn.functional.normalize(enc, dim=-1)
        parts = []
        for setting, eps in episodes.items():
            for label, head in heads.items():
                x = unit if label == "cosine" else enc
                mean, ci = mean_ci95(episode_accuracy(head, x, eps, rows))
                parts.append(f"{setting} {label} {mean:5.2f}+-{ci:.2f}")
        params = sum(p.numel() for p in encoder.parameters()) / 1e6
        print(f"{name:8s} {params:6.1f}M params  D={encoder.out_dim:5d}  {rate:7.1f} sent/s  "
              + "  ".join(parts), flush=True)


if __name__ == "__main__":
    main()
