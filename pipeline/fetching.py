"""Fetch the raw inputs, all or nothing, checked against their resolved sources.

Every file is written into a temporary folder beside the output folder while it is hashed, and
checked against the digest its :class:`~pipeline.sources.Resolved` record names (the pinned or
resolved sha256, or the md5/sha1 of a checksum list); for a file followed by its headers, the
download's ETag or Last-Modified must still be the version resolved. Only when every file
passed does the new folder replace the old one, so a mismatch or a failed download leaves the
previous output exactly as it was. A file the old folder already holds with the expected sha256
is copied from there instead of fetched again.
"""

from __future__ import annotations

import hashlib
import urllib.request
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from pipeline.config import MIRROR_ENV
from pipeline.errors import PipelineError
from pipeline.io import atomic_dir
from pipeline.sources import FetchParams, FileSpec, Resolved, header_version, retrying

CHUNK = 1 << 20


def copy_hashing(src: BinaryIO, dst: Path, total: int | None, desc: str,
                 algo: str = "sha256") -> dict[str, str]:
    """Copy ``src`` into the new file ``dst``; return its sha256 (and ``algo``) hex digests."""
    digests = {name: hashlib.new(name) for name in {"sha256", algo}}
    dst.parent.mkdir(parents=True, exist_ok=True)
    with dst.open("wb") as fout, tqdm(total=total, unit="B", unit_scale=True, desc=desc,
                                      leave=False) as bar:
        while chunk := src.read(CHUNK):
            for digest in digests.values():
                digest.update(chunk)
            fout.write(chunk)
            bar.update(len(chunk))
    return {name: digest.hexdigest() for name, digest in digests.items()}


def verify(name: str, spec: FileSpec, want: Resolved, got: dict[str, str], origin: str) -> None:
    """Refuse bytes whose digest is not the one ``want`` names, in one line with the fix."""
    expected = want.digest()
    if expected is None or got[expected[0]] == expected[1]:
        return
    key = f"fetch.files.{name}"
    if want.source == "pinned":
        fix = (f"data/raw was left as it was. To take these bytes pin them with "
               f"-S {key}.sha256={got['sha256']} (dvc exp run or the flow; or in params.yaml), "
               f"or follow the source: -S {key}.sha256=null -S {key}.follow=headers")
    else:
        fix = ("the source moved after check_sources resolved it, or the copy is corrupt; "
               "data/raw was left as it was; run dvc repro again to resolve it anew")
    raise PipelineError(f"checksum mismatch for {key} ({spec.path}) from {origin}: expected "
                        f"{expected[0]} {expected[1]}, got {got[expected[0]]}; {fix}")


def from_mirror(name: str, spec: FileSpec, want: Resolved, mirror: Path, dest: Path) -> str:
    """Copy ``mirror/<path>`` to ``dest``, checked; return its sha256."""
    src = mirror / spec.path
    if not src.is_file():
        raise PipelineError(
            f"fetch.files.{name}: {spec.path} is missing from the data mirror {mirror} "
            f"({MIRROR_ENV}); copy it there "
            + (f"from {spec.url}, or unset {MIRROR_ENV} to download it" if spec.url
               else "from the project's data mirror (it has no public address)"))
    algo = (want.digest() or ("sha256", ""))[0]
    with src.open("rb") as fin:
        got = copy_hashing(fin, dest, src.stat().st_size, spec.path, algo)
    verify(name, spec, want, got, str(src))
    return got["sha256"]


def download(name: str, spec: FileSpec, want: Resolved, dest: Path, retries: int,
             timeout: float) -> str:
    """Download ``spec.url`` to ``dest`` with retries and a progress bar, checked."""
    url = spec.url
    if not url:
        raise PipelineError(
            f"fetch.files.{name} has no url: {spec.path} exists only in the project's data "
            f"mirror; set {MIRROR_ENV} to the mirror (../shared/data), or remove the file and "
            "what reads it from params.yaml")
    algo = (want.digest() or ("sha256", ""))[0]

    def call() -> tuple[dict[str, str], str | None]:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310
            total = resp.headers.get("Content-Length")
            got = copy_hashing(resp, dest, int(total) if total else None, spec.path, algo)
            if total and dest.stat().st_size != int(total):
                raise ConnectionError(f"got {dest.stat().st_size} of {total} bytes")
            return got, header_version(resp.headers)

    got, version = retrying(f"could not download fetch.files.{name} from {url}", retries, call,
                            f"data/raw was left as it was; check the network, or set "
                            f"{MIRROR_ENV} to a local copy of the data")
    if want.source == "upstream" and want.digest() is None and version \
            and version != want.version:
        raise PipelineError(
            f"fetch.files.{name} ({spec.path}) moved after check_sources resolved it: {url} "
            f"now sends {version}, data/sources.json names {want.version}; data/raw was left "
            "as it was; run dvc repro again to resolve it anew")
    verify(name, spec, want, got, url)
    return got["sha256"]


def _reuse(old: Path, want: Resolved, dest: Path) -> str | None:
    """Copy ``old`` to ``dest`` when it already has the sha256 ``want`` names."""
    if not want.sha256 or not old.is_file():
        return None
    with old.open("rb") as fin:
        got = copy_hashing(fin, dest, old.stat().st_size, f"{old.name} (kept)")
    if got["sha256"] == want.sha256.lower():
        return got["sha256"]
    dest.unlink()
    return None


def fetch_all(cfg: FetchParams, resolved: dict[str, Resolved], out: Path,
              mirror: Path | None) -> tuple[dict[str, str], int]:
    """Fetch every file of ``cfg`` into ``out``, all or nothing.

    Args:
        cfg: the ``fetch`` section.
        resolved: each file's version (:func:`pipeline.sources.read_sources`), checked to
            match ``cfg`` and ``mirror`` by the caller.
        out: the output folder; replaced as a whole once every file is checked.
        mirror: the data mirror, or None to download.

    Returns:
        (file id -> sha256, how many files were kept from the old folder).

    Raises:
        PipelineError: a missing mirror file, a failed download, a checksum mismatch;
            ``out`` is then untouched.
    """
    hashes: dict[str, str] = {}
    kept = 0
    with atomic_dir(out) as tmp:
        for name, spec in tqdm(sorted(cfg.files.items()), desc="fetch", unit="file"):
            want, dest = resolved[name], tmp / spec.path
            sha = _reuse(out / spec.path, want, dest)
            kept += sha is not None
            if sha is None and mirror is not None:
                sha = from_mirror(name, spec, want, mirror, dest)
            elif sha is None:
                sha = download(name, spec, want, dest, cfg.retries, cfg.timeout_s)
            hashes[name] = sha
    return hashes, kept
