"""``regrab-fewrel-test``: answer files for FewRel's hidden test set, and a local check.

FewRel 1.0's test relations are not released; models are scored on CodaLab from an answer
file. The input (``test_wiki_input-{N}-{K}.json``) is a JSON list of episodes
``{"meta_train": [[record] * K] * N, "meta_test": record}`` (N ways of K FewRel records and
one query), optionally with ``"relation"``, one Wikidata property id per way in ``meta_train``
order, as lyyang01/SimpleFSRE's ``FewRelTestDataset`` reads it (``fewshot_re_kit/``
``data_loader.py`` at 9de3321). The answer file is a JSON list of integers, one per episode,
the index of the query's way in ``meta_train``: the format of the CodaLab task page (no sample
file was checked against; thunlp/FewRel at 278a231 does not spell it out).

Subcommands:

* ``predict`` (the default when the first argument is an option): every distinct sentence
  of the file is encoded once, sorted by length (the encoder sees one sentence at a time, so
  this is what encoding each episode would give); then each episode runs through the head
  as :meth:`model.predict.predictor.Predictor.predict` runs it, the posterior samples seeded
  afresh with ``--seed`` per episode, so an episode's answer does not depend on the others.
  A way with a relation id gets the prior ``Predictor.set_support`` gives it (graph row, else
  ``--pid2name``'s name and description, else the fallback), one without the fallback; the
  answer is the argmax of the predictive probabilities.
* ``make``: episodes of a FewRel-format file (``val_wiki.json``) as test input, with relation
  lists unless ``--no-relations``, and gold answers (the gold way at random).
* ``score``: accuracy of an answer file against gold, with its normal 95% interval.

Bad input (ways that differ in K, a query without entities, a ``relation`` list of the wrong
length, with non-strings or a repeated id, answer files of different lengths, an output that
is also an input, ...) stops with one ``error:`` line; outputs are written atomically.

Usage:
    regrab-fewrel-test make --data ../shared/data/fewrel/val_wiki.json --ways 5 --shots 1 \
        --episodes 1000 --seed 0 --out test.json --answers gold.json [--no-relations]
    regrab-fewrel-test [predict] --checkpoint models/fewrel/split_0/regrab/model.safetensors \
        --input test.json --out pred.json [--pid2name pid2name.json] [--seed 0] [--device auto]
    regrab-fewrel-test score --pred pred.json --answers gold.json

Shapes: E episodes, S posterior samples, N ways, K shots, D encoding size, U sentences."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from cli.files import check_readable
from cli.guard import refuse_same, run_command
from cli.limits import check_episodes, check_episodes_time, check_seed, check_threads
from cli.text import lone_surrogate, shown
from model.episodes import mean_ci95
from model.evaluation.uncertainty import mc_log_probs
from model.predict.predictor import NonFinite, Predictor
from model.predict.sentences import Sentence, parse_sentence
from model.prior.labels import PRIOR_KINDS, relation_name
from pipeline import stage_cli
from pipeline.errors import PipelineError
from pipeline.fewrel import load_json, load_relation_texts
from pipeline.io import atomic_path, check_writable

COMMANDS = ("predict", "make", "score")
#: Sentences per encoder call between progress-bar updates (a multiple of any batch size).
CHUNK = 1024


@dataclass(frozen=True)
class TestEpisode:
    """An episode: ``support[n][k]`` is shot k of way n; ``relations[n]`` its id (or None)."""

    support: tuple[tuple[Sentence, ...], ...]
    query: Sentence
    relations: tuple[str, ...] | None = None

    @property
    def ways(self) -> int:
        return len(self.support)

    @property
    def shots(self) -> int:
        return len(self.support[0])


def _sentence(record: Any, where: str) -> Sentence:
    if not isinstance(record, Mapping):
        raise PipelineError(f"{where} is not a FewRel record {{tokens, h, t}}; fix the file")
    try:
        return parse_sentence(record)
    except PipelineError as exc:
        raise PipelineError(f"{where}: {exc}") from None


def _relations(ep: Mapping[str, Any], ways: int, where: str) -> tuple[str, ...] | None:
    """The episode's ``relation`` list, checked: one distinct id string per way."""
    if "relation" not in ep:
        return None
    ids, why = ep["relation"], None
    if not isinstance(ids, list):
        why = f"is {ids!r:.40}, not a list"
    elif len(ids) != ways:
        why = f"lists {len(ids)} ids for {ways} ways"
    elif bad := [r for r in ids if not isinstance(r, str) or not r.strip() or lone_surrogate(r)]:
        why = f"holds {bad[0]!r}, not a relation id"
    elif twice := [r for n, r in enumerate(ids) if r in ids[:n]]:
        why = f"gives {twice[0]!r} to more than one way"
    if why:
        raise PipelineError(f"{where}: 'relation' {why}; give one distinct relation id string "
                            "per way, in meta_train order (e.g. \"P17\"), or leave it out")
    return tuple(ids)


def parse_episodes(data: Any, source: str = "input") -> list[TestEpisode]:
    """Test episodes from the CodaLab input's JSON (a list of meta_train/meta_test dicts)."""
    if not isinstance(data, list) or not data:
        raise PipelineError(f"{source} is not a non-empty JSON list of episodes "
                            "{meta_train, meta_test}; give FewRel's test input file")
    episodes = []
    for i, ep in enumerate(data):
        where = f"{source} episode {i}"
        if not isinstance(ep, Mapping) or "meta_train" not in ep or "meta_test" not in ep:
            raise PipelineError(f"{where} lacks 'meta_train' or 'meta_test'; each episode is "
                                "{meta_train: [[record, ...] per way], meta_test: record}")
        ways = ep["meta_train"]
        if (not isinstance(ways, list) or len(ways) < 2
                or not all(isinstance(w, list) and w for w in ways)):
            raise PipelineError(f"{where}: meta_train must list at least 2 ways, each a "
                                "non-empty list of records")
        shots = {len(w) for w in ways}
        if len(shots) > 1:
            raise PipelineError(f"{where}: its ways differ in K ({[len(w) for w in ways]} "
                                "records); every way of an episode needs the same K")
        support = tuple(tuple(_sentence(r, f"{where} way {n} shot {k}")
                              for k, r in enumerate(w)) for n, w in enumerate(ways))
        episodes.append(TestEpisode(support, _sentence(ep["meta_test"], f"{where} meta_test"),
                                    _relations(ep, len(ways), where)))
    return episodes


def read_pid2name(path: Path) -> dict[str, tuple[str, str | None]]:
    """Names and descriptions from FewRel's ``pid2name.json`` (``{"P17": [name, description]}``)
    as :func:`pipeline.fewrel.load_relation_texts` reads them; a key written twice is refused."""
    fix = "give --pid2name FewRel's pid2name.json: {\"P17\": [name, description], ...}"
    check_readable(path, "--pid2name")
    try:
        texts = load_relation_texts(path, fix=fix, unique_keys=True)
    except PipelineError as exc:
        raise PipelineError(f"--pid2name {exc}") from None
    for pid, text in texts.items():
        if lone_surrogate([pid, *(t for t in text if t)]):
            raise PipelineError(f"--pid2name {path}: {pid!r} is not [name, description] with "
                                f"a name; {fix}")
    return texts


def make_episodes(data: Any, ways: int, shots: int, count: int, seed: int,
                  source: str = "data", with_relations: bool = True
                  ) -> tuple[list[dict[str, Any]], list[int]]:
    """Test input and gold answers drawn from FewRel-format ``{relation: [record, ...]}``.

    Each episode takes ``ways`` relations and ``shots`` records of each, without
    replacement, in random way order; the query is one more record of a random way. With
    ``with_relations``, each lists its relation keys in way order; the draws are the same.
    """
    if not isinstance(data, Mapping) or not all(isinstance(v, list) for v in data.values()):
        raise PipelineError(f"{source} is not FewRel format {{relation: [{{tokens, h, t}}, "
                            "...]}}; give e.g. val_wiki.json")
    if ways < 2 or shots < 1 or count < 1:
        raise PipelineError(f"need --ways >= 2, --shots >= 1, --episodes >= 1 (got {ways}, "
                            f"{shots}, {count})")
    relations = sorted(r for r, recs in data.items() if len(recs) > shots)
    if len(relations) < ways:
        raise PipelineError(f"{ways}-way episodes need {ways} relations with more than {shots} "
                            f"records; {source} has {len(relations)}; lower --ways or --shots")
    # Each episode's N * K + 1 records are held as Sentences and as JSON text (twice while it
    # is joined) before the file is written.
    sample = [r for rel in relations[:20] for r in data[rel][:10]]
    check_episodes(count, 4 * (ways * shots + 1) * record_bytes(sample))
    rng = np.random.default_rng(seed)
    inputs, gold = [], []
    for _ in range(count):
        picked = [relations[i] for i in rng.permutation(len(relations))[:ways]]
        answer = int(rng.integers(ways))
        meta_train, query = [], None
        for n, r in enumerate(picked):
            rows = rng.permutation(len(data[r]))[: shots + (n == answer)]
            meta_train.append([data[r][j] for j in rows[:shots]])
            if n == answer:
                query = data[r][rows[shots]]
        inputs.append({"meta_train": meta_train, "meta_test": query,
                       **({"relation": picked} if with_relations else {})})
        gold.append(answer)
    return inputs, gold


@torch.no_grad()
def predict_episodes(predictor: Predictor, episodes: Sequence[TestEpisode],
                     progress: bool = True,
                     names: Mapping[str, tuple[str, str | None]] | None = None
                     ) -> tuple[list[int], dict[str, float], dict[str, int]]:
    """The answer (way index) of every episode, timings and ways per prior kind (none without a
    prior); ids outside the graph are named once per file, as ``Predictor.set_support`` does.

    Shapes:
        encodings: (U, D); per episode support (1, N, K, D), query (1, 1, D), h (1, N, D)
    """
    index: dict[Sentence, int] = {}
    for ep in episodes:
        for s in (*(s for way in ep.support for s in way), ep.query):
            index.setdefault(s, len(index))
    unique = list(index)
    order = sorted(range(len(unique)), key=lambda i: len(unique[i].tokens))
    start = time.perf_counter()
    parts = []
    for at in tqdm(range(0, len(order), CHUNK), desc="encode", unit="chunk",
                   disable=not progress or len(order) <= CHUNK):
        parts.append(predictor.encode([unique[i] for i in order[at: at + CHUNK]]))
    enc = torch.empty(len(unique), predictor.model.encoder.out_dim, device=predictor.device)
    enc[torch.tensor(order, dtype=torch.long, device=enc.device)] = torch.cat(parts)  # (U, D)
    model, head = predictor.model, predictor.model.head
    ids = list(dict.fromkeys(r for ep in episodes for r in ep.relations or ()))
    if model.prior is not None and ids:
        texts = names or {}
        model.prior.add_names({r: texts[r][0] if r in texts else relation_name(r) for r in ids},
                              model.encoder, None, predictor.batch_size,
                              {r: texts[r][1] for r in ids if r in texts})
    encoded = time.perf_counter()
    states = head.prior_states()
    kinds = dict.fromkeys(PRIOR_KINDS, 0) if model.prior is not None else {}
    answers = []
    for ep in tqdm(episodes, desc="episodes", unit="ep", disable=not progress):
        n, k = ep.ways, ep.shots
        ways = (model.rows(list(ep.relations)) if ep.relations is not None
                else torch.full((n,), -1, dtype=torch.long))  # (N,); -1: the fallback prior
        h = head.prior_means(states, ways[None].to(enc.device))  # (1, N, D)
        if model.prior is not None:
            for r in ep.relations or (None,) * n:
                kinds["fallback" if r is None else model.prior.prior_kind(r)] += 1
        rows = [index[s] for way in ep.support for s in way]
        sup = enc[rows].reshape(1, n, k, -1)  # (1, N, K, D)
        query = enc[[index[ep.query]]][None]  # (1, 1, D)
        # Seeded per episode, as Predictor.sample_logits seeds each call.
        gen = torch.Generator(device=enc.device).manual_seed(predictor.seed)
        probs = mc_log_probs(head.sample_logits(sup, query, h, gen)[0].double())[0].exp()  # (N,)
        if not bool(torch.isfinite(probs).all()):  # its argmax would be way 0, silently
            raise NonFinite([len(answers)], len(episodes), f"episode {len(answers)}")
        answers.append(int(probs.argmax()))
    done = time.perf_counter()
    return answers, {"sentences": float(len(unique)), "encode_s": encoded - start,
                     "head_s": done - encoded}, kinds


def _write_json(obj: Any, path: Path, source: Path | None = None) -> None:
    """``obj`` as strict JSON (no bare NaN or Infinity, which strict readers refuse)."""
    try:
        text = json.dumps(obj, allow_nan=False)
    except ValueError as exc:  # NaN or Infinity in the records of ``source``
        raise PipelineError(f"{path} would hold NaN or Infinity, which is not JSON; remove "
                            f"them from {source}") from exc
    with atomic_path(path) as tmp:
        tmp.write_text(text + "\n")


def record_bytes(records: Sequence[Any]) -> int:
    """The mean size of ``records`` written as JSON (at least 1)."""
    try:
        return max(sum(len(json.dumps(r)) for r in records) // max(len(records), 1), 1)
    except (TypeError, ValueError, RecursionError):  # parse_episodes names what is wrong
        return 1


def _answers(path: Path, what: str) -> list[int]:
    data = load_json(path, fix=f"give {what} as a JSON list of way indices")
    if not isinstance(data, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in data):
        raise PipelineError(f"{what} {path} is not a JSON list of non-negative integers "
                            "(one way index per episode)")
    return data


def run_predict(args: argparse.Namespace) -> dict[str, Any]:
    if args.batch_size < 1:
        raise PipelineError("--batch-size must be >= 1")
    check_seed(args.seed)
    check_threads(args.threads)
    check_readable(args.input, "--input")
    check_writable(args.out)
    refuse_same(args.out, "--out", {"--input": args.input, "--checkpoint": args.checkpoint,
                                    "--pid2name": args.pid2name})
    episodes = parse_episodes(load_json(args.input, fix=(
        "give --input FewRel's test input: a JSON list of {meta_train, meta_test}")),
        str(args.input))
    names = read_pid2name(args.pid2name) if args.pid2name is not None else {}
    device = stage_cli.threads_and_device(args.threads, args.device, "--device")
    predictor = Predictor.from_checkpoint(args.checkpoint, device, seed=args.seed,
                                          batch_size=args.batch_size)
    check_episodes_time(predictor, episodes)  # before anything is encoded or sampled
    answers, timing, priors = predict_episodes(predictor, episodes, names=names)
    _write_json(answers, args.out)
    total = timing["encode_s"] + timing["head_s"]
    print(f"{len(episodes)} episodes -> {shown(args.out)}: {int(timing['sentences'])} distinct "
          f"sentences encoded in {timing['encode_s']:.1f}s "
          f"({timing['sentences'] / max(timing['encode_s'], 1e-9):.1f} sentences/s), "
          f"heads {timing['head_s']:.1f}s, total {total:.1f}s on {device}")
    print(f"{sum(ep.relations is not None for ep in episodes)} of {len(episodes)} episodes "
          "carry relation ids; priors over the ways of every episode: " + (", ".join(
              f"{k} {n}" for k, n in priors.items()) + " (graph: relation graph and label; "
          "label: the relation's name alone)" if priors else "none (no prior)"))
    return {"answers": answers, "priors": priors, **timing}


def run_make(args: argparse.Namespace) -> dict[str, Any]:
    check_seed(args.seed)
    check_readable(args.data, "--data")
    check_writable(args.out)
    check_writable(args.answers, "--answers")
    refuse_same(args.out, "--out", {"--data": args.data})
    refuse_same(args.answers, "--answers", {"--out": args.out, "--data": args.data})
    data = load_json(args.data, fix="give --data a FewRel-format JSON file")
    inputs, gold = make_episodes(data, args.ways, args.shots, args.episodes, args.seed,
                                 str(args.data), with_relations=not args.no_relations)
    parse_episodes(inputs, str(args.data))  # the records must be readable, now not later
    _write_json(inputs, args.out, args.data)
    _write_json(gold, args.answers)
    print(f"{len(inputs)} {args.ways}-way {args.shots}-shot episodes -> {shown(args.out)} (with "
          f"relation ids: {'no' if args.no_relations else 'yes'}), gold -> {shown(args.answers)}")
    return {"inputs": inputs, "gold": gold}


def run_score(args: argparse.Namespace) -> dict[str, Any]:
    check_readable(args.pred, "--pred")
    check_readable(args.answers, "--answers")
    pred, gold = _answers(args.pred, "--pred"), _answers(args.answers, "--answers")
    if len(pred) != len(gold):
        raise PipelineError(f"--pred has {len(pred)} answers but --answers has {len(gold)}; "
                            "both must have one per episode of the same test input")
    if not gold:
        raise PipelineError(f"{args.answers} holds no answers")
    acc, ci = mean_ci95(np.array(pred) == np.array(gold))
    print(f"accuracy {acc:.2f} ± {ci:.2f} (95% interval, {len(gold)} episodes)")
    return {"accuracy": acc, "ci95": ci, "episodes": len(gold)}


def parser() -> argparse.ArgumentParser:
    p = stage_cli.parser(__doc__, prog="regrab-fewrel-test")
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("predict", help="write the answer file for a test input")
    pr.add_argument("--checkpoint", type=Path, required=True,
                    help="model.safetensors or a folder from regrab-models export")
    pr.add_argument("--input", type=Path, required=True, help="FewRel test input JSON")
    pr.add_argument("--out", type=Path, required=True, help="answers, a JSON list; not --input")
    pr.add_argument("--pid2name", type=Path, default=None, help="FewRel's pid2name.json: names "
                    "(and descriptions) of relation ids outside the checkpoint's graph")
    pr.add_argument("--seed", type=int, default=0, help="posterior samples' seed, 0 to 2**63 - 1")
    pr.add_argument("--device", default="auto", help="auto | cpu | cuda")
    pr.add_argument("--batch-size", type=int, default=64, help="sentences per encoder batch")
    pr.add_argument("--threads", type=int, default=0, help="torch threads, at most the CPUs "
                    "(0: its default)")
    mk = sub.add_parser("make", help="test input and gold answers from a FewRel-format file")
    mk.add_argument("--data", type=Path, required=True, help="e.g. val_wiki.json")
    mk.add_argument("--ways", type=int, default=5)
    mk.add_argument("--shots", type=int, default=1)
    mk.add_argument("--episodes", type=int, default=1000, help="at most what fits in half "
                    "the machine's memory")
    mk.add_argument("--seed", type=int, default=0, help="0 to 2**63 - 1")
    mk.add_argument("--out", type=Path, required=True,
                    help="test input JSON to write; never --data or --answers")
    mk.add_argument("--answers", type=Path, required=True,
                    help="gold answers JSON to write; never --data or --out")
    mk.add_argument("--no-relations", action="store_true", help="no relation ids (CodaLab form)")
    sc = sub.add_parser("score", help="accuracy of an answer file against gold answers")
    sc.add_argument("--pred", type=Path, required=True)
    sc.add_argument("--answers", type=Path, required=True)
    return p


def fewrel_submission(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the arguments and run one subcommand; returns what it computed."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("--") and argv[0] != "--help":
        argv = ["predict", *argv]  # the bare form: regrab-fewrel-test --checkpoint ...
    args = parser().parse_args(argv)
    return {"predict": run_predict, "make": run_make, "score": run_score}[args.command](args)


def main(argv: list[str] | None = None) -> None:
    """Console entry point ``regrab-fewrel-test``: one ``error:`` line on bad input (exit 2);
    Ctrl-C exits 130, SIGTERM 143."""
    run_command(fewrel_submission, argv)


if __name__ == "__main__":
    main()
