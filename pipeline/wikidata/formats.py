"""What an input file is: compression from its magic bytes, dump or triples from its first line.

Inputs, freely mixed:

* Wikidata JSON dumps, either the official layout (``[``, one entity per line ending in
  ``,``, ``]``) or one entity per line; plain, bzip2 or gzip.
* Triple files ``Qid Pid Qid`` separated by a tab (Wikidata5m, CoDEx) or a comma (WD50K),
  the separator sniffed from the first line.
"""

from __future__ import annotations

import bz2
import gzip
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pipeline.errors import PipelineError

#: Decompressed bytes read to sniff an input's format.
SNIFF_BYTES = 64 << 10
#: Exceptions the decompressors raise on a truncated or corrupt stream.
STREAM_ERRORS = (OSError, EOFError, ValueError)

_BZ2_MAGIC = b"BZh"
_GZIP_MAGIC = b"\x1f\x8b"
_TRIPLE_SEPARATORS = {".tsv": "\t", ".txt": "\t", ".csv": ","}


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, as set by taskset or cpusets)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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


def compression_of(path: Path) -> str:
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


def open_stream(path: Path, compression: str) -> BinaryIO:
    """``path`` as a stream of decompressed bytes (the standard library's decoders)."""
    if compression == "bz2":
        return bz2.open(path, "rb")
    if compression == "gzip":
        return gzip.open(path, "rb")
    return path.open("rb")


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
    compression = compression_of(path)
    pieces: list[bytes] = []
    with open_stream(path, compression) as stream:
        try:
            # Small reads (read1: a buffered read that meets damage drops what it had
            # decoded), so that a stream damaged further on still shows its first lines;
            # the parse then records the damage for the report.
            read = getattr(stream, "read1", None) or stream.read
            while sum(map(len, pieces)) < SNIFF_BYTES and (piece := read(4096)):
                pieces.append(piece)
        except STREAM_ERRORS as exc:
            if not pieces:
                raise PipelineError(f"cannot decompress {path} ({exc}); download it again") from exc
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
