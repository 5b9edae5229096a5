"""A team's own labelled relations (``data/own``): read, checked, and split into the part
that joins FewRel's meta-training and the part held out to score FewRel's models on.

The folder holds, besides ``*.md`` notes and hidden files, which are left alone:

- FewRel-format ``.json`` files, ``{"relation key": [{"tokens", "h", "t"}, ...]}``, each record
  read by :func:`pipeline.fewrel.parse_record` (the reading ``prepare_fewshot`` gives FewRel);
- ``regrab-predict`` JSONL files, ``.jsonl``: one ``{"relation": key, "text": "[E1]..[/E1] ..
  [E2]..[/E2]"}`` per line (or ``tokens`` with FewRel ``h``/``t``), the sentence read by
  :func:`model.predict.sentences.parse_sentence`;
- ``relations.json`` in FewRel's ``pid2name.json`` format, ``{"key": ["name", "description"]}``
  (:func:`pipeline.fewrel.load_relation_texts`): every relation with sentences needs a name,
  a description is optional.

A relation may be spread over several files. Rows that cannot be used are skipped and counted
per file, up to ``prepare_own.max_bad_rows``; anything else wrong is one
:class:`~pipeline.errors.PipelineError` naming the file and the fix: a file that cannot be
read, more bad rows than allowed, a relation with fewer than ``min_sentences`` sentences or
without a name, and a key or name that is a benchmark's relation. Own relations are refused,
never renamed, when they collide: a benchmark's test relation must never be trained on, and a
key equal to a FewRel training relation would merge two relations' sentences under one key.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from model.predict.sentences import Sentence, parse_sentence
from pipeline.config import field, register_section
from pipeline.errors import PipelineError
from pipeline.fewrel import BadRecord, load_json, load_relation_texts, parse_record
from pipeline.schemas import FEWSHOT_SCHEMA

#: The relations file of the folder: names and descriptions, no sentences.
RELATIONS_FILE = "relations.json"
#: Data files by suffix: FewRel format or regrab-predict JSONL.
FORMATS = {".json": "fewrel", ".jsonl": "jsonl"}
#: The longest relation key taken (keys name rows, reports and files).
MAX_KEY = 200


@register_section("prepare_own")
@dataclass(frozen=True)
class PrepareOwnParams:
    """``params.yaml`` section ``prepare_own``: checks on ``data/own`` and its held-out part."""

    min_sentences: int = field(ge=2, doc="fewest usable sentences an own relation needs; one "
                                         "with fewer is refused (training episodes take K + Q "
                                         "sentences of a relation: 10 for 5 shots and 5 "
                                         "queries)")
    max_bad_rows: int = field(ge=0, doc="malformed rows (records or lines) skipped and counted "
                                        "per file; a file with more is refused")
    heldout_share: float = field(ge=0, le=1, doc="share of own relations held out of training "
                                                 "and scored by evaluate_own (rounded, at "
                                                 "least 2 when above 0; 0: all train)")
    seed: int = field(doc="seed of the held-out draw")


@dataclass
class OwnFile:
    """What one data file gave: its rows (``FEWSHOT_SCHEMA`` minus the relation name) and
    the rows it skipped, by reason, with the first one's place."""

    path: Path
    kind: str
    rows: list[dict[str, Any]]
    skipped: Counter[str]
    first_bad: str | None = None

    def skip(self, where: str, reason: str) -> None:
        self.skipped[reason.split(";")[0][:80]] += 1
        self.first_bad = self.first_bad or f"{where}: {reason}"


def data_files(folder: Path) -> list[Path]:
    """The data files of ``folder`` in name order; notes (``*.md``) and hidden files are left
    alone, and anything else is refused (a file of another format would be silently unread).
    """
    if not folder.is_dir():
        raise PipelineError(f"{folder} is not a folder; create it (a README.md alone is fine: "
                            "no own relations)")
    files = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.suffix.lower() == ".md" or \
                path.name == RELATIONS_FILE:
            continue
        if not path.is_file() or path.suffix.lower() not in FORMATS:
            raise PipelineError(
                f"{path}: not an own-data file (FewRel-format .json or regrab-predict .jsonl, "
                f"with names in {RELATIONS_FILE}); convert it or move it out of {folder}")
        files.append(path)
    return files


def _row(file: OwnFile, relation: str, index: str, sentence: Sentence,
         ids: tuple[str | None, str | None] = (None, None)) -> None:
    (hs, he), (ts, te) = sentence.head, sentence.tail
    if hs < te and ts < he:  # markers cannot go round overlapping mentions
        raise BadRecord("overlapping_entities")
    file.rows.append({"instance_id": f"own-{file.path.name}-{index}", "relation": relation,
                      "tokens": list(sentence.tokens), "head_start": hs, "head_end": he,
                      "tail_start": ts, "tail_end": te, "head_id": ids[0], "tail_id": ids[1]})


def _key(key: Any) -> str:
    """A relation key as given, refused when blank or overlong (it names rows and reports)."""
    if not isinstance(key, str) or not key.strip():
        raise BadRecord("relation key missing or blank")
    if len(key) > MAX_KEY:
        raise BadRecord(f"relation key longer than {MAX_KEY} characters")
    return key


def read_fewrel(path: Path) -> OwnFile:
    """A FewRel-format file's sentences; bad records are skipped and counted."""
    data = load_json(path, fix=f"fix {path} (a .json file in the own folder is FewRel format; "
                               "one row per line goes in a .jsonl file)")
    if not isinstance(data, dict):
        raise PipelineError(f"{path}: expected a FewRel-format object {{relation: [{{tokens, "
                            "h, t}}, ...]}}; fix the file, or put one row per line in .jsonl")
    out = OwnFile(path, "fewrel", [], Counter())
    for relation, records in data.items():
        try:
            key = _key(relation)
        except BadRecord as exc:
            out.skip(f"relation {str(relation)[:40]!r}", str(exc))
            continue
        if not isinstance(records, list):
            out.skip(f"relation {key[:40]!r}", "relation_not_a_list")
            continue
        for i, record in enumerate(records):
            try:
                fields = parse_record(record)
                sentence = Sentence(tuple(fields["tokens"]),
                                    (fields["head_start"], fields["head_end"]),
                                    (fields["tail_start"], fields["tail_end"]))
                _row(out, key, f"{key}-{i:05d}", sentence, (fields["head_id"], fields["tail_id"]))
            except (BadRecord, PipelineError) as exc:
                out.skip(f"relation {key[:40]!r} record {i}", str(exc))
    return out


def read_jsonl(path: Path) -> OwnFile:
    """A JSONL file's rows ``{"relation": ..., "text": ...}``; bad lines are skipped and
    counted."""
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as exc:
        raise PipelineError(f"{path} cannot be read as UTF-8 text ({exc}); fix or replace "
                            "it") from exc
    out = OwnFile(path, "jsonl", [], Counter())
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            out.skip(f"line {number}", f"not JSON ({exc.msg})")
            continue
        except RecursionError:
            out.skip(f"line {number}", "JSON nested too deeply")
            continue
        try:
            if not isinstance(record, dict):
                raise BadRecord("not an object {relation, text}")
            key = _key(record.get("relation"))
            _row(out, key, f"{number:06d}", parse_sentence(record))
        except (BadRecord, PipelineError) as exc:
            out.skip(f"line {number}", str(exc))
    return out


def read_file(path: Path, max_bad_rows: int) -> OwnFile:
    """One data file, refused when it cannot be read, gave no sentence or skipped more than
    ``max_bad_rows`` rows."""
    try:
        got = read_fewrel(path) if FORMATS[path.suffix.lower()] == "fewrel" else read_jsonl(path)
    except OSError as exc:
        raise PipelineError(f"{path} cannot be read ({exc.strerror}); check its permissions "
                            "or remove it") from exc
    bad = sum(got.skipped.values())
    if bad > max_bad_rows:
        raise PipelineError(f"{path}: {bad} malformed rows, more than prepare_own.max_bad_rows="
                            f"{max_bad_rows} (first: {got.first_bad}); fix them, or raise "
                            "prepare_own.max_bad_rows to skip them")
    if not got.rows:
        raise PipelineError(f"{path} holds no sentence; add labelled sentences or remove it")
    return got


@dataclass(frozen=True)
class Reserved:
    """Relations of a benchmark file that own relations must not be: ``keys`` by key, and
    for test relations ``names`` (normalised name -> key) as well."""

    label: str
    role: str  # "test" or "training"
    keys: frozenset[str]
    names: dict[str, str]

    @classmethod
    def from_table(cls, label: str, role: str, table: pa.Table) -> Reserved:
        keys = table.column("relation").to_pylist()
        names = table.column("relation_name").to_pylist()
        named = {} if role != "test" else {_norm(n): k for k, n in zip(keys, names, strict=True)
                                           if n and n != k}
        return cls(label, role, frozenset(keys), named)


def _norm(name: str) -> str:
    return " ".join(name.lower().split())


def check_reserved(relations: dict[str, tuple[str, str | None]], where: dict[str, list[str]],
                   reserved: list[Reserved], texts_path: Path) -> None:
    """Refuse an own relation whose key is a benchmark relation, or whose name is a
    benchmark test relation's name (then it is that relation under another key)."""
    for key, (name, _) in relations.items():
        files = ", ".join(where[key])
        for res in reserved:
            if key in res.keys:
                why = ("a benchmark's test relations are never trained on" if res.role == "test"
                       else "its sentences would merge with FewRel's under one key")
                raise PipelineError(
                    f"{files}: relation key {key!r} is a {res.role} relation of {res.label} "
                    f"({why}); rename it in the data and in {texts_path.name} (e.g. "
                    f"own_{key}), or leave it out")
            if _norm(name) in res.names:
                raise PipelineError(
                    f"{texts_path}: own relation {key!r} is named {name!r}, the name of test "
                    f"relation {res.names[_norm(name)]} of {res.label}; a benchmark's test "
                    "relation must never be trained on: leave it out, or name it apart if it "
                    "means something else")


def heldout_count(n: int, share: float) -> int:
    """Relations held out of ``n``: ``share`` of them rounded, at least 2 (the fewest ways of
    an episode) when the share is above 0, at most ``n``."""
    if share <= 0 or n == 0:
        return 0
    return min(n, max(2, math.floor(share * n + 0.5)))


def table_of(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows as a ``FEWSHOT_SCHEMA`` table (an empty one for no rows)."""
    cols = {f.name: [r[f.name] for r in rows] for f in FEWSHOT_SCHEMA}
    return pa.table(cols, schema=FEWSHOT_SCHEMA)


def prepare(folder: Path, cfg: PrepareOwnParams, reserved: list[Reserved]
            ) -> tuple[pa.Table, pa.Table, dict[str, tuple[str, str | None]], dict[str, Any]]:
    """Read and check ``folder``; split its relations (seeded) into training and held out.

    Returns:
        The training part and the held-out part (``FEWSHOT_SCHEMA``, rows ordered by relation
        then file), the relation texts (key -> (name, description)) and a summary.
    """
    files = [read_file(path, cfg.max_bad_rows) for path in data_files(folder)]
    texts_path = folder / RELATIONS_FILE
    texts = load_relation_texts(texts_path) if texts_path.is_file() else {}
    rows: dict[str, list[dict[str, Any]]] = {}
    where: dict[str, list[str]] = {}
    for got in files:
        for row in got.rows:
            rows.setdefault(row["relation"], []).append(row)
            if str(got.path) not in where.setdefault(row["relation"], []):
                where[row["relation"]].append(str(got.path))
    for key in sorted(rows):
        if key not in texts:
            raise PipelineError(
                f"{texts_path}: no name for relation {key!r} (sentences in "
                f"{', '.join(where[key])}); add \"{key}\": [\"name\", \"description\"] "
                + ("to it" if texts_path.is_file() else "in a new file of that name"))
        if len(rows[key]) < cfg.min_sentences:
            raise PipelineError(
                f"{', '.join(where[key])}: relation {key!r} has {len(rows[key])} usable "
                f"sentences, fewer than prepare_own.min_sentences={cfg.min_sentences} "
                "(episodes take K + Q sentences of each relation); label more, or leave it out")
    own = {k: texts[k] for k in sorted(rows)}
    check_reserved(own, where, reserved, texts_path)
    keys = sorted(own)
    n_held = heldout_count(len(keys), cfg.heldout_share)
    held = set(np.random.default_rng(cfg.seed).permutation(keys)[:n_held].tolist()) \
        if n_held else set()
    parts: dict[str, list[dict[str, Any]]] = {"train": [], "heldout": []}
    for key in keys:
        part = "heldout" if key in held else "train"
        parts[part] += [{**r, "relation_name": own[key][0]} for r in rows[key]]
    summary = {
        "files": {got.path.name: {"format": got.kind, "sentences": len(got.rows),
                                  "skipped": sum(got.skipped.values()),
                                  "skipped_by_reason": dict(sorted(got.skipped.items()))}
                  for got in files},
        "relations": {k: {"name": own[k][0], "description": own[k][1],
                          "sentences": len(rows[k]), "part": "heldout" if k in held else "train",
                          "files": [Path(p).name for p in where[k]]} for k in keys},
        "train": [k for k in keys if k not in held],
        "heldout": sorted(held),
        "named_without_sentences": sorted(set(texts) - set(own)),
        "heldout_share": cfg.heldout_share,
        "seed": cfg.seed,
    }
    return table_of(parts["train"]), table_of(parts["heldout"]), own, summary
