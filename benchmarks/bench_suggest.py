"""``regrab-suggest`` on large pools: TypiClust's ranking vs BALD's and the encoder's cost.

A 10-way 5-shot support set (10 relations of a split's test set, 5 sentences each) is set
once; then a pool drawn in a seeded order from ``--pool`` (FewRel's train_wiki, 44,800
sentences of 64 relations; a NYT-25 split holds 2,500) is encoded
in chunks as ``regrab-suggest`` encodes it, and the time to the end of each chunk is kept,
so the encoding time of the first ``n`` pool sentences is measured, not extrapolated. For
each pool size ``n`` in ``--sizes`` the first ``n`` encodings are ranked by

* ``typiclust`` (``--picks`` repeated k-means picks, the rest by typicality; what
  ``regrab-suggest`` runs by default), and
* ``bald`` (the posterior's per-sample logits of the pool and their mutual information: the
  peer, every other strategy's cost),

side by side with the encoder forward those ``n`` sentences cost, which every strategy pays.

The checkpoint is ``--checkpoint`` when given (e.g.
``models/nyt25/split_0/regrab/model.safetensors``), otherwise an untrained REGRAB built from
``params.yaml`` and the relation graph in ``data/`` (the ranking's cost does not depend on
the weights; its picks do).

Usage:
    python benchmarks/bench_suggest.py [--sizes 1000,4000,16000] [--picks 50] [--threads 2]
        [--checkpoint PATH] [--pool data/fewshot/train_wiki.parquet]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_predict import cpu_predictor, test_support  # noqa: E402

from model.predict.active import acquisition_scores  # noqa: E402
from model.predict.sentences import parse_sentence  # noqa: E402
from model.predict.typiclust import typiclust_order  # noqa: E402
from pipeline.io import read_parquet  # noqa: E402
from pipeline.schemas import FEWSHOT_SCHEMA  # noqa: E402


def peak_rss_mib() -> float:
    """The process's peak resident memory so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", type=Path, default=Path("data/splits/split_0"))
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--pool", type=Path, default=Path("data/fewshot/train_wiki.parquet"),
                        help="pool sentences (few-shot Parquet), drawn from it in a seeded order")
    parser.add_argument("--sizes", default="1000,4000,16000",
                        help="pool sizes, comma-separated, each a multiple of --chunk and "
                             "at most --pool's sentences")
    parser.add_argument("--picks", type=int, default=50)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if sizes[0] < 1 or any(n % args.chunk for n in sizes):
        sys.exit(f"error: --sizes {args.sizes}: give multiples of --chunk {args.chunk} (the "
                 "encoding is timed at the end of each chunk)")

    support = test_support(args.split)
    table = read_parquet(args.pool, FEWSHOT_SCHEMA)
    if sizes[-1] > table.num_rows:
        sys.exit(f"error: --sizes {sizes[-1]} is more than the {table.num_rows} sentences of "
                 f"{args.pool}; lower it")
    drawn = np.random.default_rng(args.seed).permutation(table.num_rows)[: sizes[-1]]
    pool = [parse_sentence(x) for x in table.take(drawn).to_pylist()]  # all relations mixed

    predictor = cpu_predictor(args.checkpoint, args.data, args.seed, args.batch_size)
    predictor.set_support(support)

    encoded, done = [], []  # chunk encodings, seconds from the start at the end of each chunk
    t0 = time.perf_counter()
    for s in range(0, len(pool), args.chunk):
        encoded.append(predictor.encode(pool[s : s + args.chunk]))
        done.append(time.perf_counter() - t0)
    enc = torch.cat(encoded)  # (P, D)
    print(f"checkpoint: {'untrained ' if args.checkpoint is None else ''}"
          f"{predictor.model.config.method}, encoder {predictor.model.config.encoder.name}, "
          f"10-way 5-shot support, --picks {args.picks}, threads={torch.get_num_threads()}")
    print(f"{'pool':>6} {'encode s':>9} {'bald s':>7} {'typiclust s':>12} "
          f"{'typiclust/encode':>17} {'peak RSS MiB':>13}")
    for n in sizes:
        encode_s = done[n // args.chunk - 1]
        t0 = time.perf_counter()
        acquisition_scores("bald", predictor.sample_logits(enc[:n]).double())  # (P,)
        bald_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        order = typiclust_order(predictor.support_encodings, enc[:n],
                                torch.Generator().manual_seed(args.seed), args.picks)
        typi_s = time.perf_counter() - t0
        assert sorted(order.tolist()) == list(range(n))
        print(f"{n:>6} {encode_s:>9.1f} {bald_s:>7.2f} {typi_s:>12.1f} "
              f"{typi_s / encode_s:>17.2f} {peak_rss_mib():>13.0f}")


if __name__ == "__main__":
    main()
