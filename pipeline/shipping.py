"""A job's files carried to a worker that does not share the stage's file system, and back.

A stage names, per job, the files and folders the job reads and the folders it writes
(:class:`JobFiles`). For a job sent to another machine:

1. :func:`pack` (on the stage's side) lists every file under those paths with its SHA-256
   digest; each distinct file's bytes travel once per worker, keyed by digest (the content
   address), and the function and the job are pickled with every :class:`~pathlib.Path` kept
   as its absolute path on the stage's machine;
2. :func:`unpack` (on the worker) writes the files into a fresh scratch folder, at the same
   place relative to the scratch folder as on the stage's machine, and unpickles the job
   with every path that leads to, is or lies under a shipped path moved into the scratch
   folder: ``models`` in a closure and ``models/split_0/...`` in a job both point at the
   shipped copies; a path unrelated to them (an encoder's folder, found the same way on
   every machine) is left as it is;
3. :func:`collect` (on the worker) returns what the job wrote under its written folders:
   new or changed files' bytes, and the shipped files it removed;
4. :func:`apply` (on the stage's side) writes each file atomically (a temporary file in the
   same folder, then a rename) and removes what the job removed, so the stage's outputs are
   those of a run on its own machine.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.io import atomic_path

#: The persistent id of a pickled path.
_PATH = "regrab-path"


@dataclass(frozen=True)
class JobFiles:
    """What a job reads and writes on the stage's file system.

    Attributes:
        reads: a job's input files and folders (a folder: every file under it).
        writes: the folders a job writes into; what is there before is shipped too (a
            half-trained model's state, read on resume).
    """

    reads: Callable[[Any], Iterable[Path]]
    writes: Callable[[Any], Iterable[Path]] = lambda job: ()


@dataclass(frozen=True)
class Parcel:
    """One job's files as they travel: the paths, the manifest and the pickled job."""

    roots: tuple[str, ...]  # absolute paths read or written, on the stage's machine
    written: tuple[str, ...]  # the written folders among them
    folders: tuple[str, ...]  # the roots that are folders there (maybe empty ones)
    files: dict[str, str]  # absolute path on the stage's machine -> SHA-256 of its bytes
    job: bytes  # the job, pickled by :func:`dumps`


@dataclass
class Digests:
    """SHA-256 of files read during one run, kept per (path, size, mtime) so that a file
    shared by many jobs (a split's training table) is read once."""

    known: dict[tuple[str, int, int], str] = field(default_factory=dict)

    def of(self, path: Path) -> str:
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key not in self.known:
            digest = hashlib.sha256()
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            self.known[key] = digest.hexdigest()
        return self.known[key]


def absolute(path: Path | str) -> str:
    """``path`` made absolute against this process's folder, without following links."""
    return os.path.abspath(path)


def _persistent_id(obj: Any) -> Any:
    """A path's persistent id: its name as given and its absolute name."""
    if isinstance(obj, Path):
        return _PATH, str(obj), absolute(obj)
    return None


def dumps(obj: Any) -> bytes:
    """``obj`` pickled for :func:`loads` by cloudpickle (closures and lambdas too), every
    ``Path`` by name."""
    import cloudpickle  # only a cluster run pickles: no import for the default path

    buffer = io.BytesIO()
    pickler = cloudpickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.persistent_id = _persistent_id
    pickler.dump(obj)
    return buffer.getvalue()


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, move: Callable[[str, str], Path]) -> None:
        super().__init__(file)
        self._move = move

    def persistent_load(self, pid: Any) -> Any:
        kind, name, full = pid
        if kind != _PATH:
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        return self._move(name, full)


def loads(data: bytes, scratch: Path | None = None, roots: Iterable[str] = ()) -> Any:
    """What :func:`dumps` pickled; with ``scratch``, each path related to one of ``roots``
    (the root itself, a folder above it or a path under it) moved into ``scratch``."""
    roots = tuple(PurePosixPath(r) for r in roots)

    def move(name: str, full: str) -> Path:
        if scratch is None:
            return Path(name)
        pure = PurePosixPath(full)
        if any(pure == r or pure in r.parents or r in pure.parents for r in roots):
            return relocated(scratch, full)
        return Path(name)

    return _Unpickler(io.BytesIO(data), move).load()


def returned(data: bytes, scratch: str) -> Any:
    """A job's result pickled by :func:`dumps` on a worker, each path in the worker's
    ``scratch`` folder named as on the stage's machine again."""
    inside = PurePosixPath(relocated(Path(scratch), "/"))

    def move(name: str, full: str) -> Path:
        pure = PurePosixPath(full)
        return Path("/", pure.relative_to(inside)) if inside in pure.parents else Path(name)

    return _Unpickler(io.BytesIO(data), move).load()


def relocated(scratch: Path, full: str) -> Path:
    """Where the stage's absolute path ``full`` lies in a worker's scratch folder."""
    return scratch / "fs" / full.lstrip("/")


def pack(job: Any, files: JobFiles, digests: Digests) -> tuple[Parcel, dict[str, Path]]:
    """The parcel of ``job`` and, for each digest it needs, a file that holds those bytes."""
    written = tuple(absolute(p) for p in files.writes(job))
    roots = tuple(dict.fromkeys((*(absolute(p) for p in files.reads(job)), *written)))
    manifest: dict[str, str] = {}
    sources: dict[str, Path] = {}
    for root in roots:
        path = Path(root)
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in found:
            digest = digests.of(file)
            manifest[absolute(file)] = digest
            sources.setdefault(digest, file)
    folders = tuple(root for root in roots if Path(root).is_dir())
    return Parcel(roots, written, folders, manifest, dumps(job)), sources


def unpack(parcel: Parcel, blobs: dict[str, bytes], scratch: Path) -> Any:
    """Write the parcel's files into ``scratch`` and return its job, paths moved there.

    A root that is missing on the stage's machine is missing here too (a model folder the
    job makes), but the folder above it is made.
    """
    for full, digest in parcel.files.items():
        target = relocated(scratch, full)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blobs[digest])
    for root in parcel.roots:
        relocated(scratch, root).parent.mkdir(parents=True, exist_ok=True)
    for root in parcel.folders:
        relocated(scratch, root).mkdir(parents=True, exist_ok=True)
    return loads(parcel.job, scratch, parcel.roots)


@dataclass(frozen=True)
class Written:
    """What a job changed under its written folders, by absolute path on the stage's side."""

    files: dict[str, bytes]  # new or changed files
    removed: tuple[str, ...]  # shipped files the job deleted
    folders: tuple[str, ...]  # every folder under the written ones, made where missing


def collect(parcel: Parcel, scratch: Path) -> Written:
    """What the job wrote in ``scratch`` under the parcel's written folders."""
    files: dict[str, bytes] = {}
    folders: list[str] = []
    kept: set[str] = set()
    for root in parcel.written:
        here = relocated(scratch, root)
        if not here.is_dir():
            continue
        folders.append(root)
        for path in sorted(here.rglob("*")):
            full = str(PurePosixPath(root) / path.relative_to(here).as_posix())
            if path.is_dir():
                folders.append(full)
                continue
            data = path.read_bytes()
            kept.add(full)
            if parcel.files.get(full) != hashlib.sha256(data).hexdigest():
                files[full] = data
    removed = tuple(full for full in parcel.files
                    if full not in kept and any(PurePosixPath(root) in PurePosixPath(
                        full).parents for root in parcel.written))
    return Written(files, removed, tuple(folders))


def apply(written: Written) -> None:
    """Make the job's writes on the stage's side: each file renamed into place whole."""
    for folder in written.folders:
        Path(folder).mkdir(parents=True, exist_ok=True)
    for full, data in written.files.items():
        path = Path(full)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
    for full in written.removed:
        Path(full).unlink(missing_ok=True)
