"""Evaluation throughput: episodes from cached encodings vs re-encoding every episode.

Both paths use the same trained-style model (untrained weights: speed does not depend on
them) and the same 5-way 5-shot episodes (5 queries per way) of a real test split. The cached
path includes encoding the whole split once. The re-encoding path is timed on the first
``--reencode`` episodes and its predictive probabilities are checked equal to the cached
path's (to float32 rounding; argmax labels may flip on near ties, counted separately).

Usage:
    python benchmarks/bench_eval.py [--split data/splits/split_0] [--episodes 1000]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from model.encoder.frozen_cache import LowerCache, encode_all
from model.episodes import Episodes, EpisodeSampler, episode_accuracy, log_predictive_batches
from model.methods.registry import build_model, config_for_method
from pipeline.config import load_params
from pipeline.io import read_parquet
from pipeline.schemas import FEWSHOT_SCHEMA

#: Largest gap in any predictive probability that still counts as the same prediction.
PROB_TOLERANCE = 1e-4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", type=Path, default=Path("data/splits/split_0"))
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--reencode", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    table = read_parquet(args.split / "test.parquet", FEWSHOT_SCHEMA)
    relations = table.column("relation").to_pylist()
    section = load_params("params.yaml", "model")
    section["encoder"].update({"train_layers": 1, "freeze_top_kv": True})
    model = build_model(config_for_method(section, "regrab_no_prior"), None).eval()
    tokens = model.encoder.tokenize(table)
    sampler = EpisodeSampler(relations)
    episodes = sampler.sample(np.random.default_rng(0), 5, 5, 5, args.episodes)
    rows = torch.full((len(sampler.relations),), -1)

    with torch.no_grad():
        t0 = time.perf_counter()
        enc = encode_all(model.encoder, tokens, LowerCache())
        t1 = time.perf_counter()
        cached = episode_accuracy(model.head, enc, episodes, rows)
        t2 = time.perf_counter()
        re_logp = []
        t3 = time.perf_counter()
        for b in range(args.reencode):
            ids = np.concatenate([episodes.support[b].ravel(), episodes.query[b].ravel()])
            batch = tokens.batch(ids)
            local_enc = model.encoder(batch)  # the whole episode, end to end, no cache
            local = Episodes(episodes.relation[b:b + 1],
                             np.arange(25).reshape(1, 5, 5), 25 + np.arange(25).reshape(1, 5, 5))
            re_logp.append(next(log_predictive_batches(
                model.head, local_enc, local.relation, local.support, local.query, rows)))
        t4 = time.perf_counter()
        n = args.reencode
        cached_logp = next(log_predictive_batches(
            model.head, enc, episodes.relation[:n], episodes.support[:n], episodes.query[:n],
            rows, batch_size=n))  # (n, Q, N)
    re_logp_all = torch.cat(re_logp)  # (n, Q, N)
    cached_rate = args.episodes / (t2 - t0)
    re_rate = args.reencode / (t4 - t3)
    # Compare the predictive distributions, not argmax accuracies: the two paths sum in other
    # orders (batch shapes differ), so a near tie may flip a label without anything being
    # wrong; a real mismatch moves probabilities far beyond float32 rounding.
    gap = float((cached_logp.exp() - re_logp_all.exp()).abs().max())
    flips = int((cached_logp.argmax(-1) != re_logp_all.argmax(-1)).sum())
    print(f"cached: encode {len(tokens)} sentences {t1 - t0:.1f} s + {args.episodes} episodes "
          f"{t2 - t1:.2f} s -> {cached_rate:.1f} episodes/s "
          f"(mean accuracy {cached.mean():.4f})")
    print(f"re-encoding every episode: {re_rate:.2f} episodes/s "
          f"({args.reencode} episodes timed)")
    print(f"speed-up {cached_rate / re_rate:.0f}x; predictive probabilities equal on the "
          f"re-encoded episodes: {gap < PROB_TOLERANCE} (largest gap {gap:.1e}, "
          f"{flips} near-tie label flips; threads={torch.get_num_threads()})")

if __name__ == "__main__":
    main()
