"""Benchmark: our TransE loop (model/transe/model.py) against PyKEEN 1.11.1 on the same data.

Both train TransE on the same triples (the data mirror's Wikidata triples by
default), with the same dimension, epochs, batch size, negatives per positive,
margin-ranking loss, norm, Adam learning rate, seed and torch threads, one after
the other in one process. Reported per library: training triples/s (wall clock
and CPU time) and the filtered MRR / Hits@10 on the same held-out slice, ranked
by our evaluator (``filtered_ranks``) for both. With ``--pykeen-evaluator``
PyKEEN's model is also ranked by PyKEEN's own ``RankBasedEvaluator``, a
cross-check of our evaluator (slow on CPU; use it with ``--max-triples``).

Differences that remain by design: ours shares each draw of negatives across a
chunk of positives and updates only touched rows (RowAdam); PyKEEN draws
negatives per positive and runs dense Adam over the whole tables (its default).

Usage (needs ``pip install pykeen==1.11.1``; the shared CPU makes short runs noisy):
    REGRAB_DATA_MIRROR=../shared/data python benchmarks/bench_transe.py --threads 2 --epochs 1
    python benchmarks/bench_transe.py --only ours --dim 128 --chunk-size 256 --threads 1,2,1,2
    python benchmarks/bench_transe.py --triples data/wikidata/triples.parquet --dim 512
    python benchmarks/bench_transe.py --max-triples 30000 --dim 64 --epochs 3 --pykeen-evaluator
"""

from __future__ import annotations

import os

# libgomp reads this once, when torch loads: spin-waiting threads made 2 threads several
# times slower than 1 on a shared 2-core machine. A value set by the caller wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.csv as pcsv  # noqa: E402
import torch  # noqa: E402

from model.transe.model import TransE, TransEConfig  # noqa: E402
from model.transe.optim import make_optimizer, train_epoch  # noqa: E402
from model.transe.ranking import filtered_ranks, rank_metrics  # noqa: E402
from model.transe.training import (  # noqa: E402
    TrainTransEParams,
    encode_triples,
    split_heldout,
)
from pipeline.config import data_mirror, load_section  # noqa: E402
from pipeline.errors import PipelineError  # noqa: E402
from pipeline.io import read_parquet  # noqa: E402
from pipeline.schemas import TRIPLES_SCHEMA  # noqa: E402


def mirror_triples(mirror: Path) -> pa.Table:
    """The mirror's wikidata/triples/*.csv (comma) and *.tsv (tab) files as one table."""
    tables = []
    for path in sorted((mirror / "wikidata" / "triples").iterdir()):
        if path.suffix not in (".csv", ".tsv"):
            continue
        table = pcsv.read_csv(
            path,
            read_options=pcsv.ReadOptions(column_names=["head", "relation", "tail"]),
            parse_options=pcsv.ParseOptions(delimiter="\t" if path.suffix == ".tsv" else ","),
            convert_options=pcsv.ConvertOptions(
                column_types=dict.fromkeys(["head", "relation", "tail"], pa.string())
            ),
        )
        source = pa.array([path.name] * len(table), type=pa.string())
        tables.append(table.append_column("source", source))
    if not tables:
        raise PipelineError(f"no triples files under {mirror}/wikidata/triples")
    return pa.concat_tables(tables).cast(TRIPLES_SCHEMA)


def config(args, **changes) -> TransEConfig:
    """params.yaml's TransE config (loss, normalisation...) with the command line's sizes."""
    base = load_section(TrainTransEParams, "train_transe", args.params).model
    return dataclasses.replace(
        base, dim=args.dim, epochs=args.epochs, batch_size=args.batch_size,
        negatives=args.negatives, chunk_size=args.chunk_size, lr=args.lr, margin=args.margin,
        p_norm=args.p_norm, seed=args.seed, **changes)


def run_ours(train, held, known, num_entities, num_relations, args) -> dict:
    cfg = config(args)
    generator = torch.Generator().manual_seed(args.seed)
    model = TransE(num_entities, num_relations, cfg, generator)
    optimizer = make_optimizer(model)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.epochs):
        train_epoch(model, optimizer, train, generator)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    metrics = rank_metrics(filtered_ranks(model, held, known))
    tables = model.entities.numpy().tobytes() + model.relations.numpy().tobytes()
    return {"wall": wall, "cpu": cpu, "sha256": hashlib.sha256(tables).hexdigest(), **metrics}


def run_pykeen(train, held, known, num_entities, num_relations, args) -> dict:
    from pykeen.evaluation import RankBasedEvaluator
    from pykeen.losses import MarginRankingLoss
    from pykeen.models import TransE as PykeenTransE
    from pykeen.training import SLCWATrainingLoop
    from pykeen.triples import CoreTriplesFactory

    factory = CoreTriplesFactory(
        mapped_triples=train, num_entities=num_entities, num_relations=num_relations
    )
    model = PykeenTransE(
        triples_factory=factory,
        embedding_dim=args.dim,
        scoring_fct_norm=args.p_norm,
        loss=MarginRankingLoss(margin=args.margin),
        random_seed=args.seed,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loop = SLCWATrainingLoop(
        model=model,
        triples_factory=factory,
        optimizer=optimizer,
        negative_sampler="basic",
        negative_sampler_kwargs={"num_negs_per_pos": args.negatives},
    )
    wall, cpu = time.perf_counter(), time.process_time()
    loop.train(
        triples_factory=factory,
        num_epochs=args.epochs,
        batch_size=args.batch_size,
        use_tqdm=False,
        use_tqdm_batch=False,
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"pykeen: trained in {wall:.1f}s wall", flush=True)

    # Same evaluator as ours: put PyKEEN's (already unit-norm) tables into our model.
    cfg = config(args, chunk_size=1, batch_size=1)
    ours = TransE(num_entities, num_relations, cfg, torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours.entities.copy_(model.entity_representations[0](indices=None))
        ours.relations.copy_(model.relation_representations[0](indices=None))
    metrics = rank_metrics(filtered_ranks(ours, held, known))
    if args.pykeen_evaluator:
        # PyKEEN scores (batch, E, D) differences at once: keep its batches small.
        result = RankBasedEvaluator(filtered=True).evaluate(
            model,
            mapped_triples=held,
            additional_filter_triples=[train],
            batch_size=16,
            use_tqdm=False,
        )
        metric = "both.realistic.inverse_harmonic_mean_rank"
        metrics["pykeen_mrr"] = float(result.get_metric(metric))
    return {"wall": wall, "cpu": cpu, **metrics}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--triples", type=Path, help="TRIPLES_SCHEMA Parquet (default: mirror)")
    parser.add_argument("--mirror", type=Path, help="data mirror folder (default: env)")
    parser.add_argument("--max-triples", type=int, default=0, help="use a random subset (0: all)")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--negatives", type=int, default=64)
    # 64 rather than the stage's 256: at dim 512 and few epochs, more distinct negatives per
    # step gave a better MRR (0.0618 vs 0.0514 after 1 epoch on the mirror's triples).
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--margin", type=float, default=0.25)
    parser.add_argument("--p-norm", type=int, default=2, choices=(1, 2))
    parser.add_argument("--heldout-fraction", type=float, default=0.005)
    parser.add_argument("--threads", default="2",
                        help="torch threads; a comma list (1,2) trains ours once per count, "
                             "side by side, and says whether the tables are the same bytes")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"),
                        help="where TransE's loss and normalisation come from")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("ours", "pykeen"), help="run one side only")
    parser.add_argument(
        "--pykeen-evaluator",
        action="store_true",
        help="also rank PyKEEN's model with PyKEEN's evaluator (slow on CPU: use a subset)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    counts = [int(t) for t in str(args.threads).split(",")]
    torch.set_num_threads(counts[0])
    if args.triples:
        table = read_parquet(args.triples, TRIPLES_SCHEMA)
    else:
        mirror = args.mirror or data_mirror()
        if mirror is None:
            raise SystemExit("pass --triples or --mirror, or set REGRAB_DATA_MIRROR")
        table = mirror_triples(mirror)
    data = encode_triples(table)
    triples = data.triples
    if args.max_triples and args.max_triples < len(triples):
        pick = np.random.default_rng(args.seed).choice(len(triples), args.max_triples, False)
        triples = triples[np.sort(pick)]
    train_np, held_np = split_heldout(triples, args.heldout_fraction, args.seed)
    train, held = torch.from_numpy(train_np), torch.from_numpy(held_np)
    known = torch.from_numpy(triples)
    num_entities, num_relations = len(data.entities), len(data.relations)
    print(
        f"data: {len(train)} training / {len(held)} held-out triples, {num_entities} entities, "
        f"{num_relations} relations; dim {args.dim}, {args.epochs} epoch(s), batch "
        f"{args.batch_size}, {args.negatives} negatives/positive, margin {args.margin}, "
        f"L{args.p_norm}, Adam lr {args.lr}, {torch.get_num_threads()} threads, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}",
        flush=True,
    )
    results = {}
    # With several thread counts, ours trains once per count, one after the other in this
    # process: the same data and load for each, so the speeds compare side by side.
    runners = {("ours" if len(counts) == 1 else f"ours, run {i + 1}, {t} threads"): (run_ours, t)
               for i, t in enumerate(counts)}
    runners["pykeen"] = (run_pykeen, counts[0])
    for name, (run, threads) in runners.items():
        if args.only and not name.startswith(args.only):
            continue
        torch.set_num_threads(threads)
        results[name] = run(train, held, known, num_entities, num_relations, args)
        done = results[name]
        print(
            f"{name}: {done['wall']:.1f}s wall / {done['cpu']:.1f}s CPU training, "
            f"MRR {done['mrr']:.4f}",
            flush=True,
        )

    seen = len(train) * args.epochs
    print()
    print(
        "| loop | training wall s | training CPU s | triples/s (wall) | filtered MRR | Hits@10 "
        "| PyKEEN-evaluator MRR |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(
            f"| {name} | {r['wall']:.1f} | {r['cpu']:.1f} | {seen / r['wall']:,.0f} | "
            f"{r['mrr']:.4f} | {r['hits_at_10']:.4f} | {r.get('pykeen_mrr', float('nan')):.4f} |"
        )
    ours = [r for name, r in results.items() if name.startswith("ours")]
    if len(ours) > 1:
        same = len({r["sha256"] for r in ours}) == 1
        print(f"\ntables after training: {'the same bytes' if same else 'DIFFERENT bytes'} "
              f"with {', '.join(map(str, counts))} threads")
    if "pykeen" in results and "ours" in results:
        speedup = results["pykeen"]["wall"] / results["ours"]["wall"]
        print(f"\nspeed-up of ours over PyKEEN (wall clock): {speedup:.1f}x")
    return results


if __name__ == "__main__":
    main()
