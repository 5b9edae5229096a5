"""Finished ranges on disk, and their merge, in range order, into per-file counts and triples.

Each finished range is written as one Parquet file (its triples, with its counts in the
schema metadata) into a work folder next to the output, atomically; a restart after a
kill skips the ranges found there. The folder holds a manifest of the inputs (path, size,
modification time, format) and of the range size: a changed input or setting starts over
instead of mixing old and new ranges. The stage removes the folder once its outputs are
written.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io import atomic_path, write_json
from pipeline.wikidata.formats import InputFormat
from pipeline.wikidata.parse import TEXT_FIELDS, LineCounts
from pipeline.wikidata.ranges import RangeResult, WorkRange

_PART_SCHEMA = pa.schema([("h", pa.uint32()), ("r", pa.uint32()), ("t", pa.uint32())])
_COUNTS_KEY = b"regrab.range"
_MANIFEST = "manifest.json"


def work_dir_for(out: Path) -> Path:
    """The work folder of an output file: ``.<name>.parts`` beside it."""
    return out.parent / f".{out.name}.parts"


class PartStore:
    """Finished ranges of one run, one Parquet file each, in ``folder``."""

    def __init__(self, folder: Path, manifest: dict[str, Any]):
        self.folder = folder
        old = folder / _MANIFEST
        if folder.exists() and (
            not old.is_file()
            or orjson.loads(old.read_bytes()) != orjson.loads(orjson.dumps(manifest))
        ):
            shutil.rmtree(folder)  # other inputs or settings: nothing to resume
        folder.mkdir(parents=True, exist_ok=True)
        write_json(manifest, old)

    def _path(self, work: WorkRange) -> Path:
        return self.folder / f"{work.name}.parquet"

    def done(self, work: WorkRange) -> bool:
        return self._path(work).is_file()

    def save(self, work: WorkRange, result: RangeResult) -> None:
        """Write one finished range, atomically."""
        table = pa.table(
            [result.heads, result.relations, result.tails], schema=_PART_SCHEMA
        ).replace_schema_metadata({_COUNTS_KEY: orjson.dumps(result.counts())})
        with atomic_path(self._path(work)) as tmp:
            pq.write_table(table, tmp)

    def load(self, work: WorkRange) -> RangeResult:
        table = pq.read_table(self._path(work))
        counts = orjson.loads(table.schema.metadata[_COUNTS_KEY])
        columns = [table.column(name).to_numpy() for name in "hrt"]
        return RangeResult.from_counts(counts, *columns)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def manifest(paths: list[Path], formats: list[InputFormat], range_bytes: int) -> dict:
    """What a work folder's ranges were made from."""
    inputs = []
    for path, fmt in zip(paths, formats, strict=True):
        stat = path.stat()
        inputs.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns, *vars(fmt).values()])
    # Version 2: ranges also carry descriptions and aliases; older folders start over.
    return {"version": 2, "range_bytes": range_bytes, "inputs": inputs}


@dataclass(kw_only=True)
class FileStats(LineCounts):
    """Per-input counts for the summary and the report."""

    name: str
    path: str
    format: InputFormat
    compressed_bytes: int
    ranges: int = 0
    damaged_ranges: int = 0
    lines: int = 0
    triples: int = 0
    distinct_triples: int = 0
    new_triples: int = 0
    stream_error: str | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0

    def add(self, work: WorkRange, result: RangeResult) -> None:
        """Add the next range of this file (ranges must come in order)."""
        self.add_counts(result, first_line=self.lines)  # lines before this range
        self.ranges += 1
        self.lines += result.lines
        self.triples += len(result.heads)
        self.seconds += result.seconds
        self.cpu_seconds += result.cpu_seconds
        if result.stream_error is not None:
            self.damaged_ranges += 1
            if self.stream_error is None:
                self.stream_error = (
                    f"{result.stream_error} (range {work.index}, after line {self.lines})"
                )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "format": self.format.kind,
            "compression": self.format.compression,
            "separator": self.format.separator,
            "compressed_bytes": self.compressed_bytes,
            "ranges": self.ranges,
            "damaged_ranges": self.damaged_ranges,
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
            "malformed_texts": {name: self.malformed_texts[name] for name in TEXT_FIELDS},
            "malformed_examples": [
                {"line": line, "reason": reason, "text": text}
                for line, reason, text in self.examples
            ],
            "stream_error": self.stream_error,
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
        }


@dataclass
class ParseResult:
    """All inputs parsed: raw triples in input order plus per-file statistics.

    Attributes:
        heads, relations, tails: uint32 id numbers of every triple read (with repeats).
        file_index: uint16 index into ``stats`` of the file each triple came from.
        labels, descriptions, aliases: English texts of property entities in the dumps, by
            property number (the first seen of each, in input order).
        stats: One entry per input, in input order.
        engine: What ran the ranges (``"in-process"``, ``"local Dask cluster, 2 workers"``,
            ``"Dask scheduler tcp://..."``).
    """

    heads: np.ndarray
    relations: np.ndarray
    tails: np.ndarray
    file_index: np.ndarray
    labels: dict[int, str]
    descriptions: dict[int, str]
    aliases: dict[int, list[str]]
    stats: list[FileStats]
    engine: str = "in-process"


def merge(store: PartStore, ranges: list[WorkRange], stats: list[FileStats]) -> ParseResult:
    """Read the finished ranges back in (file, range) order: the order a single reader of
    the inputs would have seen, so deduplication keeps the same first occurrences."""
    chunks: dict[str, list[np.ndarray]] = {"h": [], "r": [], "t": [], "f": []}
    texts: tuple[dict, dict, dict] = ({}, {}, {})  # labels, descriptions, aliases
    for work in ranges:
        result = store.load(work)
        stats[work.file_index].add(work, result)
        chunks["h"].append(result.heads)
        chunks["r"].append(result.relations)
        chunks["t"].append(result.tails)
        chunks["f"].append(np.full(len(result.heads), work.file_index, dtype=np.uint16))
        for mine, theirs in zip(texts, (result.labels, result.descriptions, result.aliases),
                                strict=True):
            for number, text in theirs.items():
                mine.setdefault(number, text)

    def joined(key: str, dtype: type) -> np.ndarray:
        parts = chunks.pop(key)
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)

    return ParseResult(
        heads=joined("h", np.uint32),
        relations=joined("r", np.uint32),
        tails=joined("t", np.uint32),
        file_index=joined("f", np.uint16),
        labels=texts[0],
        descriptions=texts[1],
        aliases=texts[2],
        stats=stats,
    )
