"""The output tables: exact deduplication, the triples writer, relations with their texts.

Triples are deduplicated across all inputs and written in order of first occurrence with
``source`` = the input's file name. A property's English label and description come from
its entity in the dumps, else (each on its own) from FewRel's ``pid2name.json``, whose
placeholders (``"None"``, ``"No description defined"``) count as missing; aliases come only
from the dumps. The table says where each label and description came from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.errors import PipelineError
from pipeline.fewrel import read_relations_file
from pipeline.io import atomic_path
from pipeline.schemas import RELATIONS_SCHEMA, TRIPLES_SCHEMA
from pipeline.wikidata.collect import ParseResult
from pipeline.wikidata.parse import clean_text, id_number

#: Rows per Parquet write when streaming the triples table out.
WRITE_CHUNK_ROWS = 1 << 20
#: What FewRel's pid2name.json writes where Wikidata had no English name or description.
PID2NAME_PLACEHOLDERS = frozenset({"None", "No description defined"})


def first_occurrences(parsed: ParseResult) -> np.ndarray:
    """Indices of each distinct triple's first occurrence, ascending; fills per-file counts.

    Sets ``distinct_triples`` (distinct triples in the file) and ``new_triples`` (those
    first seen in it, i.e. its rows in the output) on every ``FileStats``.
    """
    n = len(parsed.heads)
    files = len(parsed.stats)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    # Sorting by (head, relation, tail, file) groups repeats; the file key lets the same
    # pass count distinct triples per file.
    order = np.lexsort((parsed.file_index, parsed.tails, parsed.relations, parsed.heads))
    h, r, t = parsed.heads[order], parsed.relations[order], parsed.tails[order]
    f = parsed.file_index[order]
    new_triple = np.ones(n, dtype=bool)
    new_triple[1:] = (h[1:] != h[:-1]) | (r[1:] != r[:-1]) | (t[1:] != t[:-1])
    del h, r, t
    new_pair = new_triple.copy()
    new_pair[1:] |= f[1:] != f[:-1]
    distinct = np.bincount(f[new_pair], minlength=files)
    starts = np.flatnonzero(new_triple)
    # The smallest index in each group is the first occurrence, whatever the sort's
    # tie order.
    first = np.minimum.reduceat(order, starts)
    first.sort()
    new = np.bincount(parsed.file_index[first], minlength=files)
    for stats, d, k in zip(parsed.stats, distinct, new, strict=True):
        stats.distinct_triples, stats.new_triples = int(d), int(k)
    return first


def _id_strings(prefix: str, numbers: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise(prefix, pc.cast(pa.array(numbers), pa.string()), "")


def write_triples(parsed: ParseResult, keep: np.ndarray, path: Path) -> None:
    """Stream the kept triples to ``path`` as TRIPLES_SCHEMA Parquet, atomically.

    Written in row groups rather than through ``pipeline.io.write_parquet`` so that the
    string columns of a full dump never exist in memory at once; ``atomic_path`` gives
    the same all-or-nothing write.
    """
    names = pa.array([s.name for s in parsed.stats], pa.string())
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, TRIPLES_SCHEMA) as writer:
        for start in range(0, max(len(keep), 1), WRITE_CHUNK_ROWS):
            rows = keep[start : start + WRITE_CHUNK_ROWS]
            table = pa.table(
                [
                    _id_strings("Q", parsed.heads[rows]),
                    _id_strings("P", parsed.relations[rows]),
                    _id_strings("Q", parsed.tails[rows]),
                    names.take(pa.array(parsed.file_index[rows].astype(np.int32))),
                ],
                schema=TRIPLES_SCHEMA,
            )
            writer.write_table(table)


@dataclass
class Pid2Name:
    """FewRel's ``pid2name.json``, cleaned: names and descriptions by property number.

    Attributes:
        names, descriptions: Cleaned text (:func:`~pipeline.wikidata.parse.clean_text`),
            without FewRel's placeholders.
        malformed_descriptions: Entries whose description was not a string (skipped).
    """

    names: dict[int, str] = field(default_factory=dict)
    descriptions: dict[int, str] = field(default_factory=dict)
    malformed_descriptions: int = 0


def _pid2name_text(text: str) -> str | None:
    text = clean_text(text)
    return None if text in PID2NAME_PLACEHOLDERS else text


def load_pid2name(path: Path) -> Pid2Name:
    """FewRel ``pid2name.json`` (``{"P17": [name, description], ...}``) -> :class:`Pid2Name`.

    A description that is not a string is skipped and counted, like a bad field of a dump.

    The file is read by :func:`pipeline.fewrel.read_relations_file`; its entries by this
    stage's own, lenient rule (FewRel's placeholders are missing text, a key written twice
    keeps its last entry).

    Raises:
        PipelineError: The file is missing or not in that layout (a name that is no string).
    """
    try:
        data = read_relations_file(path, "download FewRel's pid2name.json again")
    except PipelineError as exc:
        raise PipelineError(f"--pid2name {exc}") from None
    try:  # a lone surrogate escape ("\\ud800") decodes but cannot be written to Parquet
        orjson.dumps(data)
    except orjson.JSONEncodeError as exc:
        raise PipelineError(
            f"--pid2name {path} is not valid JSON ({exc}); download it again"
        ) from None
    out = Pid2Name()
    for key, value in data.items():
        number = id_number(key, "P")
        name = value[0] if isinstance(value, list) and value else value
        if number is None:  # FewRel's file has a placeholder "P0": ["None", "None"]
            continue
        if not isinstance(name, str):
            raise PipelineError(
                f"--pid2name {path}: entry {key!r}: {value!r} is not Pid -> [name, description]; "
                "use FewRel's pid2name.json"
            )
        if (name := _pid2name_text(name)) is not None:
            out.names[number] = name
        if isinstance(value, list) and len(value) > 1:
            if not isinstance(value[1], str):
                out.malformed_descriptions += 1
            elif (description := _pid2name_text(value[1])) is not None:
                out.descriptions[number] = description
    return out


def _pick(number: int, dump: dict[int, str], fallback: dict[int, str],
          origin: Counter) -> tuple[str | None, str | None]:
    """A property's text and its source: the dump's, else pid2name's; counted in ``origin``."""
    for source, texts in (("dump", dump), ("pid2name", fallback)):
        if number in texts:
            origin[source] += 1
            return texts[number], source
    origin["missing"] += 1
    return None, None


def relations_table(
    parsed: ParseResult, keep: np.ndarray, pid2name: Pid2Name
) -> tuple[pa.Table, dict[str, Any]]:
    """RELATIONS_SCHEMA table of every relation with triples, by property number.

    Returns:
        The table and its report counts: ``labels`` and ``descriptions`` by source (``dump``,
        ``pid2name``, ``missing``), ``aliases`` (relations with any, and how many in all).
    """
    counts = np.bincount(parsed.relations[keep]) if len(keep) else np.zeros(0, np.int64)
    numbers = np.flatnonzero(counts).tolist()
    columns: dict[str, list] = {name: [] for name in RELATIONS_SCHEMA.names}
    label_origin, description_origin = Counter(), Counter()
    for number in numbers:
        label, label_source = _pick(number, parsed.labels, pid2name.names, label_origin)
        description, description_source = _pick(
            number, parsed.descriptions, pid2name.descriptions, description_origin
        )
        columns["label"].append(label)
        columns["label_source"].append(label_source)
        columns["description"].append(description)
        columns["description_source"].append(description_source)
        columns["aliases"].append(parsed.aliases.get(number, []))
    columns["relation"] = [f"P{n}" for n in numbers]
    columns["triple_count"] = counts[numbers].tolist()
    table = pa.table(columns, schema=RELATIONS_SCHEMA)
    sources = ("dump", "pid2name", "missing")
    aliases = [len(values) for values in columns["aliases"]]
    return table, {
        "labels": {key: label_origin[key] for key in sources},
        "descriptions": {key: description_origin[key] for key in sources},
        "aliases": {"relations": sum(n > 0 for n in aliases), "aliases": sum(aliases)},
    }


def relation_coverage(path: Path, relations: set[str]) -> dict[str, Any]:
    """How many of a FewRel file's relations (its top-level keys) have triples.

    Raises:
        PipelineError: The file is missing or not a FewRel-format JSON object.
    """
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise PipelineError(
            f"cannot read --coverage {path} ({exc.strerror}); check the path"
        ) from exc
    except orjson.JSONDecodeError as exc:
        raise PipelineError(
            f"--coverage {path} is not valid JSON ({exc}); download it again"
        ) from exc
    if not isinstance(data, dict) or not all(id_number(k, "P") for k in data):
        raise PipelineError(
            f"--coverage {path} is not FewRel-format JSON (an object keyed by relation Pids)"
        )
    wanted = sorted(data, key=lambda pid: int(pid[1:]))
    missing = [pid for pid in wanted if pid not in relations]
    return {
        "path": str(path),
        "relations": len(wanted),
        "covered": len(wanted) - len(missing),
        "missing": missing,
    }
