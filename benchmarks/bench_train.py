"""Training throughput: one REGRAB step vs the raw encoder, dynamic vs fixed padding.

All figures are sentences per second on one 10-way 5-shot episode with 5 queries per way
(100 sentences) from a real split, measured in the same process:

* ``regrab step (cached)``: the default training step (frozen layers and top-layer keys /
  values cached per sentence; queries, feed-forward, GCN prior, Langevin sampler, loss,
  backward).
* ``encoder only (cached)``: the same encoder work with a trivial loss: the difference is
  the overhead of the prior and the sampler.
* ``... feed-forward on padding``: the default step with the top layer's output projection
  and feed-forward run on every pooled position, padding included (rows pad to the longest
  entity pair), instead of the real positions only.
* ``regrab step, no cache, dynamic padding`` / ``... padded to 128``: the encoder run end to
  end every step (what the authors' code did, with every sentence padded to 128).

Usage:
    python benchmarks/bench_train.py [--split data/splits/split_0] [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from model.encoder import frozen_cache as encoder_cache
from model.encoder.frozen_cache import LowerCache, encode_rows
from model.episodes import EpisodeSampler, gather_episodes
from model.methods.registry import build_model, config_for_method
from model.prior.graph import RelationGraph
from pipeline.config import load_params
from pipeline.io import read_parquet
from pipeline.schemas import FEWSHOT_SCHEMA


def _random_graph(relations: list[str], dim: int = 512, k: int = 10) -> RelationGraph:
    """A random 10-NN graph over 828 relations (the size of the paper's graph)."""
    rng = np.random.default_rng(0)
    rel = list(relations) + [f"X{i}" for i in range(828 - len(relations))]
    feats = torch.from_numpy(rng.normal(size=(len(rel), dim)).astype(np.float32))
    src = np.repeat(np.arange(len(rel)), k)
    dst = rng.integers(0, len(rel), size=len(src))
    ei = torch.from_numpy(np.stack([np.r_[src, dst], np.r_[dst, src]]))
    return RelationGraph(rel, feats, ei, torch.ones(ei.shape[1]))


_layer_at = encoder_cache.layer_at


def _padded_layer_at(*args, used=None, **kwargs):
    return _layer_at(*args, **kwargs)


def _timeit(fn, repeats: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", type=Path, default=Path("data/splits/split_0"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    table = read_parquet(args.split / "train.parquet", FEWSHOT_SCHEMA)
    relations = table.column("relation").to_pylist()
    graph = _random_graph(sorted(set(relations)))
    sampler = EpisodeSampler(relations)
    ep = sampler.sample(np.random.default_rng(0), 10, 5, 5, 1)
    rows = np.concatenate([ep.support.ravel(), ep.query.ravel()])
    n_sent = len(rows)

    def step_fn(model, tokens, cache, pad_to=None):
        local = type(ep)(ep.relation, np.arange(50).reshape(1, 10, 5),
                         50 + np.arange(50).reshape(1, 10, 5))
        prior_rows = model.rows(sampler.relations)[torch.from_numpy(ep.relation)]

        def run(encoder_only=False):
            if pad_to is None:
                enc = encode_rows(model.encoder, tokens, rows, cache, batch_size=n_sent)
            else:
                batch = tokens.batch(rows)
                pad = pad_to - batch["input_ids"].shape[1]
                batch["input_ids"] = torch.nn.functional.pad(batch["input_ids"], (0, pad))
                batch["attention_mask"] = torch.nn.functional.pad(batch["attention_mask"],
                                                                  (0, pad))
                enc = model.encoder(batch)
            if encoder_only:
                loss = enc.pow(2).mean()
            else:
                support, query, labels = gather_episodes(enc, local)
                h = model.head.prior_means(None, prior_rows)
                log_p = model.head.log_predictive(support, query, h)
                loss = torch.nn.functional.nll_loss(log_p.reshape(-1, 10), labels.reshape(-1))
            model.zero_grad(set_to_none=True)
            loss.backward()

        return run

    results = {}
    for label, params, cached, pad_to, enc_only in [
        ("regrab step (cached, default)", {"freeze_top_kv": True}, True, None, False),
        ("encoder only (cached, default)", {"freeze_top_kv": True}, True, None, True),
        ("regrab step (cached), feed-forward on padding", {"freeze_top_kv": True}, True,
         "positions", False),
        ("regrab step, top layer cached below", {}, True, None, False),
        ("regrab step, no cache, dynamic padding", {}, False, None, False),
        ("regrab step, no cache, padded to 128", {}, False, 128, False),
    ]:
        # "positions": the top layer's output projection and feed-forward also run on the
        # padded pooled positions (as before they were packed).
        encoder_cache.layer_at = _padded_layer_at if pad_to == "positions" else _layer_at
        pad_to = None if pad_to == "positions" else pad_to
        torch.manual_seed(0)
        section = load_params("params.yaml", "model")
        section["encoder"].update({"train_layers": 1, "freeze_top_kv": False, **params})
        model = build_model(config_for_method(section, "regrab"), graph)
        model.train()
        tokens = model.encoder.tokenize(table)
        cache = LowerCache() if cached else None
        if cache is not None:
            cache.states(model.encoder, tokens, rows)
        run = step_fn(model, tokens, cache, pad_to)
        sec = _timeit(lambda run=run, e=enc_only: run(e), args.repeats)
        results[label] = n_sent / sec
        print(f"{label:45s} {n_sent / sec:9.1f} sentences/s  ({sec * 1000:.0f} ms/step)",
              flush=True)
    base = results["regrab step (cached, default)"]
    enc = results["encoder only (cached, default)"]
    print(f"prior + sampler overhead over the encoder alone: {100 * (enc / base - 1):.0f}% "
          f"of step time; dynamic vs fixed-128 padding: "
          f"{results['regrab step, no cache, dynamic padding'] / results['regrab step, no cache, padded to 128']:.1f}x; "  # noqa: E501
          f"cached vs uncached: {base / results['regrab step, no cache, dynamic padding']:.1f}x"
          f" (threads={torch.get_num_threads()})")


if __name__ == "__main__":
    main()
