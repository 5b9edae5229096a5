"""Input and output files of ``regrab-predict``: JSONL, Parquet or text in, JSONL or Parquet out.

Records keep the line (JSONL, text) or 1-based row (Parquet) they came from, so a skipped
query can be named and an output row joined back to its input. The JSONL written is strict
JSON (no bare ``NaN``), which every JSON reader takes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from cli.text import lone_surrogate
from model.predict.predictions import OTHER_SCORES
from pipeline.errors import PipelineError
from pipeline.io import atomic_path, check_writable

INPUT_FORMATS = (".jsonl", ".json", ".parquet", ".txt")
OUTPUT_FORMATS = (".jsonl", ".parquet")


def _kind(path: Path, allowed: tuple[str, ...], what: str) -> str:
    suffix = path.suffix.lower()
    if suffix not in allowed:
        raise PipelineError(f"{what} {path} has extension {suffix or '(none)'}; use one of "
                            f"{', '.join(allowed)}")
    return suffix


def check_readable(path: Path, flag: str) -> None:
    """Stop when ``path`` is a folder, not a regular file, or a file this process cannot read;
    a path that does not exist is left to the reader, which says so in its own words."""
    if path.is_dir():
        raise PipelineError(f"{flag} {path} is a folder; give a file")
    if path.exists() and not path.is_file():
        # A FIFO or a device: reading one nobody writes to would wait for ever.
        raise PipelineError(f"{flag} {path} is not a regular file (a pipe, socket or "
                            "device); save it to a file and give that")
    if path.exists():
        try:
            path.open("rb").close()
        except OSError as exc:
            raise PipelineError(f"{flag} {path} cannot be read ({exc.strerror}); check its "
                                "permissions or give another file") from exc


def check_output(path: Path, formats: tuple[str, ...] = OUTPUT_FORMATS,
                 option: str = "output") -> str:
    """The output format of ``path`` (its extension, one of ``formats``), once it is known to
    be writable there; ``option`` names it in an error."""
    kind = _kind(path, formats, option)
    check_writable(path)
    return kind


def read_records(path: str | os.PathLike[str], what: str) -> Iterator[tuple[int, Any]]:
    """``(line or row, record)`` for every record of a JSONL, Parquet or text file.

    A JSONL line that is not JSON, or whose strings hold a lone surrogate (``"\\ud800"``,
    which no output can store), yields a :class:`PipelineError` as its record, so the caller
    decides whether it skips it or stops. Blank lines are ignored.
    """
    path = Path(path)
    kind = _kind(path, INPUT_FORMATS, what)
    check_readable(path, what)  # a FIFO nobody writes to would be read for ever
    if not path.is_file():
        raise PipelineError(f"{what} {path} does not exist; check the path")
    if kind == ".parquet":
        try:
            rows = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise PipelineError(f"{what} {path} is not a readable Parquet file ({exc})") from exc
        yield from enumerate(rows, start=1)
        return
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as exc:
        raise PipelineError(f"{what} {path} is not readable UTF-8 text ({exc})") from exc
    if kind != ".txt" and _is_fewrel(text):
        raise PipelineError(
            f"{what} {path} is a FewRel-format file (relation id -> list of sentences), not "
            "one JSON record per line; write one record per line (JSONL), or score a FewRel "
            "file with regrab-score --data")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if kind == ".txt":
            yield number, line.strip()
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            yield number, PipelineError(f"not JSON ({exc.msg} at column {exc.colno})")
            continue
        except RecursionError:
            yield number, PipelineError("JSON nested too deeply to be a sentence record")
            continue
        # Only a \u escape can make one; a surrogate pair escaped this way is fine.
        if "\\u" in line and lone_surrogate(record):
            record = PipelineError("holds a lone surrogate (a \\ud800-\\udfff escape that is "
                                   "half of a UTF-16 pair), which is not text; fix the escape")
        yield number, record


def _is_fewrel(text: str) -> bool:
    """Whether ``text`` is one JSON object of FewRel's layout ``{relation: [record, ...]}``."""
    if not text.lstrip().startswith("{"):
        return False
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # JSONL (or broken JSON): read line by line
        return False
    return isinstance(data, dict) and bool(data) and all(
        isinstance(v, list) and all(isinstance(x, dict) for x in v) for v in data.values())


def write_predictions(rows: list[dict[str, Any]], relations: list[str],
                      path: str | os.PathLike[str]) -> None:
    """Write one row per query, atomically; the format follows the extension.

    In Parquet, ``probabilities`` is a struct with one float64 field per candidate relation,
    and the uncertainty scores that do not apply to every method (and ``abstain_score``) are
    nullable float64 columns.
    """
    schema = pa.schema([
        pa.field("line", pa.int64(), nullable=False),
        pa.field("id", pa.string()),
        pa.field("text", pa.string(), nullable=False),
        pa.field("prediction", pa.string()),
        pa.field("best", pa.string(), nullable=False),
        pa.field("confidence", pa.float64(), nullable=False),
        pa.field("abstain", pa.bool_(), nullable=False),
        pa.field("abstain_score", pa.float64()),
        pa.field("entropy", pa.float64(), nullable=False),
        pa.field("mutual_information", pa.float64(), nullable=False),
        *(pa.field(k, pa.float64()) for k in OTHER_SCORES),
        pa.field("probabilities",
                 pa.struct([pa.field(r, pa.float64()) for r in relations]), nullable=False),
        pa.field("gold", pa.string()),
    ])
    write_rows(rows, path, schema)


def write_support_scores(rows: list[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write one row per support sentence (relation, index, suspicion, flagged, text),
    atomically; the format follows the extension."""
    schema = pa.schema([
        pa.field("relation", pa.string(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),
        pa.field("suspicion", pa.float64()),
        pa.field("flagged", pa.bool_(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
    ])
    write_rows(rows, path, schema)


def write_rows(rows: list[dict[str, Any]], path: str | os.PathLike[str], schema: pa.Schema,
               formats: tuple[str, ...] = OUTPUT_FORMATS) -> None:
    """Write ``rows`` atomically: JSONL (one object per line), or a table of ``schema`` in
    Parquet or CSV; the format follows the extension, one of ``formats``."""
    path = Path(path)
    kind = check_output(path, formats)
    with atomic_path(path) as tmp:
        if kind == ".jsonl":
            with tmp.open("w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
            return
        table = pa.Table.from_pylist(rows, schema=schema)
        if kind == ".csv":
            pcsv.write_csv(table, tmp)
        else:
            pq.write_table(table, tmp)
