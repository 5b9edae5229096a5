"""Independent work units: byte ranges of an input, each parsed on its own by any worker.

An input of ``size`` bytes is cut at fixed compressed offsets (``range_bytes`` apart, so the
cut does not depend on how many workers there are). Range ``k`` covers ``[start, stop)``:

* bz2: the blocks whose first bit lies in the range (:mod:`pipeline.wikidata.bz2blocks`);
* plain text: the bytes of the range;
* gzip: the whole file in one range, since a deflate stream cannot be entered in the middle
  (use the ``.bz2`` dump to scale out).

Lines cross range ends, so a range *owns* the lines that start after its first decompressed
byte and up to and including the first byte after it: it skips through the first newline
of its text (unless it is the file's first range), and after its own text reads on into the
next range's text up to the first newline. Every line is then owned by exactly one range,
whatever the cut, and the ranges' lines in range order are the file's lines in file order.

A damaged block or stream ends its range: the range keeps its whole lines from before the
damage (as the standard library's reader keeps what it decoded) and reports the error; the
other ranges are not affected.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.wikidata.bz2blocks import DamagedBlock, iter_blocks
from pipeline.wikidata.formats import STREAM_ERRORS, InputFormat, open_stream
from pipeline.wikidata.parse import MAX_EXAMPLES, LineCounts, parse_batch

#: Compressed bytes per work unit (about 15 minutes of one core on a Wikidata bz2 dump).
DEFAULT_RANGE_BYTES = 64 << 20
#: Bytes of decompressed text parsed at once inside a range (cut at a line end).
DEFAULT_BATCH_BYTES = 4 << 20
#: A line longer than this is dropped (and counted) instead of being held in memory.
MAX_LINE_BYTES = 512 << 20
#: Bytes read at a time from plain and gzip inputs.
_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class WorkRange:
    """One unit of work: a byte range of one input.

    Attributes:
        path: The input (workers open it by this path, so a remote cluster needs it on a
            shared file system at the same path).
        file_index: Position of the input on the command line.
        index: Position of the range in its file.
        format: How to read the input.
        start, stop: Compressed byte offsets ``[start, stop)``.
    """

    path: str
    file_index: int
    index: int
    format: InputFormat
    start: int
    stop: int

    @property
    def name(self) -> str:
        return f"{self.file_index:05d}-{self.index:07d}"


def plan_ranges(
    path: Path, file_index: int, fmt: InputFormat, range_bytes: int = DEFAULT_RANGE_BYTES
) -> list[WorkRange]:
    """Cut one input into ranges of ``range_bytes`` compressed bytes (one range for gzip)."""
    size = path.stat().st_size
    if fmt.compression == "gzip" or size <= range_bytes:
        cuts = [0, size]
    else:
        cuts = [*range(0, size, range_bytes), size]
    return [
        WorkRange(str(path), file_index, k, fmt, cuts[k], cuts[k + 1]) for k in range(len(cuts) - 1)
    ]


def _pieces(work: WorkRange) -> Iterator[tuple[bool, bytes]]:
    """``(owned, decompressed piece)``: the range's own text, then what follows it.

    Raises:
        DamagedBlock: The input is damaged at this point.
    """
    compression = work.format.compression
    if compression == "bz2":
        with open(work.path, "rb") as fh:
            for bit, data in iter_blocks(fh, work.start):
                yield bit < 8 * work.stop, data
        return
    if compression == "gzip":  # one range: the whole file
        with open_stream(Path(work.path), "gzip") as stream:
            while True:
                try:
                    piece = stream.read1(_READ_BYTES)
                except STREAM_ERRORS as exc:
                    raise DamagedBlock(f"{type(exc).__name__}: {exc}") from exc
                if not piece:
                    return
                yield True, piece
    with open(work.path, "rb") as fh:
        fh.seek(work.start)
        offset = work.start
        while piece := fh.read(_READ_BYTES):
            own = piece[: max(0, work.stop - offset)]
            if own:
                yield True, own
            if len(own) < len(piece):
                yield False, piece[len(own) :]
            offset += len(piece)


@dataclass
class RangeResult(LineCounts):
    """What one range produced; small enough to travel back from a worker.

    Attributes:
        heads, relations, tails: uint32 triple ids in line order.
        labels, descriptions, aliases: English texts of property entities, by property
            number (the first seen of each).
        lines: Lines the range owns (numbers in ``examples`` count from its first, 1).
        records, entities, properties, malformed, malformed_statements, malformed_texts,
            examples: As in :class:`pipeline.wikidata.parse.LineCounts`, summed over the
            range.
        stream_error: The damage that ended the range early, if any.
        cut_short: The text ended at damage (here or in the next range's first block).
        seconds: Wall time the range took.
        cpu_seconds: CPU time of the thread that parsed it (robust to other load).
    """

    heads: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint32))
    relations: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint32))
    tails: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint32))
    labels: dict[int, str] = field(default_factory=dict)
    descriptions: dict[int, str] = field(default_factory=dict)
    aliases: dict[int, list[str]] = field(default_factory=dict)
    lines: int = 0
    stream_error: str | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    cut_short: bool = False

    def counts(self) -> dict[str, Any]:
        """Everything but the triples, as JSON-ready values."""
        return {
            "labels": {str(k): v for k, v in self.labels.items()},
            "descriptions": {str(k): v for k, v in self.descriptions.items()},
            "aliases": {str(k): v for k, v in self.aliases.items()},
            "lines": self.lines,
            "records": self.records,
            "entities": self.entities,
            "properties": self.properties,
            "malformed": dict(self.malformed),
            "malformed_statements": self.malformed_statements,
            "malformed_texts": dict(self.malformed_texts),
            "examples": [list(example) for example in self.examples],
            "stream_error": self.stream_error,
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
        }

    @classmethod
    def from_counts(cls, counts: dict[str, Any], heads, relations, tails) -> RangeResult:
        """Inverse of :meth:`counts`, with the triple columns."""
        return cls(
            heads=heads,
            relations=relations,
            tails=tails,
            labels={int(k): v for k, v in counts["labels"].items()},
            descriptions={int(k): v for k, v in counts["descriptions"].items()},
            aliases={int(k): v for k, v in counts["aliases"].items()},
            lines=counts["lines"],
            records=counts["records"],
            entities=counts["entities"],
            properties=counts["properties"],
            malformed=Counter(counts["malformed"]),
            malformed_statements=counts["malformed_statements"],
            malformed_texts=Counter(counts["malformed_texts"]),
            examples=[tuple(example) for example in counts["examples"]],
            stream_error=counts["stream_error"],
            seconds=counts["seconds"],
            cpu_seconds=counts["cpu_seconds"],
        )

    def note(self, line_no: int, reason: str, text: str) -> None:
        """Count a malformed line found while cutting lines."""
        self.malformed[reason] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append((line_no, reason, text))


def owned_text(work: WorkRange, result: RangeResult) -> Iterator[bytes]:
    """The decompressed text of the lines ``work`` owns (see the module docstring).

    On damage the iteration ends with the error in ``result.stream_error``.
    """
    skipping = work.index > 0  # the first line belongs to the range before
    try:
        for own, piece in _pieces(work):
            if skipping and not own:
                return  # no line starts in this range
            if skipping:
                cut = piece.find(b"\n")
                if cut < 0:
                    continue
                piece, skipping = piece[cut + 1 :], False
            if own:
                yield piece
                continue
            cut = piece.find(b"\n")
            if cut >= 0:
                yield piece[: cut + 1]
                return
            yield piece
    except DamagedBlock as exc:
        result.cut_short = True
        # Damage in the next range's blocks is that range's to report; here it only
        # costs the unterminated last line.
        if exc.bit is None or exc.bit < 8 * work.stop:
            result.stream_error = str(exc)


def line_batches(
    pieces: Iterator[bytes],
    result: RangeResult,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[int, bytes]]:
    """Cut text pieces into ``(first line number, whole lines)`` batches.

    Sets ``result.lines``. After damage (``result.cut_short`` set by the pieces) the
    unterminated line before it is dropped, since a cut ``Q345`` would read as ``Q34``. A
    line longer than ``max_line_bytes`` is dropped and counted rather than buffered.
    """
    line_no = 1  # number of the first line of the next batch
    buffered: list[bytes] = []
    size = 0
    newline = False  # whether ``buffered`` holds a line end
    skipping = False  # inside an over-long line: discard up to its end
    for piece in pieces:
        if skipping:
            cut = piece.find(b"\n")
            if cut < 0:
                continue
            piece, line_no, skipping = piece[cut + 1 :], line_no + 1, False
        buffered.append(piece)
        size += len(piece)
        newline = newline or b"\n" in piece
        if newline and size >= batch_bytes:
            data = b"".join(buffered)
            cut = data.rfind(b"\n") + 1
            yield line_no, data[:cut]
            line_no += data.count(b"\n", 0, cut)
            rest = data[cut:]
            buffered, size, newline = ([rest] if rest else []), len(rest), False
        elif not newline and size > max_line_bytes:
            result.note(line_no, "line_too_long", f"over {max_line_bytes} bytes")
            buffered, size, skipping = [], 0, True
    data = b"".join(buffered)
    if result.cut_short:
        data = data[: data.rfind(b"\n") + 1]
    if data:
        yield line_no, data
        line_no += data.count(b"\n") + (not data.endswith(b"\n"))
    result.lines = line_no - 1 + skipping


def parse_range(
    work: WorkRange,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> RangeResult:
    """Read and parse one range; the task each worker runs.

    Never raises for bad data: malformed lines are counted and damage is reported in
    ``stream_error``, so one bad range cannot stop the others.
    """
    started, cpu_started = time.perf_counter(), time.thread_time()
    result = RangeResult()
    heads, relations, tails = [], [], []
    text = owned_text(work, result)
    for first, blob in line_batches(text, result, batch_bytes, max_line_bytes):
        batch = parse_batch(work.format.kind, work.format.separator, first, blob)
        heads.append(np.frombuffer(batch.heads, dtype=np.uint32))
        relations.append(np.frombuffer(batch.relations, dtype=np.uint32))
        tails.append(np.frombuffer(batch.tails, dtype=np.uint32))
        for mine, theirs in ((result.labels, batch.labels),
                             (result.descriptions, batch.descriptions),
                             (result.aliases, batch.aliases)):
            for number, text in theirs.items():
                mine.setdefault(number, text)
        result.add_counts(batch)
    if heads:
        result.heads = np.concatenate(heads)
        result.relations = np.concatenate(relations)
        result.tails = np.concatenate(tails)
    result.seconds = time.perf_counter() - started
    result.cpu_seconds = time.thread_time() - cpu_started
    return result
