"""``regrab-adapt``: adapt a trained model to your domain's unlabelled sentences.

Reads a checkpoint (or model folder, or registered version) and a file of sentences of your
domain, with entity markers or without, and writes a new checkpoint whose encoder is adapted
to that text; the prior, the posterior, the abstaining cutoffs and the rest are kept, and the
checkpoint's summary (and so the card of ``regrab-models export``) records the adaptation:
the objective, the sentences' digest, the steps and the budget. ``regrab-predict`` and the
other commands read it as any checkpoint.

Sentences: one per line in a ``.txt`` file, or JSONL/Parquet records as ``regrab-predict``
reads queries (``text`` with ``[E1]..[/E1] [E2]..[/E2]``, or FewRel ``tokens``/``h``/``t``).
A sentence without markers gets two of its words, drawn with ``--seed``, as its entities. The
work is timed on this machine first: an estimate is printed, the steps are cut to fit
``--minutes``, and a budget that cannot fit one step stops before any work.

``--objective pseudo`` lets the model's prior label your sentences with the relations you
name in ``--relations`` (the relations file the other commands read: ``{"id": ["name",
"description"], ...}``), and trains on the confident labels; the file's sha256 is recorded.

Usage:
    regrab-adapt --checkpoint models/nyt25/split_0/regrab/model.safetensors \
        --sentences my_domain.txt --out adapted.safetensors [--minutes 15] [--seed 0] \
        [--objective pseudo --relations my_relations.json]
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from cli.files import read_records
from cli.guard import refuse_same, run_command
from cli.limits import check_seed, check_threads
from cli.model_option import add_model_option, model_file
from cli.text import shown
from model.adapt.objectives import OBJECTIVES
from model.adapt.run import (
    DEFAULT_LR,
    DEFAULT_OBJECTIVE,
    AdaptOptions,
    adapt,
    adapted_checkpoint,
    over_length,
)
from model.files.checkpoint import save_checkpoint
from model.files.loader import load_model
from model.predict.sentences import MARKER_RE, Sentence, parse_sentence
from pipeline.config import select_device, set_threads
from pipeline.errors import PipelineError
from pipeline.fewrel import load_relation_texts
from pipeline.io import check_writable

#: Skipped lines named in the summary.
SHOWN_SKIPS = 5
#: A word that can stand for an entity in a sentence without markers.
WORD_RE = re.compile(r"\w")


def unmarked(text: str, rng: np.random.Generator) -> Sentence:
    """A sentence without markers, with two distinct words drawn as its head and tail."""
    words = text.split()
    usable = [i for i, w in enumerate(words) if WORD_RE.search(w)]
    if len(usable) < 2:
        raise PipelineError("has fewer than two words to take as entities; mark them")
    head, tail = rng.choice(usable, size=2, replace=False).tolist()
    return Sentence(tuple(words), (head, head + 1), (tail, tail + 1))


def read_domain(path: Path, seed: int) -> tuple[list[Sentence], list[str], int]:
    """The sentences of ``path``, the reasons of skipped records, and how many had no
    markers (their entities drawn by :func:`unmarked`)."""
    rng = np.random.default_rng(seed)
    sentences: list[Sentence] = []
    skipped: list[str] = []
    drawn = records = 0
    for line, rec in read_records(path, "--sentences"):
        records += 1
        try:
            if isinstance(rec, PipelineError):
                raise rec
            text = rec.get("text") if isinstance(rec, dict) else rec
            if isinstance(text, str) and not MARKER_RE.search(text):
                sentences.append(unmarked(text, rng))
                drawn += 1
            else:
                sentences.append(parse_sentence(rec))
        except PipelineError as exc:
            skipped.append(f"line {line}: {exc}")
    if records == 0:
        raise PipelineError(f"--sentences {path} has no sentences; give one sentence of your "
                            "domain per line")
    if not sentences:
        raise PipelineError(f"none of the {records} records of --sentences {path} could be "
                            f"read (first: {skipped[0]})")
    return sentences, skipped, drawn


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="regrab-adapt", description=(__doc__ or "").split("\n\n")[0],
        epilog="objectives: " + "; ".join(f"{k}: {v}" for k, v in OBJECTIVES.items()))
    add_model_option(p)
    p.add_argument("--sentences", type=Path, required=True,
                   help="your domain's unlabelled sentences: .txt (one per line, markers "
                        "optional), JSONL or Parquet records as regrab-predict reads queries")
    p.add_argument("--out", type=Path, required=True,
                   help="the adapted checkpoint (.safetensors), written atomically at the end")
    p.add_argument("--objective", choices=list(OBJECTIVES), default=None,
                   help=f"how to adapt (default: pseudo with --relations, else "
                        f"{DEFAULT_OBJECTIVE})")
    defaults = AdaptOptions()
    p.add_argument("--minutes", type=float, default=defaults.minutes,
                   help=f"time budget on this machine (default {defaults.minutes:g})")
    p.add_argument("--steps", type=int, default=defaults.steps,
                   help=f"most training steps, cut to fit --minutes (default {defaults.steps})")
    p.add_argument("--batch-size", type=int, default=defaults.batch_size,
                   help=f"sentences per step (default {defaults.batch_size})")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate of the top layer (default 1e-4; " + ", ".join(
                       f"{k} {v:g}" for k, v in DEFAULT_LR.items()) + ")")
    p.add_argument("--relations", type=Path, metavar="FILE",
                   help="--objective pseudo: your relations' names and descriptions, JSON "
                        '{"id": ["name", "description"], ...} (2 or more relations)')
    p.add_argument("--share", type=float, default=defaults.share,
                   help="--objective pseudo: the largest share of the sentences kept as "
                        "labelled, the most confident, an equal part per relation (default "
                        f"{defaults.share:g})")
    p.add_argument("--skip-long", action="store_true",
                   help="leave out sentences longer than the encoder reads (default: refuse)")
    p.add_argument("--seed", type=int, default=0, help="batches, dropout and drawn entities")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads, at most the CPUs (0: torch default)")
    args = p.parse_args(argv)
    check_seed(args.seed)
    check_threads(args.threads)
    if args.objective is None:  # the relations a user names are read by pseudo only
        args.objective = DEFAULT_OBJECTIVE if args.relations is None else "pseudo"
    args.options = AdaptOptions(objective=args.objective, minutes=args.minutes,
                                steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                seed=args.seed, share=args.share)
    if (args.relations is None) == (args.objective == "pseudo"):
        raise PipelineError(
            "--objective pseudo labels your sentences with your relations' names: give "
            "--relations FILE" if args.relations is None else
            f"--relations is read by --objective pseudo only, not {args.objective}; drop it")
    if args.out.suffix != ".safetensors":
        raise PipelineError(f"--out {args.out}: give a .safetensors file name")
    if args.out.is_dir():
        raise PipelineError(f"--out {args.out} is a folder; give a file name")
    check_writable(args.out)
    refuse_same(args.out, "--out", {"--checkpoint": args.checkpoint,
                                    "--sentences": args.sentences, "--relations": args.relations})
    return args


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Adapt, write ``--out`` atomically, print a summary; returns the adaptation record."""
    args = parse_args(argv)
    set_threads(args.threads)
    device = select_device(args.device, "--device")
    sentences, skipped, drawn = read_domain(args.sentences, args.seed)
    relations = None
    if args.relations is not None:
        relations = load_relation_texts(args.relations, fix="give --relations a JSON object "
                                        '{"id": ["name", "description"], ...}')
    model, checkpoint = load_model(model_file(args.checkpoint), device)
    long = over_length(model, sentences)
    if long and args.skip_long:
        skipped += [f"sentence {i + 1}: longer than the encoder's "
                    f"{model.encoder.config.max_length} tokens" for i in long]
        dropped = set(long)
        sentences = [s for i, s in enumerate(sentences) if i not in dropped]
    if drawn:
        print(f"note: {drawn:,} sentence(s) had no entity markers; two of their words were "
              "drawn as entities (--seed)", file=sys.stderr)
    record = adapt(model, sentences, args.options,
                   say=lambda line: print(line, file=sys.stderr), relations=relations)
    record["source"] = str(args.checkpoint)
    if args.relations is not None:
        record["relations_file"] = str(args.relations)
        record["relations_sha256"] = hashlib.sha256(args.relations.read_bytes()).hexdigest()
    record["skipped"] = len(skipped)
    save_checkpoint(args.out, adapted_checkpoint(checkpoint, model, record))
    loss = (f", {record['loss']} {record['loss_first']:.4f} -> {record['loss_last']:.4f}"
            if "loss_first" in record else "")
    print(f"adapted by {record['objective']} to {record['sentences']:,} sentences "
          f"({len(skipped)} skipped, digest {record['digest'][:12]}) in "
          f"{record['seconds']:.0f} s, {record['steps']} steps{loss}; wrote {shown(args.out)}")
    for reason in skipped[:SHOWN_SKIPS]:
        print(f"  skipped {reason}")
    if len(skipped) > SHOWN_SKIPS:
        print(f"  ... and {len(skipped) - SHOWN_SKIPS} more skipped")
    return record


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: bad input ends in one ``error:`` line (exit 2), not a traceback;
    Ctrl-C exits 130, SIGTERM 143; an interrupted run writes nothing."""
    run_command(run, argv)


if __name__ == "__main__":
    main()
