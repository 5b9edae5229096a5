"""Parse Wikidata JSON dumps and triple files into deduplicated (head, relation, tail) triples.

Inputs, freely mixed:

* Wikidata JSON dumps, either the official layout (``[``, one entity per line ending in
  ``,``, ``]``) or one entity per line; plain, bzip2 or gzip (detected from the magic
  bytes); datavalues in the current format (``"id": "Q5"``) or the older one (only
  ``"numeric-id": 5`` with ``"entity-type": "item"``).
* Triple files ``Qid Pid Qid`` separated by a tab (Wikidata5m, CoDEx) or a comma (WD50K),
  the separator sniffed from the first line.

A triple is the item-valued main snak (snaktype ``value``, a ``wikibase-entityid`` of
entity type ``item``) of a statement on an item whose rank is not ``deprecated``;
qualifiers and references never count. Triples are deduplicated across all inputs and
written in order of first occurrence with ``source`` = the input's file name. English
property labels come from property entities in the dumps, else from FewRel's
``pid2name.json``.

Decompression and JSON parsing run in parallel: indexed_bzip2 decodes bzip2 blocks on
several threads while the main process cuts the stream into batches of whole lines and a
process pool parses them with orjson. Ids are kept as ``uint32`` numbers (``Q42`` -> 42):
memory grows with the number of triples (12 bytes of ids per raw triple, about 40 at the
final deduplication), never with the size of the text.

Malformed lines and statements are skipped and counted per file; a damaged compressed
stream keeps what was read before the damage and, unless ``--allow-damaged``, fails the
stage after every output is written.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import importlib
import io
import multiprocessing
import os
import time
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from tqdm import tqdm

from pipeline.errors import PipelineError, run_cli
from pipeline.io import atomic_path, write_json, write_parquet
from pipeline.schemas import RELATIONS_SCHEMA, TRIPLES_SCHEMA

#: Bytes of decompressed text handed to one parse task (cut at a line end).
DEFAULT_BATCH_BYTES = 4 << 20
#: A line longer than this is dropped (and counted) instead of being held in memory.
MAX_LINE_BYTES = 512 << 20
#: Malformed-line examples kept per input file for the report.
MAX_EXAMPLES = 5
#: Ids are stored as uint32; Wikidata's item ids are in the hundreds of millions.
MAX_ID = 2**32 - 1
#: Rows per Parquet write when streaming the triples table out.
WRITE_CHUNK_ROWS = 1 << 20
#: Decompressed bytes read to sniff an input's format.
SNIFF_BYTES = 64 << 10

#: Importable name of this module, for the worker processes.
_WORKER_MODULE = "stages.parse_wikidata"
_BZ2_MAGIC = b"BZh"
_GZIP_MAGIC = b"\x1f\x8b"
_TRIPLE_SEPARATORS = {".tsv": "\t", ".txt": "\t", ".csv": ","}
_DECOMPRESSORS = ("auto", "parallel", "stdlib")
# Exceptions the decompressors raise on a truncated or corrupt stream (indexed_bzip2 raises
# RuntimeError/ValueError from C++, the standard library EOFError/OSError).
_STREAM_ERRORS = (OSError, EOFError, ValueError, RuntimeError)


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, as set by taskset or cpusets)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# --------------------------------------------------------------------------- input formats


@dataclass(frozen=True)
class InputFormat:
    """How to read one input file.

    Attributes:
        kind: ``"dump"`` (JSON entities, one per line) or ``"triples"``.
        compression: ``"bz2"``, ``"gzip"`` or ``"none"``, from the magic bytes.
        separator: Field separator of a triple file (tab or comma); None for dumps.
    """

    kind: str
    compression: str
    separator: str | None = None


class CountingReader(io.RawIOBase):
    """A raw file that remembers the furthest offset read, for compressed-MB/s progress.

    The parallel decompressors read ahead and seek, so the furthest offset runs ahead of
    the decoded text by their read-ahead. It has no ``fileno`` on purpose: given a real
    descriptor the C++ decompressors ``pread`` it directly and the offset never moves.
    """

    def __init__(self, path: Path):
        super().__init__()
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        self.furthest = 0

    def readinto(self, buffer: Any) -> int:
        n = self._file.readinto(buffer)
        self.furthest = max(self.furthest, self._file.tell())
        return n

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        super().close()


def _compression_of(path: Path) -> str:
    """Compression from the magic bytes, checked against a ``.bz2``/``.gz`` extension."""
    try:
        with path.open("rb") as fh:
            magic = fh.read(3)
    except OSError as exc:
        raise PipelineError(f"cannot read input {path} ({exc.strerror}); check the path") from exc
    if magic.startswith(_BZ2_MAGIC):
        compression = "bz2"
    elif magic.startswith(_GZIP_MAGIC):
        compression = "gzip"
    else:
        compression = "none"
    expected = {".bz2": "bz2", ".gz": "gzip"}.get(path.suffix.lower())
    if expected and expected != compression:
        raise PipelineError(
            f"{path} is named {path.suffix} but is not {expected}-compressed "
            "(incomplete download?); download it again"
        )
    return compression


def open_text_stream(
    path: Path, compression: str, decompressor: str = "auto", threads: int = 1
) -> tuple[BinaryIO, CountingReader]:
    """Open ``path`` for reading decompressed bytes.

    Args:
        path: Input file.
        compression: ``"bz2"``, ``"gzip"`` or ``"none"``.
        decompressor: ``"parallel"`` uses indexed_bzip2 / rapidgzip, ``"stdlib"`` the
            ``bz2`` / ``gzip`` modules, ``"auto"`` indexed_bzip2 for bzip2 and ``gzip``
            for gzip (rapidgzip 0.16 returns a truncated gzip file without any error,
            and stdlib gzip already outruns the JSON parsing).
        threads: Decompression threads for the parallel decompressors.

    Returns:
        The decompressed stream and the raw reader that tracks the compressed offset.
    """
    raw = CountingReader(path)
    if compression == "none":
        return raw, raw
    if compression == "bz2" and decompressor in ("auto", "parallel"):
        import indexed_bzip2

        return indexed_bzip2.open(raw, parallelization=max(1, threads)), raw
    if compression == "gzip" and decompressor == "parallel":
        import rapidgzip

        return rapidgzip.open(raw, parallelization=max(1, threads)), raw
    if compression == "bz2":
        return bz2.open(raw, "rb"), raw
    return gzip.open(raw, "rb"), raw


def _read_once(stream: BinaryIO) -> Callable[[int], bytes]:
    """``read1`` where there is one: a buffered ``read`` that meets a damaged stream while
    filling its buffer raises and drops what it had already decoded."""
    return getattr(stream, "read1", None) or stream.read


def detect_format(path: str | os.PathLike[str]) -> InputFormat:
    """Decide how to read ``path`` from its magic bytes and first decompressed line.

    A first non-blank character ``[`` or ``{`` means a JSON dump; otherwise the first
    line must be a triple with a tab or comma separator (the extension breaks ties:
    ``.tsv``/``.txt`` tab, ``.csv`` comma).

    Raises:
        PipelineError: The file is missing, unreadable, empty or of an unknown format.
    """
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"input {path} does not exist or is not a file; check the path")
    compression = _compression_of(path)
    stream, raw = open_text_stream(path, compression, decompressor="stdlib")
    pieces: list[bytes] = []
    read = _read_once(stream)
    try:
        # Small reads, so that a stream damaged further on still shows its first lines;
        # the parse then records the damage for the report.
        while sum(map(len, pieces)) < SNIFF_BYTES and (piece := read(4096)):
            pieces.append(piece)
    except _STREAM_ERRORS as exc:
        if not pieces:
            raise PipelineError(f"cannot decompress {path} ({exc}); download it again") from exc
    finally:
        stream.close()
        raw.close()
    text = b"".join(pieces).lstrip()
    if not text:
        raise PipelineError(f"input {path} is empty; download it again or drop it")
    if text[:1] in (b"[", b"{"):
        return InputFormat("dump", compression)
    first_line = text.split(b"\n", 1)[0]
    stem_suffix = Path(path.stem).suffix if compression != "none" else path.suffix
    by_extension = _TRIPLE_SEPARATORS.get(stem_suffix.lower())
    found = [sep for sep in ("\t", ",") if sep.encode() in first_line]
    if len(found) == 1 or (found and by_extension in found):
        separator = found[0] if len(found) == 1 else by_extension
        return InputFormat("triples", compression, separator)
    raise PipelineError(
        f"unknown format for {path} (first line {first_line[:60]!r}); pass Wikidata JSON "
        "dumps or Qid<TAB>Pid<TAB>Qid / Qid,Pid,Qid triple files, plain, .bz2 or .gz"
    )


# --------------------------------------------------------------------------- batch parsing


@dataclass
class BatchResult:
    """What one batch of lines produced; returned from the worker processes.

    Attributes:
        heads, relations, tails: Triple ids as numbers (``Q42`` -> 42), uint32 arrays
            (``array("I")`` from the line loops, numpy from the columnar path).
        labels: English labels of property entities, by property number.
        records: Non-blank lines read (entities for dumps, rows for triple files).
        entities: Dump lines that parsed into an entity.
        properties: Property entities among them.
        malformed: Skipped lines per reason.
        malformed_statements: Statements skipped inside otherwise good entities.
        examples: ``(line number, reason, text)`` of the first malformed lines.
    """

    heads: array | np.ndarray = field(default_factory=lambda: array("I"))
    relations: array | np.ndarray = field(default_factory=lambda: array("I"))
    tails: array | np.ndarray = field(default_factory=lambda: array("I"))
    labels: dict[int, str] = field(default_factory=dict)
    records: int = 0
    entities: int = 0
    properties: int = 0
    malformed: Counter = field(default_factory=Counter)
    malformed_statements: int = 0
    examples: list[tuple[int, str, str]] = field(default_factory=list)

    def bad(self, line_no: int, reason: str, text: bytes | str) -> None:
        """Count one malformed line (or statement) and keep the first few as examples."""
        if reason != "statement":
            self.malformed[reason] += 1
        if len(self.examples) < MAX_EXAMPLES:
            if isinstance(text, bytes):
                text = text[:80].decode("utf-8", "replace")
            self.examples.append((line_no, reason, str(text)[:80]))


def _id_number(text: Any, prefix: str) -> int | None:
    """``"Q42"`` -> 42 for ``prefix="Q"``; None for anything that is not such an id."""
    if (
        type(text) is str
        and 1 < len(text) <= 11  # before int(): a 5000-digit "id" would raise, not parse
        and text[0] == prefix
        and text[1] != "0"
        and text.isascii()
        and text[1:].isdigit()
    ):
        number = int(text[1:])
        return number if number <= MAX_ID else None
    return None


def _id_number_bytes(text: bytes, prefix: bytes) -> int | None:
    """Bytes version of :func:`_id_number` for triple files (``bytes.isdigit`` is ASCII)."""
    if 1 < len(text) <= 11 and text[:1] == prefix and text[1:2] != b"0" and text[1:].isdigit():
        number = int(text[1:])
        return number if number <= MAX_ID else None
    return None


def _english_label(entity: dict) -> str | None:
    """The ``en`` label of an entity, in the current (``{"value": ...}``) or a bare form."""
    labels = entity.get("labels")
    if not isinstance(labels, dict):
        return None
    label = labels.get("en")
    if isinstance(label, dict):
        label = label.get("value")
    return label if isinstance(label, str) else None


def _tail_of(snak: dict) -> int | None:
    """Tail item number of an item-valued value snak, or None for any other target.

    Raises:
        KeyError, TypeError, AttributeError: The snak is malformed.
    """
    if snak.get("snaktype") != "value":  # somevalue / novalue have no target
        return None
    datavalue = snak["datavalue"]
    if datavalue.get("type") != "wikibase-entityid":
        return None
    value = datavalue["value"]
    entity_id = value.get("id")
    entity_type = value.get("entity-type")
    if entity_type is None and isinstance(entity_id, str):
        entity_type = "item" if entity_id.startswith("Q") else "other"
    if entity_type != "item":
        return None
    if entity_id is not None:
        number = _id_number(entity_id, "Q")
    else:  # the older format: only the numeric id
        number = value["numeric-id"]
        if type(number) is not int or not 0 < number <= MAX_ID:
            number = None
    if number is None:
        raise TypeError(f"bad item id {entity_id or value.get('numeric-id')!r}")
    return number


def _add_entity(entity: dict, line_no: int, out: BatchResult) -> None:
    """Add the triples (or the property label) of one parsed entity to ``out``."""
    entity_id = entity.get("id")
    entity_type = entity.get("type")
    if entity_type == "property" or (entity_type is None and str(entity_id).startswith("P")):
        number = _id_number(entity_id, "P")
        if number is None:
            out.bad(line_no, "bad_entity_id", repr(entity_id))
            return
        out.entities += 1
        out.properties += 1
        label = _english_label(entity)
        if label is not None:
            out.labels.setdefault(number, label)
        return
    if entity_type not in ("item", None):  # lexemes, forms, senses: no item triples
        out.entities += 1
        return
    head = _id_number(entity_id, "Q")
    if head is None:
        out.bad(
            line_no, "bad_entity_id" if entity_id is not None else "missing_id", repr(entity_id)
        )
        return
    claims = entity.get("claims")
    if isinstance(claims, dict):
        groups: Iterable = claims.items()
    elif isinstance(claims, list):  # an item without statements serialises as []
        groups = (("", claims),) if claims else ()
    else:
        out.bad(line_no, "missing_claims", f"{entity_id}: claims={type(claims).__name__}")
        return
    out.entities += 1
    heads, relations, tails = out.heads, out.relations, out.tails
    for key, statements in groups:
        if not isinstance(statements, list):
            out.malformed_statements += 1
            out.bad(line_no, "statement", f"{entity_id} {key}: not a list")
            continue
        for statement in statements:
            try:
                if statement.get("rank") == "deprecated":
                    continue
                snak = statement["mainsnak"]
                tail = _tail_of(snak)
                if tail is None:
                    continue
                relation = _id_number(snak.get("property", key), "P")
                if relation is None:
                    raise TypeError(f"bad property {snak.get('property', key)!r}")
            except (KeyError, TypeError, AttributeError) as exc:
                out.malformed_statements += 1
                out.bad(line_no, "statement", f"{entity_id} {key}: {exc!r}")
                continue
            heads.append(head)
            relations.append(relation)
            tails.append(tail)


def parse_dump_batch(first_line: int, blob: bytes) -> BatchResult:
    """Parse a batch of dump lines (one JSON entity each, optionally ending in ``,``).

    Args:
        first_line: 1-based line number of the batch's first line in its file.
        blob: Whole lines of decompressed text.
    """
    out = BatchResult()
    loads = orjson.loads
    for offset, raw_line in enumerate(blob.split(b"\n")):
        line = raw_line.strip()
        if not line or line == b"[" or line == b"]":
            continue
        out.records += 1
        if line[-1:] == b",":
            line = line[:-1]
        try:
            entity = loads(line)
        except orjson.JSONDecodeError:
            out.bad(first_line + offset, "bad_json", line)
            continue
        if not isinstance(entity, dict):
            out.bad(first_line + offset, "not_an_object", line)
            continue
        try:
            _add_entity(entity, first_line + offset, out)
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
            # _add_entity checks the layout it relies on; this net keeps a shape nobody
            # foresaw from ending a multi-hour parse, and the report shows it.
            out.bad(first_line + offset, "unexpected_structure", repr(exc))
    return out


def _triples_columnar(blob: bytes, separator: str) -> list[np.ndarray] | None:
    """Parse clean triple lines with pyarrow's CSV reader, about 6x the line loop's speed.

    Returns the head, relation and tail numbers, or None when any line is blank, has the
    wrong number of fields or a bad id: then the line loop, the reference, redoes the
    batch and counts what was wrong. Only lines the loop would accept identically (ids
    after trimming whitespace) get through here.
    """
    if not blob:
        return None
    try:
        table = pacsv.read_csv(
            pa.BufferReader(blob),
            read_options=pacsv.ReadOptions(column_names=["h", "r", "t"], use_threads=False),
            parse_options=pacsv.ParseOptions(delimiter=separator, quote_char=False),
            convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys("hrt", pa.string())),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    if table.num_rows != blob.count(b"\n") + (not blob.endswith(b"\n")):
        return None  # blank lines were skipped
    columns = []
    for name, prefix in zip("hrt", "QPQ", strict=True):
        ids = pc.ascii_trim(table.column(name), characters=" \t\n\r\x0b\x0c")
        if not pc.all(pc.match_substring_regex(ids, f"^{prefix}[1-9][0-9]{{0,9}}$")).as_py():
            return None
        numbers = pc.cast(pc.utf8_slice_codeunits(ids, 1, 11), pa.uint64()).to_numpy()
        if numbers.size and numbers.max() > MAX_ID:
            return None
        columns.append(numbers.astype(np.uint32))
    return columns


def parse_triples_batch(first_line: int, blob: bytes, separator: str) -> BatchResult:
    """Parse a batch of ``Qid<sep>Pid<sep>Qid`` lines; blank lines are ignored.

    Args:
        first_line: 1-based line number of the batch's first line in its file.
        blob: Whole lines of decompressed text.
        separator: ``"\\t"`` or ``","``.
    """
    out = BatchResult()
    columns = _triples_columnar(blob, separator)
    if columns is not None:
        out.heads, out.relations, out.tails = columns
        out.records = len(columns[0])
        return out
    sep = separator.encode()
    heads, relations, tails = out.heads, out.relations, out.tails
    for offset, raw_line in enumerate(blob.split(b"\n")):
        line = raw_line.strip()
        if not line:
            continue
        out.records += 1
        fields = line.split(sep)
        if len(fields) != 3:
            out.bad(first_line + offset, "wrong_field_count", line)
            continue
        head = _id_number_bytes(fields[0].strip(), b"Q")
        relation = _id_number_bytes(fields[1].strip(), b"P")
        tail = _id_number_bytes(fields[2].strip(), b"Q")
        if head is None or relation is None or tail is None:
            out.bad(first_line + offset, "bad_id", line)
            continue
        heads.append(head)
        relations.append(relation)
        tails.append(tail)
    return out


def _parse_task(task: tuple[str, str | None, int, bytes]) -> BatchResult:
    """Pool entry point: ``(kind, separator, first line, blob)`` -> :class:`BatchResult`."""
    kind, separator, first_line, blob = task
    if kind == "dump":
        return parse_dump_batch(first_line, blob)
    return parse_triples_batch(first_line, blob, separator)


# --------------------------------------------------------------------------- streaming


@dataclass
class FileStats:
    """Per-input counts for the summary and the report."""

    name: str
    path: str
    format: InputFormat
    compressed_bytes: int
    lines: int = 0
    records: int = 0
    entities: int = 0
    properties: int = 0
    triples: int = 0
    distinct_triples: int = 0
    new_triples: int = 0
    malformed: Counter = field(default_factory=Counter)
    malformed_statements: int = 0
    examples: list[tuple[int, str, str]] = field(default_factory=list)
    stream_error: str | None = None
    seconds: float = 0.0

    def add(self, result: BatchResult) -> None:
        self.records += result.records
        self.entities += result.entities
        self.properties += result.properties
        self.triples += len(result.heads)
        self.malformed.update(result.malformed)
        self.malformed_statements += result.malformed_statements
        room = MAX_EXAMPLES - len(self.examples)
        self.examples.extend(result.examples[:room])

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "format": self.format.kind,
            "compression": self.format.compression,
            "separator": self.format.separator,
            "compressed_bytes": self.compressed_bytes,
            "lines": self.lines,
            "records": self.records,
            "entities": self.entities,
            "property_entities": self.properties,
            "triples": self.triples,
            "distinct_triples": self.distinct_triples,
            "new_triples": self.new_triples,
            "malformed_lines": sum(self.malformed.values()),
            "malformed_reasons": dict(sorted(self.malformed.items())),
            "malformed_statements": self.malformed_statements,
            "malformed_examples": [
                {"line": line, "reason": reason, "text": text}
                for line, reason, text in self.examples
            ],
            "stream_error": self.stream_error,
            "seconds": round(self.seconds, 3),
        }


def _pieces(stream: BinaryIO, size: int, stats: FileStats) -> Iterator[bytes]:
    """Decompressed pieces of at most ``size`` bytes until the end or damage of the stream."""
    read = _read_once(stream)
    while True:
        try:
            piece = read(size)
        except _STREAM_ERRORS as exc:
            stats.stream_error = f"{type(exc).__name__}: {exc}"
            return
        if not piece:
            return
        yield piece


def line_batches(
    stream: BinaryIO,
    stats: FileStats,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[int, bytes]]:
    """Cut a decompressed stream into ``(first line number, whole lines)`` batches.

    Sets ``stats.lines``. A damaged stream ends the iteration with the message in
    ``stats.stream_error``; the unterminated line before the damage is dropped, since a
    cut ``Q345`` would read as ``Q34``. A line longer than ``max_line_bytes`` is dropped
    and counted rather than buffered.
    """
    line_no = 1  # number of the first line of the next batch
    pieces: list[bytes] = []
    size = 0
    newline = False  # whether ``pieces`` holds a line end
    skipping = False  # inside an over-long line: discard up to its end
    for piece in _pieces(stream, batch_bytes, stats):
        if skipping:
            cut = piece.find(b"\n")
            if cut < 0:
                continue
            piece, line_no, skipping = piece[cut + 1 :], line_no + 1, False
        pieces.append(piece)
        size += len(piece)
        newline = newline or b"\n" in piece
        if newline and size >= batch_bytes:
            data = b"".join(pieces)
            cut = data.rfind(b"\n") + 1
            yield line_no, data[:cut]
            line_no += data.count(b"\n", 0, cut)
            rest = data[cut:]
            pieces, size, newline = ([rest] if rest else []), len(rest), False
        elif not newline and size > max_line_bytes:
            stats.malformed["line_too_long"] += 1
            if len(stats.examples) < MAX_EXAMPLES:
                stats.examples.append((line_no, "line_too_long", f"over {max_line_bytes} bytes"))
            pieces, size, skipping = [], 0, True
    data = b"".join(pieces)
    if stats.stream_error is not None:
        data = data[: data.rfind(b"\n") + 1]
    if data:
        yield line_no, data
        line_no += data.count(b"\n") + (not data.endswith(b"\n"))
    stats.lines = line_no - 1 + skipping
    if stats.stream_error is not None:
        stats.stream_error += f" (after line {stats.lines})"


def _ordered_results(
    tasks: Iterable[Any], function: Callable[[Any], BatchResult], pool: Any, window: int
) -> Iterator[BatchResult]:
    """Map ``function`` over ``tasks`` on ``pool`` in order, with at most ``window`` in flight.

    ``Pool.imap`` would drain the task iterator as fast as it can and so pull the whole
    dump into memory; this keeps the read-ahead bounded.
    """
    if pool is None:
        yield from map(function, tasks)
        return
    pending: deque = deque()
    for task in tasks:
        pending.append(pool.apply_async(function, (task,)))
        if len(pending) >= window:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


@dataclass
class ParseResult:
    """All inputs parsed: raw triples in input order plus per-file statistics.

    Attributes:
        heads, relations, tails: uint32 id numbers of every triple read (with repeats).
        file_index: uint16 index into ``stats`` of the file each triple came from.
        labels: Property labels from property entities in the dumps.
        stats: One entry per input, in input order.
    """

    heads: np.ndarray
    relations: np.ndarray
    tails: np.ndarray
    file_index: np.ndarray
    labels: dict[int, str]
    stats: list[FileStats]


def parse_inputs(
    paths: list[Path],
    workers: int = 1,
    decompressor: str = "auto",
    threads: int = 1,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    progress: bool = True,
) -> ParseResult:
    """Parse every input; formats are checked for all of them before any long work starts.

    Args:
        paths: Dumps and triple files, in the order that decides ``source``.
        workers: Parse processes; 1 parses in this process.
        decompressor: See :func:`open_text_stream`.
        threads: Decompression threads per stream.
        batch_bytes: Decompressed bytes per parse task.
        progress: Show a tqdm bar (compressed MB/s and records/s).

    Raises:
        PipelineError: An input is missing, unreadable, of unknown format, or listed twice.
    """
    if len(paths) > np.iinfo(np.uint16).max:
        raise PipelineError(f"{len(paths)} inputs; at most 65535 fit the file index, merge some")
    formats = [detect_format(path) for path in paths]
    names = [path.name for path in paths]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise PipelineError(
            f"inputs share the file name(s) {repeated}; the source column needs unique "
            "names, so list each file once and rename clashing ones"
        )
    all_stats = [
        FileStats(path.name, str(path), fmt, path.stat().st_size)
        for path, fmt in zip(paths, formats, strict=True)
    ]
    chunks: dict[str, list[np.ndarray]] = {"h": [], "r": [], "t": [], "f": []}
    labels: dict[int, str] = {}
    # A pool made before any decompressor thread exists; forkserver avoids forking a
    # process that already runs pyarrow/numpy threads.
    pool, task = None, _parse_task
    if workers > 1:
        # Refer to the worker function through the package module, not ``__main__``, so
        # that ``python -m`` runs pickle it by an importable name.
        module = importlib.import_module(_WORKER_MODULE)
        task = module._parse_task
        context = multiprocessing.get_context("forkserver")
        pool = context.Pool(workers)
    bar = tqdm(
        total=sum(s.compressed_bytes for s in all_stats),
        unit="B",
        unit_scale=True,
        unit_divisor=1000,
        desc="parse",
        disable=not progress,
        mininterval=1.0,
        dynamic_ncols=True,
    )
    try:
        for index, (path, fmt, stats) in enumerate(zip(paths, formats, all_stats, strict=True)):
            file_start, done_before = time.perf_counter(), bar.n
            unit = "entities" if fmt.kind == "dump" else "rows"
            stream, raw = open_text_stream(path, fmt.compression, decompressor, threads)
            try:
                tasks = (
                    (fmt.kind, fmt.separator, first, blob)
                    for first, blob in line_batches(stream, stats, batch_bytes)
                )
                for result in _ordered_results(tasks, task, pool, 2 * max(workers, 1)):
                    stats.add(result)
                    for key, values in (
                        ("h", result.heads),
                        ("r", result.relations),
                        ("t", result.tails),
                    ):
                        chunks[key].append(np.frombuffer(values, dtype=np.uint32))
                    chunks["f"].append(np.full(len(result.heads), index, dtype=np.uint16))
                    for number, label in result.labels.items():
                        labels.setdefault(number, label)
                    bar.update(done_before + raw.furthest - bar.n)
                    rate = stats.records / max(time.perf_counter() - file_start, 1e-9)
                    bar.set_postfix_str(f"{rate:,.0f} {unit}/s", refresh=False)
            finally:
                stream.close()
                raw.close()
            bar.update(done_before + stats.compressed_bytes - bar.n)
            stats.seconds = time.perf_counter() - file_start
    except BaseException:
        if pool is not None:
            pool.terminate()  # on Ctrl-C or a bug, don't wait for queued batches
        raise
    finally:
        bar.close()
        if pool is not None:
            pool.close()
            pool.join()

    def joined(key: str, dtype: type) -> np.ndarray:
        return np.concatenate(chunks.pop(key)) if chunks[key] else np.empty(0, dtype)

    return ParseResult(
        heads=joined("h", np.uint32),
        relations=joined("r", np.uint32),
        tails=joined("t", np.uint32),
        file_index=joined("f", np.uint16),
        labels=labels,
        stats=all_stats,
    )


# --------------------------------------------------------------------------- deduplication


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


# --------------------------------------------------------------------------- relations


def load_pid2name(path: Path) -> dict[int, str]:
    """FewRel ``pid2name.json`` (``{"P17": [name, description], ...}``) -> {17: name}.

    Raises:
        PipelineError: The file is missing or not in that layout.
    """
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise PipelineError(
            f"cannot read --pid2name {path} ({exc.strerror}); check the path"
        ) from exc
    except orjson.JSONDecodeError as exc:
        raise PipelineError(
            f"--pid2name {path} is not valid JSON ({exc}); download it again"
        ) from exc
    if not isinstance(data, dict):
        raise PipelineError(f"--pid2name {path} is not a JSON object of Pid -> [name, ...]")
    names = {}
    for key, value in data.items():
        number = _id_number(key, "P")
        name = value[0] if isinstance(value, list) and value else value
        if number is None:  # FewRel's file has a placeholder "P0": ["None", "None"]
            continue
        if not isinstance(name, str):
            raise PipelineError(
                f"--pid2name {path}: entry {key!r}: {value!r} is not Pid -> [name, description]; "
                "use FewRel's pid2name.json"
            )
        names[number] = name
    return names


def relations_table(
    parsed: ParseResult, keep: np.ndarray, pid2name: dict[int, str]
) -> tuple[pa.Table, dict[str, int]]:
    """RELATIONS_SCHEMA table of every relation with triples, by property number.

    Returns:
        The table and how many labels came from the dumps, from pid2name, or are missing.
    """
    counts = np.bincount(parsed.relations[keep]) if len(keep) else np.zeros(0, np.int64)
    numbers = np.flatnonzero(counts)
    labels, origin = [], Counter()
    for number in numbers.tolist():
        if number in parsed.labels:
            labels.append(parsed.labels[number])
            origin["dump"] += 1
        elif number in pid2name:
            labels.append(pid2name[number])
            origin["pid2name"] += 1
        else:
            labels.append(None)
            origin["missing"] += 1
    table = pa.table(
        {
            "relation": [f"P{n}" for n in numbers.tolist()],
            "label": pa.array(labels, pa.string()),
            "triple_count": pa.array(counts[numbers], pa.int64()),
        },
        schema=RELATIONS_SCHEMA,
    )
    return table, {key: origin[key] for key in ("dump", "pid2name", "missing")}


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
    if not isinstance(data, dict) or not all(_id_number(k, "P") for k in data):
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


# --------------------------------------------------------------------------- CLI


def _summary_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for item in report["inputs"]:
        malformed = item["malformed_lines"]
        extra = (
            f", {item['malformed_statements']} bad statements"
            if item["malformed_statements"]
            else ""
        )
        what = (
            f"{item['entities']:,} entities"
            if item["format"] == "dump"
            else (f"{item['records']:,} rows")
        )
        lines.append(
            f"{item['name']}: {item['distinct_triples']:,} triples ({item['new_triples']:,} "
            f"new) from {what}; {malformed:,} malformed lines{extra}"
        )
        if item["stream_error"]:
            lines.append(
                f"  WARNING: damaged stream, kept what came before: {item['stream_error']}"
            )
    lines.append(
        f"total: {report['triples']:,} distinct triples, {report['relations']:,} relations "
        f"(labels: {report['labels']['dump']} from dumps, {report['labels']['pid2name']} from "
        f"pid2name, {report['labels']['missing']} missing)"
    )
    for name, cov in report["coverage"].items():
        missing = ", ".join(cov["missing"]) or "none"
        lines.append(
            f"coverage {name}: {cov['covered']} of {cov['relations']} relations; missing: {missing}"
        )
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m stages.parse_wikidata", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "inputs",
        nargs="*",
        type=Path,
        metavar="INPUT",
        help="Wikidata JSON dumps (.json, .bz2, .gz) and triple files (.tsv, .txt, .csv)",
    )
    parser.add_argument("--out", required=True, type=Path, help="triples Parquet (TRIPLES_SCHEMA)")
    parser.add_argument("--relations-out", type=Path, help="relations Parquet (RELATIONS_SCHEMA)")
    parser.add_argument("--pid2name", type=Path, help="FewRel pid2name.json, fallback labels")
    parser.add_argument("--report", type=Path, help="JSON report: per-file counts, coverage")
    parser.add_argument(
        "--coverage",
        nargs="+",
        action="extend",
        type=Path,
        default=[],
        metavar="FEWREL_JSON",
        help="FewRel-format files whose relation coverage to report; takes "
        "every path after it, so give the inputs before it (or end it with --)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=usable_cores(),
        help="parse processes; 1 parses in the main process (default: all cores)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=usable_cores(),
        help="decompression threads per bzip2 stream (default: all cores)",
    )
    parser.add_argument(
        "--decompressor",
        choices=_DECOMPRESSORS,
        default="auto",
        help="auto: indexed_bzip2 for .bz2, stdlib gzip for .gz; parallel: "
        "also rapidgzip for .gz (does not detect truncation); stdlib: bz2/gzip",
    )
    parser.add_argument(
        "--batch-mb",
        type=float,
        default=DEFAULT_BATCH_BYTES / 2**20,
        help="decompressed MiB per parse task",
    )
    parser.add_argument(
        "--allow-damaged",
        action="store_true",
        help="exit 0 even if a compressed input is truncated or corrupt",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the inputs, write triples, relations and report; return the report."""
    args = build_parser().parse_args(argv)
    if not args.inputs:
        raise PipelineError(
            "no INPUT files; --coverage takes every path after it, so list the inputs "
            "before --coverage or end its list with --"
        )
    if args.workers < 1 or args.threads < 1 or args.batch_mb <= 0:
        raise PipelineError("--workers and --threads must be >= 1 and --batch-mb > 0")
    pid2name = load_pid2name(args.pid2name) if args.pid2name else {}
    # Check the coverage files before the long parse, not after it.
    for path in args.coverage:
        relation_coverage(path, set())

    parsed = parse_inputs(
        args.inputs,
        workers=args.workers,
        decompressor=args.decompressor,
        threads=args.threads,
        batch_bytes=max(1, int(args.batch_mb * 2**20)),
        progress=not args.no_progress,
    )
    unusable = [
        s.name for s in parsed.stats if s.records and s.records == sum(s.malformed.values())
    ]
    if unusable:
        raise PipelineError(
            f"no usable line in {unusable} (every line malformed); pass Wikidata JSON dumps "
            "or Qid/Pid/Qid triple files as INPUT (FewRel files go after --coverage)"
        )
    keep = first_occurrences(parsed)
    write_triples(parsed, keep, args.out)
    relations, label_origin = relations_table(parsed, keep, pid2name)
    if args.relations_out:
        write_parquet(relations, args.relations_out, RELATIONS_SCHEMA)
    present = set(relations.column("relation").to_pylist())
    report = {
        "inputs": [stats.to_json() for stats in parsed.stats],
        "triples": int(len(keep)),
        "relations": relations.num_rows,
        "labels": label_origin,
        "coverage": {path.name: relation_coverage(path, present) for path in args.coverage},
        "settings": {
            "workers": args.workers,
            "threads": args.threads,
            "decompressor": args.decompressor,
        },
    }
    if args.report:
        write_json(report, args.report)
    print("\n".join(_summary_lines(report)))
    damaged = [s.name for s in parsed.stats if s.stream_error]
    if damaged and not args.allow_damaged:
        raise PipelineError(
            f"damaged compressed input(s) {damaged}: outputs hold only what was read before "
            "the damage; download them again, or pass --allow-damaged to accept this"
        )
    return report


if __name__ == "__main__":
    run_cli(main)
