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
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from pipeline.errors import PipelineError
from pipeline.schemas import FEWSHOT_SCHEMA


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


@contextlib.contextmanager
def atomic_paths(*paths: str | os.PathLike[str]) -> Iterator[list[Path]]:
    """:func:`atomic_path` for files that belong together (metrics, their tables, plots).

    Yields one temporary path per file; all are renamed into place only after every one
    was written, so a failure leaves all the old files (or none), never new beside old.
    """
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(atomic_path(path)) for path in paths]
        # A rename onto a folder fails; fail before the first rename, not after it.
        for path in paths:
            if Path(path).is_dir():
                raise PipelineError(f"{path} is a folder, so it cannot be written; remove it "
                                    "or give another output path (nothing was written)")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary folder next to ``path``; it replaces ``path`` on success.

    Readers see the old folder, then (after a moment with none) the new one, never a
    mixture; on any exception the temporary folder is removed and ``path`` is untouched.
    Temporary folders that a SIGKILL left behind for ``path`` are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent, [path.name])
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)
    try:
        yield tmp
        if path.exists():
            # os.replace cannot replace a non-empty folder: move the old one aside first.
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp",
                                        dir=path.parent))
            os.replace(path, old / path.name)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old / path.name, path)
                raise
            finally:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_entries(path: str | os.PathLike[str], names: tuple[str, ...]) -> Iterator[Path]:
    """:func:`atomic_dir` for a folder that also holds files of others: only ``names`` change.

    Yields an empty temporary folder next to ``path``. On success each of ``names`` in
    ``path`` is replaced by the one written there (or removed when none was written); every
    other entry of ``path`` stays as it is. A failure while swapping puts the old entries
    back; on any exception the temporary folder is removed.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent, [path.name])
    work = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    new, old = work / "new", work / "old"
    new.mkdir(mode=0o777)  # the umask applies, as to any folder the user makes
    old.mkdir()
    try:
        yield new
        moved, placed = [], []
        try:
            for name in names:
                if os.path.lexists(path / name):
                    os.replace(path / name, old / name)
                    moved.append(name)
            for name in names:
                if os.path.lexists(new / name):
                    os.replace(new / name, path / name)
                    placed.append(name)
        except BaseException:
            for name in placed:
                os.replace(path / name, new / name)
            for name in moved:
                os.replace(old / name, path / name)
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def resolved(path: str | os.PathLike[str], what: str = "path") -> Path:
    """``path`` with every symbolic link followed, as :meth:`Path.resolve` gives it.

    Raises:
        PipelineError: a symbolic link on the way loops (one to itself, or two to each
            other), which ``resolve`` reports as a RuntimeError (Python 3.11) or an OSError.
    """
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as exc:
        raise PipelineError(
            f"{what} {path} is a symbolic link that loops (it points, perhaps through other "
            f"links, back to itself: {type(exc).__name__}); remove the link or give another "
            "path") from None


def check_writable(path: str | os.PathLike[str], what: str = "output") -> Path:
    """Check, before any long work, that a file can be created where ``path`` will be written.

    Creates the missing folders above ``path`` (the write would) and a temporary file in its
    folder, which is removed again.

    Raises:
        PipelineError: ``path`` is a folder, or its folder cannot be made or written to
            (``/proc/x``, read-only, ...).
    """
    path = Path(path)
    resolved(path, what)  # a link looping to itself: the write's rename would replace it
    if path.is_dir():  # the rename at the end would fail, after all the work
        raise PipelineError(f"{what} {path} is a folder; give the path of a file to write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.",
                                         suffix=".tmp"):
            pass
    except OSError as exc:
        raise PipelineError(
            f"{what} {path} cannot be written: no file can be made in {path.parent} "
            f"({exc.strerror or type(exc).__name__}); give a path in a folder you can write to"
        ) from exc
    return path


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
    """Read a Parquet file; with ``schema``, check the columns, types and non-null columns.

    Raises:
        PipelineError: the file is missing, not Parquet, damaged, lacks a column of
            ``schema``, has a column of the wrong type, or has nulls in a column that
            ``schema`` declares non-nullable (an id column, say).
    """
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"{path} does not exist; run the stage that produces it (dvc repro)")
    if not path.is_file():
        raise PipelineError(f"{path} is not a file; remove it and rebuild it with dvc repro")
    try:
        table = pq.read_table(path)
        # Decoding is lazy for some encodings; a full validation surfaces a damaged
        # page here, as one line, rather than later inside a stage.
        table.validate(full=True)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise PipelineError(
            f"{path} is not a readable Parquet file ({_first_line(exc)}); "
            "delete it and rebuild it with dvc repro"
        ) from exc
    if schema is None:
        return table
    missing = [f.name for f in schema if f.name not in table.schema.names]
    if missing:
        raise PipelineError(
            f"{path} lacks columns {missing}; it was written by another version, "
            "rebuild it with dvc repro"
        )
    table = table.select(schema.names)
    nulls = {
        field.name: table.column(field.name).null_count
        for field in schema
        if not field.nullable and table.column(field.name).null_count
    }
    if nulls:
        raise PipelineError(
            f"{path} has nulls in columns that must be filled ("
            + ", ".join(f"{name}: {count} rows" for name, count in nulls.items())
            + "); it was not written by this pipeline, rebuild it with dvc repro"
        )
    if not table.schema.equals(schema):
        try:
            table = table.cast(schema)
        except (pa.ArrowException, ValueError) as exc:
            raise PipelineError(
                f"{path} has the wrong column types ({_first_line(exc)}); rebuild it"
            ) from exc
    return table


def read_fewshot(path: str | os.PathLike[str]) -> pa.Table:
    """Read a few-shot table (``FEWSHOT_SCHEMA``) whose entity spans all fit their sentences.

    Raises:
        PipelineError: as :func:`read_parquet`, or a row whose head or tail span is empty,
            outside its tokens, or overlaps the other entity (``prepare_fewshot`` never keeps
            such a row, so the file was written by something else).
    """
    table = read_parquet(path, FEWSHOT_SCHEMA)
    n = pc.list_value_length(table["tokens"]).to_numpy(zero_copy_only=False)
    hs, he, ts, te = (table[c].to_numpy() for c in ("head_start", "head_end", "tail_start",
                                                    "tail_end"))
    ok = ((0 <= hs) & (hs < he) & (he <= n) & (0 <= ts) & (ts < te) & (te <= n)
          & ((he <= ts) | (te <= hs)))
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise PipelineError(
            f"{path} has {int((~ok).sum())} rows whose entity spans do not fit their sentence "
            f"(first: {table['instance_id'][i]}, head [{hs[i]}, {he[i]}), tail [{ts[i]}, "
            f"{te[i]}) of {n[i]} tokens); it was not written by prepare_fewshot, rebuild it "
            "with dvc repro"
        )
    return table


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message, so an error stays one line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_yaml(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` as YAML, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(yaml.safe_dump(obj, sort_keys=False))


def remove_stale_temporaries(folder: str | os.PathLike[str],
                             names: list[str] | None = None) -> list[Path]:
    """Delete temporaries that :func:`atomic_path` or :func:`atomic_dir` left after a SIGKILL.

    Args:
        folder: where to look.
        names: only the temporaries of these files (and the temporaries of those, which a
            writer handed a temporary path leaves); default every temporary in ``folder``.

    Returns:
        The files and folders removed.
    """
    stale = sorted(p for p in Path(folder).glob(".*.tmp") if names is None
                   or any(p.name.lstrip(".").startswith(f"{name}.") for name in names))
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale
