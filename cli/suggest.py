"""``regrab-suggest``: which unlabelled sentence should you label next? Ranks a pool.

You have a few labelled sentences per relation (``--support``, the rows ``regrab-predict``
reads) and a pool of unlabelled sentences (``--pool``, any file ``regrab-predict`` reads as
queries). The model fits its posterior to the support and ranks the pool by a strategy, the
sentence to label first on top: label it, add it to the support, run again.

Strategies (``--strategy``; ``rank`` 1 is labelled first, and each score but typiclust's is
larger for the sentences to label first):

* ``bald`` (needs a checkpoint with posterior samples, i.e. regrab): the mutual
  information between the sentence's relation and the prototypes, in nats: the sentences the
  posterior samples disagree on, whose label teaches the prototypes most;
* ``entropy``: the entropy of the predicted relation, in nats;
* ``margin``: one minus the gap between the two most probable relations (the sentences
  closest to a decision boundary);
* ``typiclust`` (the default): the most typical sentence of the largest cluster of encodings
  (support and pool) that holds no labelled sentence; the first ``--picks`` by repeated
  picks, each counted as labelled for the next, the rest by typicality. Its score is the
  sentence's typicality in the pool (the inverse of its mean Euclidean distance to its 20
  nearest pool sentences; the picks need not come in its order). It reads the encodings
  only, so every checkpoint can use it; in the labelling simulation it beat random labels
  and ``bald`` on NYT-25 and SemEval (docs/results/abstain-and-ask.md, "Ask: which sentence
  to label next");
* ``random``: a random order from ``--seed`` (score: a uniform draw in [0, 1)), the floor the
  others should beat.

The output has one row per readable pool sentence, in rank order: ``rank`` (1 = label
first), ``line`` (its line or row in ``--pool``), ``id`` and ``text`` as given (text with
entity markers), ``score`` (the strategy's), ``best`` (the relation the model would predict
now) and ``probability`` (of ``best``). ``--out`` is JSONL, CSV or Parquet, written
atomically. A bad support row or checkpoint stops with one ``error:`` line; an unreadable
pool sentence is skipped and counted.

Usage:
    regrab-suggest --checkpoint models/nyt25/split_0/regrab/model.safetensors \
        --support support.jsonl --pool unlabelled.jsonl --out ranked.jsonl \
        [--strategy typiclust] [--seed 0] [--device auto]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from tqdm import tqdm

from cli.files import check_output, write_rows
from cli.guard import refuse_same, run_command
from cli.limits import add_run_options, check_run_options, check_support_cost
from cli.model_option import add_model_option, model_file
from cli.predict import SHOWN_SKIPS, read_sentences, support_inputs
from cli.text import shown
from model.evaluation.uncertainty import mc_log_probs
from model.predict.active import (
    DEFAULT_STRATEGY,
    acquisition_scores,
    check_strategy,
    random_scores,
    ranking,
)
from model.predict.config import STRATEGIES
from model.predict.predictor import NonFinite, Predictor
from model.predict.typiclust import typiclust_ranking
from pipeline import stage_cli
from pipeline.errors import PipelineError

OUTPUT_FORMATS = (".jsonl", ".csv", ".parquet")
#: The columns of the output, in order, with their Arrow types.
COLUMNS = pa.schema([
    pa.field("rank", pa.int64(), nullable=False),
    pa.field("line", pa.int64(), nullable=False),
    pa.field("id", pa.string()),
    pa.field("text", pa.string(), nullable=False),
    pa.field("score", pa.float64(), nullable=False),
    pa.field("best", pa.string(), nullable=False),
    pa.field("probability", pa.float64(), nullable=False),
])


def read_pool(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Parsed pool sentences (line, id, sentence) and the reasons of skipped ones."""
    rows, skipped = read_sentences(path, "pool file", "give one unlabelled sentence per line",
                                   "sentences in the pool")
    return [{k: r[k] for k in ("line", "sentence", "id")} for r in rows], skipped


def write_ranked(rows: list[dict[str, Any]], path: Path) -> None:
    """Write the ranked rows atomically; the format follows the extension."""
    write_rows(rows, path, COLUMNS, OUTPUT_FORMATS)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = stage_cli.parser(
        __doc__, paragraph=True, prog="regrab-suggest",
        epilog="strategies: " + "; ".join(f"{k}: {v}" for k, v in STRATEGIES.items()))
    add_model_option(p)
    p.add_argument("--support", type=Path, required=True,
                   help="your labelled sentences: JSONL/Parquet rows {relation, sentence}, as "
                        "regrab-predict reads them")
    p.add_argument("--pool", type=Path, required=True,
                   help="the unlabelled sentences to rank: JSONL, Parquet or .txt (one marked "
                        "sentence per line), as regrab-predict reads queries; an 'id' is kept")
    p.add_argument("--out", type=Path, required=True,
                   help=".jsonl, .csv or .parquet; the pool in the order to label it (checked "
                        "before any work)")
    p.add_argument("--strategy", choices=list(STRATEGIES), default=None,
                   help="how to rank: bald (mutual information between the label and the "
                        "prototypes; needs posterior samples, as regrab's), entropy, margin, "
                        "typiclust (typical sentences of unlabelled clusters) or random "
                        "(default: typiclust)")
    p.add_argument("--picks", type=int, default=50,
                   help="typiclust: pool sentences ranked by repeated picks (one k-means each); "
                        "the rest by typicality (default 50)")
    p.add_argument("--zero-shot", action="append", default=[], metavar="IDS",
                   help="candidate relations with no labelled sentence yet, predicted from "
                        "their prior (regrab): comma-separated ids; repeatable")
    p.add_argument("--name", action="append", default=[], metavar="REL=NAME",
                   help="name of a relation outside the checkpoint's graph, read as its prior "
                        "(repeatable)")
    p.add_argument("--relations", type=Path, metavar="FILE",
                   help="names and descriptions of your relations, FewRel's pid2name.json "
                        "format, as regrab-predict reads them")
    add_run_options(p, "seed of the posterior samples and of random's order",
                    "pool sentences per model call")
    args = p.parse_args(argv)
    check_run_options(args)
    if args.picks < 1:
        raise PipelineError(f"--picks {args.picks}: rank at least one pool sentence by "
                            "repeated picks (--picks 1 or more)")
    check_output(args.out, OUTPUT_FORMATS)  # before the model is loaded, not after the ranking
    refuse_same(args.out, "--out", {"--pool": args.pool, "--support": args.support,
                                    "--relations": args.relations})
    return args


#: typiclust's picks from which they show a bar (each is one k-means over the pool).
PROGRESS_PICKS = 100


def clamp_picks(picks: int, pool: int) -> int:
    """``--picks`` for a pool of ``pool`` sentences: at most one pick per sentence, said on
    stderr when ``picks`` asks for more (``--picks 1000000000`` ran on with no word)."""
    if picks <= pool:
        return picks
    print(f"note: --picks {picks:,} is more than the pool's {pool:,} sentences; every pool "
          f"sentence is ranked by repeated picks ({pool:,} picks, one k-means each: the "
          "ranking's time grows with them, see docs/using-models.md)", file=sys.stderr)
    return pool


def suggest(argv: list[str] | None = None) -> dict[str, Any]:
    """Rank the pool, write ``--out`` atomically, print a summary; returns the summary."""
    args = parse_args(argv)
    device, support, names, descriptions = support_inputs(args)
    pool, skipped = read_pool(args.pool)
    predictor = Predictor.from_checkpoint(model_file(args.checkpoint), device,
                                          seed=args.seed, batch_size=args.batch_size)
    starts = range(0, len(pool), args.chunk)
    # Before the support is encoded or its posterior sampled (once more for the first
    # sentence): 10^9 Langevin steps, or more support than the machine holds, must not start.
    long = check_support_cost(predictor, support, len(starts) + 1, args.chunk, "--support")
    summary = predictor.set_support(support, names=names, descriptions=descriptions,
                                    progress=long)
    # One sentence tells whether the head samples its prototypes, before the pool is encoded.
    samples = predictor.sample_logits(predictor.encode([pool[0]["sentence"]])).shape[0]
    strategy = check_strategy(args.strategy or DEFAULT_STRATEGY, samples,
                              f"checkpoint {args.checkpoint} ({predictor.model.config.method})",
                              "use --strategy typiclust, entropy or margin, or a regrab "
                              "checkpoint")
    scores, best, prob, encodings = [], [], [], []
    for s in tqdm(starts, desc="suggest", unit="chunk", disable=len(starts) < 2):
        part = pool[s : s + args.chunk]
        enc = predictor.encode([q["sentence"] for q in part])  # (P, D)
        if strategy == "typiclust":
            encodings.append(enc)
        logits = predictor.sample_logits(enc).double()  # (S, P, N)
        probs = mc_log_probs(logits).exp()  # (P, N)
        finite = torch.isfinite(probs).all(-1)
        if strategy not in ("random", "typiclust"):
            scores.append(acquisition_scores(strategy, logits))  # (P,)
            finite &= torch.isfinite(scores[-1])
        if not bool(finite.all()):
            bad = (~finite).nonzero().flatten().tolist()
            raise NonFinite(bad, len(part), f"{args.pool} line {part[bad[0]]['line']}")
        top = probs.max(-1)
        best += [summary.relations[i] for i in top.indices.tolist()]
        prob += top.values.tolist()
    if strategy == "typiclust":  # ranked by picks; its score is the typicality
        picks = clamp_picks(args.picks, len(pool))
        order, score = typiclust_ranking(predictor.support_encodings, torch.cat(encodings),
                                         torch.Generator().manual_seed(args.seed), picks,
                                         progress=picks >= PROGRESS_PICKS)
    else:
        score = (random_scores((len(pool),), torch.Generator().manual_seed(args.seed))
                 if strategy == "random" else torch.cat(scores)).cpu().numpy()
        order = ranking(score)
    rows = [{"rank": rank, "line": pool[i]["line"], "id": pool[i]["id"],
             "text": pool[i]["sentence"].marked(), "score": float(score[i]), "best": best[i],
             "probability": float(prob[i])}
            for rank, i in enumerate(order.tolist(), start=1)]
    write_ranked(rows, args.out)
    first = rows[0]
    named = f" (id {first['id']})" if first["id"] is not None else ""
    print(f"ranked {len(rows)} pool sentences ({len(skipped)} skipped) for "
          f"{len(summary.relations)} relations by {strategy}; label first: line "
          f"{first['line']}{named}, now guessed {first['best']} at "
          f"{first['probability']:.0%}; wrote {shown(args.out)}")
    for reason in skipped[:SHOWN_SKIPS]:
        print(f"  skipped {reason}")
    if len(skipped) > SHOWN_SKIPS:
        print(f"  ... and {len(skipped) - SHOWN_SKIPS} more skipped")
    return {"ranked": len(rows), "skipped": len(skipped), "strategy": strategy,
            "samples": samples, "first": first}


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: bad input ends in one ``error:`` line (exit 2), not a traceback;
    Ctrl-C exits 130, SIGTERM 143."""
    run_command(suggest, argv)


if __name__ == "__main__":
    main()
