"""``regrab-predict``: label new sentences with a trained checkpoint, with uncertainty.

Support rows ``{"relation": "P40", <sentence>}`` give labelled examples; a row with a relation
and no sentence, or ``--zero-shot P19,P27``, adds a relation predicted from its prior alone
(a comma inside parentheses does not split: ``--zero-shot 'Cause-Effect(e2,e1)'``).
A relation outside the checkpoint's graph gets a prior read from its name (a row's ``name``,
``--relations FILE``, ``--name REL=NAME``, or the key itself, e.g. ``gene_found_in_organism``)
and, for a checkpoint with ``model.prior.descriptions: true``, its description (a row's
``description`` or ``--relations``; the file is FewRel's ``pid2name.json`` format,
``{"key": ["name", "description"]}``); the summary says which prior each relation used (graph,
label, fallback) and what it read (name+description, name, no text), with the counts.
A sentence is ``{"text": "[E1]Barack Obama[/E1] was born in [E2]Hawaii[/E2] ."}``, a
FewRel record (``tokens``, ``h``, ``t``) or FEWSHOT_SCHEMA columns; a ``.txt`` query file holds
one marked sentence per line. Queries may carry ``id`` and a gold ``relation`` (then the
accuracy is printed). The output has one row per query: ``prediction`` (null when abstaining),
``best``, ``confidence``, ``abstain``, ``abstain_score``, ``entropy``, ``mutual_information``,
the other uncertainty scores (null where they do not apply; ``top_prob``, ``top_gap``,
``top_logit``: larger when surer) and ``probabilities``.

A query abstains when its abstain score is past the quantile that leaves ``--abstain-rate`` of
in-set queries of the checkpoint's validation relations beyond it, stored at training per
setting, read for the support's ways and shots; ``--threshold P`` abstains below top
probability P instead (the only way for a checkpoint of an older version, with no quantiles).

Support sentences get suspicion scores, flagged above a validation cutoff (``--support-scores``).

A bad support row or checkpoint stops with one ``error:`` line; a bad query (markers missing
or unbalanced, a span outside the sentence, not JSON) is skipped and counted in the summary.

Usage:
    regrab-predict --checkpoint models/nyt25/split_0/regrab/model.safetensors \
        --support tests/data/predict/support.jsonl --queries tests/data/predict/queries.jsonl \
        --out preds.jsonl [--zero-shot P452] [--abstain-rate 0.05] [--seed 0] [--device auto] \
        [--support-scores support_scores.jsonl]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from cli.files import (
    check_output,
    check_readable,
    read_records,
    write_predictions,
    write_support_scores,
)
from cli.guard import refuse_same, run_command
from cli.limits import add_run_options, check_run_options, check_support_cost
from cli.model_option import add_model_option, model_file
from cli.text import lone_surrogate, shown
from model.evaluation.uncertainty import POSTERIOR_SCORES
from model.predict.abstain import DEFAULT_RATE, SCORE_NAMES
from model.predict.predictor import NonFinite, Predictor
from model.predict.records import (
    RelationTexts,
    query_from_record,
    shown_text,
    support_from_records,
)
from model.predict.sentences import Sentence
from pipeline import stage_cli
from pipeline.errors import PipelineError
from pipeline.fewrel import load_relation_texts, relation_text

SHOWN_SKIPS = 5


def split_relations(text: str) -> list[str]:
    """The relation ids of a ``--zero-shot`` value: comma-separated, where a comma inside
    parentheses (SemEval's ``Cause-Effect(e2,e1)``) belongs to the id.

    Raises:
        PipelineError: no id at all (``',,,'``), or unpaired parentheses in a value with commas.
    """
    if not text.replace(",", "").strip():
        raise PipelineError(f"--zero-shot {text!r} names no relation; give relation ids "
                            "separated by commas, e.g. P19,P27, or leave --zero-shot out")
    if "," not in text:  # one id, whatever its parentheses
        return [text.strip()]
    ids, part, depth = [], [], 0
    for ch in text:
        if ch == "," and depth == 0:
            ids.append("".join(part))
            part = []
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            break
        part.append(ch)
    if depth != 0:
        raise PipelineError(f"--zero-shot {text!r}: its parentheses do not pair up, so where "
                            "one relation ends is unclear; pair them, or give that relation "
                            "its own --zero-shot")
    return [r.strip() for r in [*ids, "".join(part)] if r.strip()]


def _text(value: str, what: str) -> str:
    """``value`` when UTF-8 can write it (an undecodable byte of the command line is a lone
    surrogate here)."""
    if lone_surrogate(value):
        raise PipelineError(f"{what} {value!r} is not valid text (it holds a lone surrogate, "
                            "half of a UTF-16 pair, or a byte that is not UTF-8); fix it")
    return value


def read_support(path: Path | None, zero_shot: list[str]) -> dict[str, list[Sentence]]:
    """``{relation: [sentence, ...]}`` in order of first appearance (empty list: zero-shot)."""
    records = ((f"support {path} line {line}", rec)
               for line, rec in (read_records(path, "support file") if path else ()))
    return support_from_records(records, [_text(r, "--zero-shot relation") for r in zero_shot],
                                source=f"--support {path}" if path else "--support",
                                zero_shot_source="--zero-shot")


def read_relation_texts(path: Path, option: str = "--relations"
                        ) -> dict[str, tuple[str, str | None]]:
    """``{key: (name, description or None)}`` from a relations file in FewRel's
    ``pid2name.json`` format: ``{"key": ["name", "description"]}``, the description optional.

    Raises:
        PipelineError: one line naming ``option``, when the file is missing or not JSON, an
            entry is not ``[name]`` or ``[name, description]``, its text holds a lone
            surrogate, or a key is written twice with different text (JSON readers keep the
            last one silently).
    """
    check_readable(path, option)
    try:
        texts = load_relation_texts(path)
    except PipelineError as exc:
        raise PipelineError(f"{option} {exc}") from None
    for key, text in texts.items():
        if lone_surrogate(key) or lone_surrogate(list(text)):
            raise PipelineError(f"{option} {path}: entry {key!r} holds a lone surrogate (half "
                                "of a UTF-16 pair, a \\ud800-\\udfff escape), which is not "
                                "text; fix the escape")
    # Valid JSON by now, and every value a list of strings: only the top level is an object.
    for key, value in json.loads(path.read_bytes(), object_pairs_hook=lambda kv: kv):
        if _entry(value) != texts[key]:
            raise PipelineError(
                f"{option} {path}: relation {key!r} is given twice with different text "
                f"({shown_text(_entry(value))} and {shown_text(texts[key])}); keep one entry")
    return texts


def _entry(value: Any) -> tuple[str, str | None] | Any:
    """A relations-file entry as :func:`load_relation_texts` keeps it (anything else: as is)."""
    text = relation_text(value)
    return value if text is None else text


def read_texts(path: Path | None, given: list[str], relations: Path | None = None
               ) -> tuple[dict[str, str], dict[str, str]]:
    """Names and descriptions of relations, read by the prior of those outside the
    checkpoint's graph: from ``--relations``, support rows' ``name`` and ``description``
    fields, then ``--name REL=NAME`` (which wins for the name).

    Raises:
        PipelineError: a ``name`` or ``description`` that is not text, or two of the files
            giving one relation different names or descriptions.
    """
    overrides: dict[str, str] = {}
    for item in given:
        rel, sep, name = _text(item, "--name").partition("=")
        if not sep or not rel.strip() or not name.strip():
            raise PipelineError(f"--name {item!r}: write it as RELATION=NAME, e.g. "
                                "--name 'gene_found_in_organism=found in organism'")
        overrides[rel.strip()] = name.strip()
    texts = RelationTexts(overrides)
    if relations is not None:
        for rel, (name, description) in read_relation_texts(relations).items():
            texts.put("name", rel, name, f"--relations {relations}")
            texts.put("description", rel, description or "", f"--relations {relations}")
    if path is not None:
        texts.put_records((f"support {path} line {line}", rec)
                          for line, rec in read_records(path, "support file"))
    return texts.result()


def read_sentences(path: Path, what: str, empty: str, noun: str
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """Parsed sentences (line, id, gold, sentence) of the ``what`` at ``path`` and the reasons
    of skipped ones; ``empty`` says what to give when it has no records, ``noun`` names its
    records when none could be read."""
    rows, skipped = [], []
    records = 0
    for line, rec in read_records(path, what):
        records += 1
        try:
            rows.append({"line": line, **query_from_record(rec)})
        except PipelineError as exc:
            skipped.append(f"line {line}: {exc}")
    if records == 0:
        raise PipelineError(f"{what} {path} has no records; {empty}")
    if not rows:
        raise PipelineError(f"none of the {records} {noun} {path} could be read "
                            f"(first: {skipped[0]})")
    return rows, skipped


def read_queries(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Parsed queries (line, id, gold, sentence) and the reasons of skipped ones."""
    return read_sentences(path, "query file", "give one sentence per line", "queries in")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = stage_cli.parser(__doc__, paragraph=True, prog="regrab-predict")
    add_model_option(p)
    p.add_argument("--support", type=Path, help="JSONL/Parquet rows {relation, sentence}")
    p.add_argument("--zero-shot", action="append", default=[], metavar="IDS",
                   help="relations predicted from their prior alone, no support: comma-"
                        "separated ids (P19,P27); a comma inside parentheses does not split "
                        "('Cause-Effect(e2,e1)'); repeatable")
    p.add_argument("--name", action="append", default=[], metavar="REL=NAME",
                   help="name of a relation outside the checkpoint's graph, read as its prior "
                        "(repeatable; default: read from the relation key, e.g. "
                        "gene_found_in_organism)")
    p.add_argument("--relations", type=Path, metavar="FILE",
                   help="names and descriptions of your relations, FewRel's pid2name.json "
                        "format: {\"key\": [\"name\", \"description\"]} (description "
                        "optional); read by the prior of relations outside the checkpoint's "
                        "graph, the description only by checkpoints with "
                        "model.prior.descriptions: true")
    p.add_argument("--queries", type=Path, required=True, help="JSONL, Parquet or .txt")
    p.add_argument("--out", type=Path, required=True,
                   help=".jsonl or .parquet; a file, never --queries, --support or --relations "
                        "(checked before any work)")
    p.add_argument("--abstain-rate", type=float, default=None, metavar="R",
                   help="abstain on a query when its abstain score is past the quantile "
                        "that leaves R of in-set queries of the checkpoint's validation "
                        "relations (never test relations) beyond it, so about R of "
                        "validation-like queries abstain; the quantiles come from the stored "
                        "settings, read for your support's ways and shots. 0: never. "
                        f"Default {DEFAULT_RATE}; a checkpoint of an older version stores no "
                        "quantiles and then never abstains")
    p.add_argument("--abstain-score", choices=SCORE_NAMES, default=None, metavar="NAME",
                   help="the uncertainty score to abstain by, one of the checkpoint's: "
                        f"{', '.join(SCORE_NAMES)} ({', '.join(POSTERIOR_SCORES)} need posterior "
                        "samples, as regrab's; default: the one that best told other "
                        "relations' queries from in-set ones on validation episodes)")
    p.add_argument("--threshold", type=float, default=None, metavar="P",
                   help="abstain when the top probability is below P instead (overrides "
                        "--abstain-rate and --abstain-score; 0: never)")
    p.add_argument("--support-scores", type=Path, default=None, metavar="FILE",
                   help="write each support sentence's relation, index, text, suspicion "
                        "(larger: its relation less likely given the rest) and flagged (above "
                        "the checkpoint's validation cutoff), .jsonl or .parquet")
    add_run_options(p, "seed of the posterior samples", "queries per prediction call")
    args = p.parse_args(argv)
    check_run_options(args)
    check_output(args.out)  # before the predictions, not after them
    inputs = {"--queries": args.queries, "--support": args.support, "--relations": args.relations}
    refuse_same(args.out, "--out", inputs)
    if args.support_scores is not None:
        check_output(args.support_scores, option="--support-scores")
        refuse_same(args.support_scores, "--support-scores", {**inputs, "--out": args.out})
    return args


def support_inputs(args: argparse.Namespace) -> tuple[str, Any, Any, Any]:
    """Threads set, then the device, the support and the relations' names and descriptions
    that ``--support``, ``--zero-shot``, ``--name`` and ``--relations`` give."""
    device = stage_cli.threads_and_device(args.threads, args.device, "--device")
    zero_shot = [r for given in args.zero_shot for r in split_relations(given)]
    support = read_support(args.support, zero_shot)
    names, descriptions = read_texts(args.support, args.name, args.relations)
    return device, support, names, descriptions


def predict_files(argv: list[str] | None = None) -> dict[str, Any]:
    """Predict, write ``--out`` atomically, print a summary; returns the summary counts."""
    args = parse_args(argv)
    device, support, names, descriptions = support_inputs(args)
    queries, skipped = read_queries(args.queries)
    predictor = Predictor.from_checkpoint(
        model_file(args.checkpoint), device, seed=args.seed, threshold=args.threshold,
        abstain_rate=args.abstain_rate, abstain_score=args.abstain_score,
        batch_size=args.batch_size)
    starts = range(0, len(queries), args.chunk)
    # Before the support is encoded or its posterior sampled: 10^9 Langevin steps, or more
    # support than the machine holds, must not start.
    long = check_support_cost(predictor, support, len(starts) + 1, args.chunk, "--support")
    summary = predictor.set_support(support, names=names, descriptions=descriptions,
                                    progress=long)
    rule = predictor.abstain_rule()
    rows: list[dict[str, Any]] = []
    for s in tqdm(starts, desc="predict", unit="chunk", disable=len(starts) < 2):
        part = queries[s : s + args.chunk]
        try:
            preds = predictor.predict([q["sentence"] for q in part])
        except NonFinite as exc:  # name the query by its line, not its place in the chunk
            raise NonFinite(exc.queries, len(part),
                            f"{args.queries} line {part[exc.queries[0]]['line']}") from None
        for q, rec in zip(part, preds.records(), strict=True):
            rows.append({"line": q["line"], "id": q["id"], "text": q["sentence"].marked(),
                         **rec, "gold": q["gold"]})
    write_predictions(rows, summary.relations, args.out)
    check = predictor.support_check
    suspicion = [{**r, "text": support[r["relation"]][r["index"]].marked()} for r in
                 check.records()]
    if args.support_scores is not None:
        write_support_scores(suspicion, args.support_scores)
        print(f"wrote {len(suspicion)} support sentences' suspicion to "
              f"{shown(args.support_scores)}")

    abstained = sum(r["abstain"] for r in rows)
    for line in summary.lines():
        print(line)
    print(check.line())
    print(f"queries: {len(rows) + len(skipped)} read, {len(skipped)} skipped, {len(rows)} "
          f"predicted, {abstained} abstained (abstain when: {rule.text})")
    for reason in skipped[:SHOWN_SKIPS]:
        print(f"  skipped {reason}")
    if len(skipped) > SHOWN_SKIPS:
        print(f"  ... and {len(skipped) - SHOWN_SKIPS} more skipped")
    result = {"predicted": len(rows), "skipped": len(skipped), "abstained": abstained,
              "abstain_score": rule.written, "abstain_cutoff": rule.written_cutoff,
              "abstain_setting": None if rule.setting is None else rule.setting.name,
              "priors": summary.priors, "texts": summary.texts,
              "text_counts": summary.text_counts, "support_flagged": check.count,
              "support_cutoff": check.cutoff, "support_suspicion": suspicion}
    scored = [r for r in rows if r["gold"] in summary.relations]
    if scored:
        acc = float(np.mean([r["best"] == r["gold"] for r in scored]))
        print(f"accuracy on the {len(scored)} queries whose gold relation is a candidate: "
              f"{acc:.1%} (chance {1 / len(summary.relations):.1%})")
        result["accuracy"] = acc
    print(f"wrote {len(rows)} rows to {shown(args.out)}")
    return result


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: bad input ends in one ``error:`` line (exit 2), not a traceback;
    Ctrl-C exits 130, SIGTERM 143."""
    run_command(predict_files, argv)


if __name__ == "__main__":
    main()
