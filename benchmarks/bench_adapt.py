"""``regrab-adapt`` on a domain's sentences: seconds per 1,000 sentences, with its peer.

``--sentences`` sentences are drawn in a seeded order from ``--data`` (a FewRel-format JSON
file, e.g. the data mirror's ``fewrel/val_semeval.json``, or a few-shot Parquet table). The
peer is what every use of the model pays anyway: encoding the same sentences once with the
unadapted checkpoint (``regrab-predict``'s encoding: frozen layers, then the top layer). Then
the checkpoint is adapted to them as ``regrab-adapt`` runs by default (its objective, steps
and ``--minutes`` budget), timed from the first token to the adapted weights; its record
(steps run, the InfoNCE loss) is printed with the seconds.

Usage:
    python benchmarks/bench_adapt.py --checkpoint models/nyt25/split_0/regrab/model.safetensors \
        --data ../shared/data/fewrel/val_semeval.json [--sentences 5000] [--minutes 15] \
        [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from model.adapt.run import AdaptOptions, adapt, tokenize
from model.encoder.frozen_cache import LowerCache, encode_all
from model.files.loader import load_model
from model.predict.sentences import parse_sentence
from pipeline.fewrel import convert
from pipeline.io import read_parquet
from pipeline.schemas import FEWSHOT_SCHEMA


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=5000)
    parser.add_argument("--minutes", type=float, default=AdaptOptions().minutes)
    parser.add_argument("--objective", default=AdaptOptions().objective)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.data.suffix == ".json":
        table, _ = convert(args.data.stem, json.loads(args.data.read_text()), {})
    else:
        table = read_parquet(args.data, FEWSHOT_SCHEMA)
    drawn = np.random.default_rng(args.seed).permutation(table.num_rows)[: args.sentences]
    sentences = [parse_sentence(r) for r in table.take(drawn).select(
        ["tokens", "head_start", "head_end", "tail_start", "tail_end"]).to_pylist()]
    n = len(sentences)

    model, _ = load_model(args.checkpoint)
    model.eval()
    t0 = time.perf_counter()
    encode_all(model.encoder, tokenize(model, sentences), LowerCache())
    peer = time.perf_counter() - t0
    print(f"{n:,} sentences, {args.threads} threads")
    print(f"peer, encode them once (unadapted): {peer:7.1f} s  "
          f"({peer / n * 1000:6.1f} s per 1,000 sentences)", flush=True)

    options = AdaptOptions(objective=args.objective, minutes=args.minutes, seed=args.seed)
    t0 = time.perf_counter()
    record = adapt(model, sentences, options)
    took = time.perf_counter() - t0
    print(f"regrab-adapt --objective {args.objective}: {took:7.1f} s  "
          f"({took / n * 1000:6.1f} s per 1,000 sentences given; adapted to "
          f"{record['sentences']:,}, {record['steps']} steps, budget {args.minutes:g} min)")
    if "loss_first" in record:
        print(f"InfoNCE {record['loss_first']:.4f} -> {record['loss_last']:.4f}")


if __name__ == "__main__":
    main()
