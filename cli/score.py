"""``regrab-score``: score trained checkpoints on your own FewRel-format data.

The file maps relation ids (any strings: Wikidata ids or your own labels) to lists of
``{"tokens": [...], "h": [name, id, [[positions]]], "t": [...]}`` records, as FewRel's JSON
files do. Episodes are drawn from it exactly as ``evaluate`` draws them from a test split, for
every method found under ``--models`` plus the untrained ``floor``, and the same tables (mean
over splits with the between-split interval, paired differences with REGRAB, calibration) are
written.

Before scoring, relations are sorted out and listed:

* fewer than K + Q sentences (the largest K of ``--settings``): skipped;
* trained on by a checkpoint (its training or validation relations): excluded, or kept and
  flagged with ``--keep-trained``;
* absent from a REGRAB checkpoint's relation graph: scored with a prior read from the
  relation's name (from ``--relations``, else the key, e.g. ``gene_found_in_organism``), or
  the learned fallback when the key is a bare id and the file names it not; the output counts
  the ways of each kind.

``--relations FILE`` (FewRel's ``pid2name.json`` format, ``{"key": ["name", "description"]}``,
the description optional) gives the relations' names and descriptions: the names replace
those read from the keys, and checkpoints with ``model.prior.descriptions: true`` read the
descriptions after them. A relation the file lacks keeps its key's name and no description;
the output says how many. Per method, the output counts the ways whose prior read a name and
description, a name only, or no text.

``--settings`` also takes the unequal settings ``evaluate`` reports (``5w1-5s``: 5 ways of 1 to
5 shots each), scored as ``evaluate.unequal_settings`` are, with their ``_cut1`` and ``_step``
episode sets (``evaluate.unequal_episodes`` episodes each, or ``--episodes``).

``--models`` also takes a registered version (``regrab``, the promoted one, or
``regrab@v0.2.0``, optionally ``:fewrel`` for that benchmark's models; default ``nyt25``).

Usage:
    regrab-score --data ../shared/data/fewrel/val_nyt.json --models models/fewrel \
        --out metrics/own [--settings 5w1s,5w5s,5w1-5s] [--episodes 1000] [--methods regrab]
    regrab-score --data my_data.json --models regrab:fewrel --out metrics/own
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

from cli.files import check_readable
from cli.guard import refuse_same, run_command
from cli.limits import check_episodes, check_stored_chains, check_threads
from cli.predict import read_relation_texts
from cli.text import lone_surrogate, shown
from model.episodes import Setting
from model.evaluation import shots
from model.evaluation.splits import EvalConfig
from model.evaluation.transfer import score_table, stored_models
from model.methods import registry
from model.prior.labels import PRIOR_KINDS, TEXT_KINDS
from pipeline import report, stage_cli, versions
from pipeline.config import load_section
from pipeline.errors import PipelineError
from pipeline.fewrel import convert, load_json
from pipeline.io import atomic_paths, check_writable

log = logging.getLogger(__name__)


def parse_settings(text: str) -> list[Setting]:
    """``--settings``: its N-way K-shot settings of at least 2 ways each (its unequal ones,
    ``5w1-5s``, are :func:`parse_unequal`'s)."""
    names = comma_list(text, "--settings", "5w1s,5w5s")
    try:
        found = [Setting.parse(s) for s in names if "-" not in s]
    except PipelineError as exc:
        raise PipelineError(f"--settings {exc}, or like 5w1-5s (N ways of 1 to 5 shots "
                            "each)") from None
    if not found and parse_unequal(text):  # a malformed unequal one is said first
        raise PipelineError(f"--settings {text!r} has no N-way K-shot setting; unequal ones "
                            "are scored beside one, as evaluate scores them: add one, e.g. "
                            f"5w1s,{text}")
    return found


def parse_unequal(text: str) -> list[shots.UnequalSetting]:
    """``--settings``' unequal settings, ``{N}w{a}-{b}s`` as ``evaluate.unequal_settings``
    reads them (:class:`~model.evaluation.shots.UnequalSetting`)."""
    try:
        return list(dict.fromkeys(shots.UnequalSetting.parse(s) for s in
                                  comma_list(text, "--settings", "5w1s,5w5s") if "-" in s))
    except PipelineError as exc:
        raise PipelineError(f"--settings {exc}") from None


def bounds(unequal: list[shots.UnequalSetting]) -> list[Setting]:
    """An N-way K-shot stand-in at the most shots for each of the three episode sets of every
    unequal setting, for the memory and chain-time bounds."""
    return [Setting(u.ways, u.high) for u in unequal for _ in u.names()]


def comma_list(text: str, flag: str, example: str) -> list[str]:
    """The items of a comma-separated option; one that names none (``',,,'``) is refused
    rather than read as the default."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise PipelineError(f"{flag} {text!r} names nothing; give a comma-separated list, "
                            f"e.g. {example}, or leave {flag} out for the default")
    return items


def refuse_lone_surrogates(data: object, path: Path) -> None:
    """Stop when a relation id or record of FewRel ``data`` holds a lone surrogate (a JSON
    ``"\\ud800"`` escape), which no table or report can store."""
    if not isinstance(data, dict) or not lone_surrogate(data):
        return
    for relation, records in data.items():
        if lone_surrogate(relation):
            raise PipelineError(f"--data {path}: relation {relation!r} holds a lone surrogate "
                                "(half of a UTF-16 pair, a \\ud800-\\udfff escape), which is "
                                "not text; fix the escape")
        for i, record in enumerate(records if isinstance(records, list) else [records]):
            if lone_surrogate(record):
                raise PipelineError(f"--data {path}: record {i} of relation {relation!r} holds "
                                    "a lone surrogate (half of a UTF-16 pair, a \\ud800-"
                                    "\\udfff escape), which is not text; fix the escape")


def episode_bytes(relations: int, settings: list[Setting], queries: int, methods: int) -> int:
    """An estimate of the memory one episode of every setting holds while it is scored.

    Drawing an episode sorts a random key per relation (16 bytes each); its sentence rows
    (8 bytes per support and query sentence) are kept, and so are each method's confidence
    and hit per query (16 bytes).
    """
    return 16 * relations + sum(8 * s.ways * (s.shots + queries)
                                + 16 * methods * s.ways * queries for s in settings)


def relation_texts(texts: dict[str, tuple[str, str | None]], scored: list[str],
                   keys: list[str]) -> dict[str, Any]:
    """What ``--relations`` gave the scored relations: how many it names and describes, the
    ones it lacks (they keep the name read from their key), and how many of its entries name
    no relation of the data."""
    return {"named": sum(r in texts for r in scored),
            "described": sum(r in texts and bool(texts[r][1]) for r in scored),
            "missing": [r for r in scored if r not in texts],
            "unused": len(set(texts) - set(keys))}


def score(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, score, write the tables; returns metrics and the relation lists."""
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--data", type=Path, required=True, help="FewRel-format JSON file")
    parser.add_argument("--models", type=Path, required=True,
                        help="a benchmark's models folder (split_*/<method>/model.safetensors),"
                             " or a registered version's: regrab (the promoted one) or "
                             "regrab@vX.Y.Z, optionally :BENCHMARK (default :nyt25); list "
                             "them with regrab-models list")
    parser.add_argument("--out", type=Path, required=True,
                        help="output prefix: OUT.json (metrics), OUT.md, OUT_report.json; "
                             "all three are checked before scoring and written together or "
                             "not at all")
    parser.add_argument("--methods", default=None,
                        help="comma-separated (default: every method trained on every split)")
    parser.add_argument("--settings", default="5w1s,5w5s,10w1s,10w5s",
                        help="comma-separated N-way K-shot settings, N >= 2")
    parser.add_argument("--episodes", type=int, default=None,
                        help="episodes per setting and split (default: evaluate.episodes); "
                             "at most what fits in half the machine's memory")
    parser.add_argument("--keep-trained", action="store_true",
                        help="keep (and flag) relations a checkpoint was trained on")
    stage_cli.add_params(parser, help="evaluate section: queries, seed, batch sizes, device")
    parser.add_argument("--relations", type=Path, metavar="FILE",
                        help="names and descriptions of the data's relations, FewRel's "
                             "pid2name.json format: {\"key\": [\"name\", \"description\"]} "
                             "(description optional); the names replace those read from the "
                             "keys, the descriptions are read by checkpoints with "
                             "model.prior.descriptions: true")
    args = parser.parse_args(argv)
    check_readable(args.data, "--data")
    check_readable(args.params, "--params")
    if args.relations is not None:
        check_readable(args.relations, "--relations")
    stage_cli.start_logging()
    outputs = [args.out.with_name(args.out.name + end) for end in (".json", "_report.json",
                                                                    ".md")]
    for path in outputs:  # every one before the scoring, not after it
        check_writable(path)
        refuse_same(path, "output", {"--data": args.data, "--params": args.params,
                                     "--relations": args.relations})
    settings, unequal = parse_settings(args.settings), parse_unequal(args.settings)
    wanted = None if args.methods is None else comma_list(args.methods, "--methods",
                                                          "regrab,proto")
    base = load_section(EvalConfig, "evaluate", args.params)
    base = dataclasses.replace(base, unequal_settings=tuple(u.name for u in unequal),
                               unequal_episodes=args.episodes or base.unequal_episodes)
    texts = {} if args.relations is None else read_relation_texts(args.relations)
    data = load_json(args.data, fix=(
        "give --data a FewRel-format JSON file: {relation: [{tokens, h, t}, ...]}"))
    refuse_lone_surrogates(data, args.data)
    keys = list(data) if isinstance(data, dict) else []
    table, parsed = convert(args.data.stem, data, {k: texts[k][0] for k in keys if k in texts})
    descriptions = {k: texts[k][1] for k in keys if k in texts and texts[k][1]}
    # Before anything is drawn: every setting's episodes are held at once.
    check_episodes(args.episodes or base.episodes, episode_bytes(
        len(parsed["instances_per_relation"]), settings + bounds(unequal), base.queries,
        len(wanted or registry.names()) + 1),
        "--episodes" if args.episodes else f"{args.params} evaluate.episodes")
    check_threads(base.threads, f"{args.params} evaluate.threads")
    args.models, line = versions.checkout_benchmark(args.models)
    if line is not None:
        print(shown(line))
    # Before any model is loaded: a checkpoint with 10^9 Langevin steps must not start.
    stored = stored_models(args.models, wanted or registry.names())
    check_stored_chains([f for paths in stored.values() for f in paths.values()],
                        settings + bounds(unequal), args.episodes or base.episodes)
    device = stage_cli.threads_and_device(base.threads, base.device,
                                          f"{args.params} evaluate.device")
    with torch.no_grad():
        result = score_table(
            args.data.name, table, args.models, base, settings, device,
            methods=wanted,
            episodes=args.episodes, keep_trained=args.keep_trained,
            listed=parsed["instances_per_relation"], descriptions=descriptions,
            unequal=bool(unequal))
    summary, cfg, methods = result["summary"], result["cfg"], result["methods"]
    relations = summary["relations"]
    usable, needed = len(relations["relations_scored"]), result["needed"]
    print(f"{shown(args.data.name)}: {result['sentences']} sentences of {usable} relations scored; "
          f"skipped {len(relations['too_few_sentences'])} with < {needed} sentences; "
          f"{len(relations['trained_on'])} trained on "
          f"({'excluded' if not args.keep_trained else 'kept, flagged'}): "
          f"{relations['trained_on']}")
    named = None
    if args.relations is not None:
        named = relation_texts(texts, relations["relations_scored"], keys)
        missing = named["missing"]
        print(f"--relations {shown(args.relations)}: names for {named['named']} of {usable} scored "
              f"relations ({named['described']} with a description); missing from it: "
              f"{len(missing)}"
              + (f" ({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}), named by "
                 "their key, with no description" if missing else "")
              + f"; entries naming no relation of --data: {named['unused']}")
    for method, counts in summary["priors"].items():
        print(f"{method} priors over the ways of every episode: "
              + ", ".join(f"{k} {counts.get(k, 0)}" for k in PRIOR_KINDS)
              + " (graph: relation graph and label; label: the relation's name alone); "
              + "text read: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in TEXT_KINDS)
              + " (a name and description, a name only, no text)")
    summary["relations"] = {**relations, "parsed": {k: v for k, v in parsed.items()
                                                    if k != "instances_per_relation"}}
    if named is not None:
        summary["relations"]["texts"] = named
    metrics = report.headline_metrics(summary, args.data.stem, tuple(methods))
    if shots.headline(summary["shots"]):
        metrics["shots"] = shots.headline(summary["shots"])
    dropped = [u.name for u in unequal if u.name not in cfg.unequal_settings]
    if dropped:
        print(f"not scored: {', '.join(dropped)} (more ways than the {usable} usable relations)")
    note = (f"{args.data.name}: {usable} relations, {cfg.episodes} episodes per setting and "
            f"checkpoint split, {cfg.queries} queries per way; models from {args.models}. "
            f"Relations trained on: {relations['trained_on'] or 'none'}"
            f"{' (kept, flagged)' if args.keep_trained else ' (excluded)'}."
            + (f" Names and descriptions from {args.relations.name}: "
               f"{named['named']} of {usable} relations named, {named['described']} "
               f"described, {len(named['missing'])} missing (named by their key)."
               if named is not None else "")
            + "".join(f" {m} ways whose prior read "
                      + ", ".join(f"{k} {c.get(k, 0)}" for k in TEXT_KINDS) + "."
                      for m, c in summary["priors"].items()))
    names = [s.name for s in settings] + [n for u in cfg.unequal_settings
                                          for n in shots.UnequalSetting.parse(u).names()]
    text = report.markdown_report(summary, names, note) + "\n".join(
        shots.markdown(summary["shots"])) + "\n"
    with atomic_paths(*outputs) as (metrics_tmp, report_tmp, table_tmp):  # all or none
        report.write_json_ordered(metrics, metrics_tmp)
        report.write_json_ordered(summary, report_tmp)
        table_tmp.write_text(text)
    print(text)
    return {"metrics": metrics, "relations": relations, "priors": summary["priors"],
            "texts": named}


def main(argv: list[str] | None = None) -> None:
    """Console entry point ``regrab-score``: one ``error:`` line on bad input (exit 2);
    Ctrl-C exits 130, SIGTERM 143, with none of the outputs written."""
    run_command(score, argv)


if __name__ == "__main__":
    main()
