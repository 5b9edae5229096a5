"""Fetch the raw inputs declared in ``params.yaml`` (section ``fetch``).

Each file has an upstream URL and, when known, a sha256. With the environment
variable ``REGRAB_DATA_MIRROR`` set to a folder laid out like ``shared/data``
the file is copied from there; otherwise it is downloaded with retries and a
progress bar. Every file is checksummed while it is written to a temporary
file, and only renamed into place when the checksum matches.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

from pipeline.config import MIRROR_ENV, data_mirror, field, load_section, register_section
from pipeline.errors import PipelineError, run_cli
from pipeline.io import atomic_path

CHUNK = 1 << 20


def _copy_hashing(src: BinaryIO, dst: BinaryIO, total: int | None, desc: str) -> str:
    digest = hashlib.sha256()
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc, leave=False) as bar:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _check(name: str, expected: str | None, actual: str, origin: str) -> None:
    if expected and expected.lower() != actual:
        raise PipelineError(
            f"checksum mismatch for {name} from {origin}: expected sha256 {expected}, "
            f"got {actual}; "
            f"replace the file with the upstream copy, or set fetch.files.{name}.sha256 to null "
            "in params.yaml if you deliberately use another version"
        )


def fetch_from_mirror(name: str, spec: dict[str, Any], mirror: Path, dest: Path) -> str:
    """Copy ``mirror/name`` to ``dest`` atomically, verifying its checksum."""
    src = mirror / name
    if not src.is_file():
        raise PipelineError(
            f"{name} is missing from the data mirror {mirror} ({MIRROR_ENV}); copy it there "
            + (f"from {spec['url']}, or unset {MIRROR_ENV} to download it" if spec.get("url")
               else "from the project's data mirror (it has no public address)")
        )
    with atomic_path(dest) as tmp, src.open("rb") as fin, tmp.open("wb") as fout:
        actual = _copy_hashing(fin, fout, src.stat().st_size, name)
        _check(name, spec.get("sha256"), actual, str(src))
    return actual


def download(name: str, spec: dict[str, Any], dest: Path, retries: int, timeout: float) -> str:
    """Download ``spec['url']`` to ``dest`` atomically with retries and a progress bar."""
    url = spec["url"]
    last_error: Exception | None = None
    for attempt in range(1, retries + 1):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310
                total = resp.headers.get("Content-Length")
                with atomic_path(dest) as tmp, tmp.open("wb") as fout:
                    actual = _copy_hashing(resp, fout, int(total) if total else None, name)
                    _check(name, spec.get("sha256"), actual, url)
            return actual
        except OSError as exc:  # URLError, timeouts and resets are all OSErrors
            last_error = exc
            if attempt < retries:
                time.sleep(min(2**attempt, 30))
    raise PipelineError(
        f"could not download {name} from {url} after {retries} tries ({last_error}); "
        f"check the network, or set {MIRROR_ENV} to a local copy of the data"
    )


def fetch_all(files: dict[str, dict[str, Any]], out: Path, retries: int = 3,
              timeout: float = 60.0, mirror: Path | None = None) -> dict[str, str]:
    """Fetch every declared file into ``out``; return name -> sha256."""
    if not files:
        raise PipelineError("params.yaml fetch.files is empty; declare at least one input")
    hashes: dict[str, str] = {}
    for name, spec in tqdm(sorted(files.items()), desc="fetch", unit="file"):
        if not isinstance(spec, dict) or "url" not in spec:
            raise PipelineError(
                f"fetch.files.{name} needs a 'url' (and ideally a 'sha256') in params.yaml"
            )
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise PipelineError(
                f"fetch.files key {name!r} must be a relative path inside the data folder"
            )
        dest = out / name
        if mirror is None and not spec["url"]:
            raise PipelineError(
                f"fetch.files.{name} has no url: it exists only in the project's data mirror; "
                f"set {MIRROR_ENV} to the mirror (../shared/data), or remove the file and what "
                "reads it from params.yaml")
        if mirror is not None:
            hashes[name] = fetch_from_mirror(name, spec, mirror, dest)
        else:
            hashes[name] = download(name, spec, dest, retries, timeout)
    return hashes


@dataclass(frozen=True)
class FileSpec:
    """One file to fetch: its upstream address and checksum."""

    url: str | None = field(doc="upstream address of the file; null: the file exists only in "
                                "the project's data mirror ($REGRAB_DATA_MIRROR must be set)")
    sha256: str | None = field(doc="SHA-256 of the expected content; null accepts any "
                                   "content (the checksum-mismatch message says so)")


@register_section("fetch")
@dataclass(frozen=True)
class FetchParams:
    """``params.yaml`` section ``fetch``: the files the pipeline downloads.

    Local copies are read from ``$REGRAB_DATA_MIRROR`` (laid out like ``files``' keys) when
    it is set.
    """

    retries: int = field(ge=1, doc="download attempts per file")
    timeout_s: float = field(gt=0, doc="seconds before a stalled download is retried")
    files: dict[str, FileSpec] = field(doc="destination path (under --out, e.g. "
                                           "fewrel/val_nyt.json) -> its url and sha256")

    def __post_init__(self) -> None:
        if not self.files:  # every later stage would fail on its missing inputs instead
            raise ValueError("fetch.files is empty; declare at least one input, e.g. "
                             "fewrel/val_nyt.json with its url and sha256 (see params.yaml)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default="data/raw", help="folder the files are written to")
    args = parser.parse_args(argv)
    cfg = load_section(FetchParams, "fetch", args.params)
    mirror = data_mirror()
    out = Path(args.out)
    files = {name: dataclasses.asdict(spec) for name, spec in cfg.files.items()}
    hashes = fetch_all(files, out, cfg.retries, cfg.timeout_s, mirror)
    origin = f"mirror {mirror}" if mirror else "upstream"
    print(f"fetched {len(hashes)} files from {origin} into {out}")


if __name__ == "__main__":
    run_cli(main)
