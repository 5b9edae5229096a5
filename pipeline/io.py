"""Atomic writes and schema-checked Parquet/JSON/YAML I/O.

Every artifact between stages goes through here: a write lands in a temporary
file in the destination folder and is renamed into place, so a crash never
leaves half a file behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipeline.errors import PipelineError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it over ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600 files; artifacts should get the usual umask-based mode.
    umask = os.umask(0)
    os.umask(umask)
    tmp_path.chmod(0o666 & ~umask)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def file_digest(path: str | os.PathLike[str]) -> str | None:
    """sha256 of a file (None when it does not exist), to tell changed inputs apart."""
    path = Path(path)
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_parquet(table: pa.Table, path: str | os.PathLike[str], schema: pa.Schema) -> None:
    """Cast ``table`` to ``schema`` (raising on mismatch) and write it atomically."""
    if table.schema != schema:
        table = table.select(schema.names).cast(schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet(path: str | os.PathLike[str], schema: pa.Schema | None = None) -> pa.Table:
    """Read a Parquet file; with ``schema``, check the columns and types match."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"{path} does not exist; run the stage that produces it (dvc repro)")
    table = pq.read_table(path)
    if schema is not None:
        missing = [f.name for f in schema if f.name not in table.schema.names]
        if missing:
            raise PipelineError(
                f"{path} lacks columns {missing}; it was written by another version, "
                "rebuild it with dvc repro"
            )
        table = table.select(schema.names)
        if not table.schema.equals(schema):
            try:
                table = table.cast(schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise PipelineError(
                    f"{path} has the wrong column types ({exc}); rebuild it"
                ) from exc
    return table


def write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_yaml(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` as YAML, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(yaml.safe_dump(obj, sort_keys=False))
