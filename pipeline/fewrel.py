"""FewRel-format JSON: read a file, validate its records, turn them into a table.

FewRel layout: ``{"P413": [{"tokens": [...], "h": [name, qid, [[pos, ...]]],
"t": [...]}, ...]}``. Each record becomes one row of ``FEWSHOT_SCHEMA``; the
first mention of each entity gives its half-open span. Malformed records are
skipped and counted by reason, never kept; a dataset in which no record can be
used is an error. The ``prepare_fewshot`` stage and ``regrab-score`` read their
FewRel files through here.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.errors import PipelineError
from pipeline.schemas import FEWSHOT_SCHEMA


class BadRecord(ValueError):
    """A record that cannot be used; the message is the skip reason."""


def mention_positions(entity: Any) -> Any:
    """The token positions of a FewRel entity's first mention, as written (not checked).

    The one reading of FewRel's ``h``/``t`` entry, ``[name, id, [[positions], ...]]``, for
    the pipeline's reader and for the sentences of users' records.

    Raises:
        BadRecord: ``malformed`` (not ``[name, id, mentions]``) or ``no_mention`` (no first
            mention that is a list).
    """
    if not isinstance(entity, list | tuple) or len(entity) < 3:
        raise BadRecord("malformed")
    mentions = entity[2]
    if not isinstance(mentions, list | tuple) or not mentions \
            or not isinstance(mentions[0], list):
        raise BadRecord("no_mention")
    return mentions[0]


def mention_span(positions: list[int]) -> tuple[int, int]:
    """The half-open ``[start, end)`` token span of a mention's (non-empty) positions: FewRel
    lists them one by one, so the span runs from the lowest to past the highest."""
    return min(positions), max(positions) + 1


def _span(entity: Any, n_tokens: int, side: str) -> tuple[int, int, str | None]:
    try:
        positions = mention_positions(entity)
    except BadRecord as exc:
        raise BadRecord(f"{side}_{exc}") from None
    if not positions or not all(isinstance(p, int) and not isinstance(p, bool) for p in positions):
        raise BadRecord(f"{side}_bad_positions")
    start, end = mention_span(positions)
    if start < 0 or end > n_tokens:
        raise BadRecord(f"{side}_span_outside_sentence")
    qid = entity[1] if isinstance(entity[1], str) and entity[1] else None
    return start, end, qid


def parse_record(record: Any) -> dict[str, Any]:
    """Validate one FewRel record and return its span fields, or raise BadRecord."""
    if not isinstance(record, dict):
        raise BadRecord("not_an_object")
    tokens = record.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise BadRecord("empty_tokens")
    if not all(isinstance(tok, str) and tok for tok in tokens):
        raise BadRecord("bad_token")
    h_start, h_end, h_id = _span(record.get("h"), len(tokens), "head")
    t_start, t_end, t_id = _span(record.get("t"), len(tokens), "tail")
    if h_start < t_end and t_start < h_end:
        # Entity markers cannot be placed around overlapping mentions.
        raise BadRecord("overlapping_entities")
    return {
        "tokens": tokens,
        "head_start": h_start, "head_end": h_end,
        "tail_start": t_start, "tail_end": t_end,
        "head_id": h_id, "tail_id": t_id,
    }


def convert(
    name: str, data: Any, relation_names: dict[str, str]
) -> tuple[pa.Table, dict[str, Any]]:
    """Turn a loaded FewRel dict into a table and a report of what was skipped."""
    if not isinstance(data, dict):
        raise PipelineError(
            f"{name}: expected a JSON object mapping relation ids to lists; re-fetch it"
        )
    rows: dict[str, list[Any]] = {field.name: [] for field in FEWSHOT_SCHEMA}
    skipped: Counter[str] = Counter()
    per_relation: dict[str, int] = {}
    for relation in sorted(data):
        records = data[relation]
        if not isinstance(records, list):
            skipped["relation_not_a_list"] += 1
            continue
        kept = 0
        for index, record in enumerate(records):
            try:
                fields = parse_record(record)
            except BadRecord as exc:
                skipped[str(exc)] += 1
                continue
            rows["instance_id"].append(f"{name}-{relation}-{index:05d}")
            rows["relation"].append(relation)
            rows["relation_name"].append(relation_names.get(relation, relation))
            for key, value in fields.items():
                rows[key].append(value)
            kept += 1
        per_relation[relation] = kept
    if not rows["instance_id"]:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items())) or "no records"
        raise PipelineError(
            f"{name}: no usable record ({reasons}); it is not FewRel-format "
            "({relation: [{tokens, h, t}, ...]}), replace the file"
        )
    table = pa.table(rows, schema=FEWSHOT_SCHEMA)
    report = {
        "kept": table.num_rows,
        "skipped": sum(skipped.values()),
        "skipped_by_reason": dict(sorted(skipped.items())),
        "relations": len(per_relation),
        "instances_per_relation": per_relation,
    }
    return table, report


class _KeyTwice(ValueError):
    """A JSON object names one key twice (the key is the argument)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json``'s ``object_pairs_hook``: the object, refusing a key it names twice, which
    ``json`` would keep the last of (a relation given twice lost its first sentences)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _KeyTwice(key)
            seen.add(key)
    return obj


def load_json(path: Path, fix: str | None = None, unique_keys: bool = True) -> Any:
    """Load a JSON file, turning a missing, corrupt or hostile file into a one-line error.

    With ``unique_keys``, an object that names a key twice (a relation given twice) is
    refused, naming the key: ``json`` alone would keep the last and drop the rest without a
    word. Relations files (``pid2name.json``) pass False: their readers keep one entry of a
    name written twice alike, and ``regrab-predict`` refuses one written twice differently.

    Args:
        path: the file.
        fix: what to do about a bad file that a user gave (default: the advice for the
            pipeline's own files, which the fetch stage brings).
    """
    if not path.is_file():
        raise PipelineError(
            f"{path} not found; " + (fix or f"list {path.name} under fetch.files in params.yaml "
                                     f"(then dvc repro fetch) or copy it into {path.parent}")
        )
    try:
        with path.open("rb") as fh:
            return json.load(fh, object_pairs_hook=_unique_keys if unique_keys else None)
    except _KeyTwice as exc:
        raise PipelineError(
            f"{path}: key {str(exc.args[0])[:80]!r} is given twice in one JSON object (only "
            "the last would be read); merge the two into one entry, "
            f"{fix or 'then re-fetch it with dvc repro -f fetch'}") from None
    except RecursionError as exc:
        raise PipelineError(f"{path} is nested too deeply to be FewRel data; replace it") from exc
    # ValueError covers JSONDecodeError, UnicodeDecodeError and over-long integer literals.
    except ValueError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PipelineError(
            f"{path} is not valid JSON ({reason}); {fix or 're-fetch it with dvc repro -f fetch'}"
        ) from exc


#: What FewRel's pid2name.json writes where Wikidata has no description.
NO_DESCRIPTION = ("no description defined", "none")


def relation_text(value: Any) -> tuple[str, str | None] | None:
    """One relations-file entry as (name, description or None), or None if it is malformed.

    The one reading of a ``pid2name.json`` entry: ``[name]`` or ``[name, description]``, both
    strings and the name not blank; runs of whitespace become one space, and FewRel's
    placeholder for a missing description ("No description defined") is no description.
    """
    if not (isinstance(value, list) and 1 <= len(value) <= 2
            and all(isinstance(v, str) for v in value)):
        return None
    name = " ".join(value[0].split())
    description = " ".join(value[1].split()) if len(value) == 2 else ""
    if description.lower() in NO_DESCRIPTION:
        description = ""
    return (name, description or None) if name else None


def read_relations_file(path: Path, fix: str, unique_keys: bool = False) -> dict[str, Any]:
    """The JSON object of a relations file, FewRel's ``pid2name.json`` format
    (``{"key": ["name", "description"], ...}``), its entries as written.

    The one reader of that format's file: every caller reads the entries with its own rule
    (:func:`relation_text` for a user's file, the parse stage's lenient reading of FewRel's).
    A key written twice is kept once (the last), as ``json`` does, unless ``unique_keys``.

    Raises:
        PipelineError: the file is missing, not JSON, or not a JSON object; ``fix`` ends the
            line.
    """
    data = load_json(path, fix=fix, unique_keys=unique_keys)
    if not isinstance(data, dict):
        raise PipelineError(f"{path}: expected a JSON object mapping each relation to [name, "
                            f"description]; {fix}")
    return data


def load_relation_texts(path: Path, fix: str | None = None, unique_keys: bool = False
                        ) -> dict[str, tuple[str, str | None]]:
    """Map relation key -> (name, description) from a relations file a user gives.

    The format is FewRel's ``pid2name.json``: ``{"key": ["name", "description"], ...}``; the
    description may be left out (``["name"]``) or empty. Unlike :func:`load_relation_names`
    (FewRel's own file, where a bad entry is skipped), every entry must be well formed: the
    file is the user's statement of what their relations mean. Entries are read by
    :func:`relation_text`.

    Args:
        fix: what to do about a bad file (default: fix it).
        unique_keys: refuse a key written twice, even with the same text.

    Raises:
        PipelineError: not a JSON object, or an entry that is not ``[name]`` or
            ``[name, description]`` with a non-empty name.
    """
    fix = fix or f"fix {path}"
    texts: dict[str, tuple[str, str | None]] = {}
    for key, value in read_relations_file(path, fix, unique_keys).items():
        text = relation_text(value)
        if text is None:
            raise PipelineError(f"{path}: entry {str(key)[:80]!r} is not [name, description] "
                                f"with a non-empty name ({str(value)[:80]}); {fix}")
        texts[key] = text
    return texts


def load_relation_descriptions(path: Path | None) -> dict[str, str | None]:
    """Map relation key -> description (None: the entry has none) from a relations file read
    by :func:`load_relation_texts`; ``{}`` without a file. What ``evaluate`` and the labelling
    simulation give priors that read descriptions, for relations outside the graph.
    """
    if path is None:
        return {}
    return {r: d for r, (_, d) in load_relation_texts(path).items()}


def load_relation_names(path: Path | None) -> tuple[dict[str, str], int]:
    """Map relation id -> English name from FewRel's ``pid2name.json`` (optional).

    Returns:
        The names, and how many entries were skipped because they were not
        ``"P..": ["name", "description"]``.
    """
    if path is None or not path.exists():
        return {}, 0
    data = read_relations_file(path, "re-fetch it with dvc repro -f fetch")
    names = {
        pid: value[0]
        for pid, value in data.items()
        if isinstance(value, list) and value and isinstance(value[0], str) and value[0]
    }
    return names, len(data) - len(names)
