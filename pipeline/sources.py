"""Where the raw inputs come from: the ``fetch`` section's schema and the source check.

Each entry of ``fetch.files`` has a dot-free id (so ``dvc exp run -S fetch.files.<id>.sha256=...``
reaches it), the ``path`` it is written to under ``data/raw``, its ``url`` and either a pinned
``sha256`` or a ``follow`` rule, for an upstream that changes:

* ``headers``: the url's ``ETag`` (else ``Last-Modified``) from a HEAD request;
* an http(s) URL: a checksum list such as Wikimedia's ``md5sums``/``sha1sums`` files, lines
  ``<hex>  <file name>``; the line for the url's file name is the version.

With ``$REGRAB_DATA_MIRROR`` set, a followed entry's version is the sha256 of its file in the
mirror: the mirror stands for upstream, and no network is used. :func:`resolve_all` (the
``check_sources`` stage) turns every entry into a :class:`Resolved` record, written by
:func:`write_sources` as ``data/sources.json`` with deterministic bytes: the same sources give
the same file, so DVC skips ``fetch`` (which depends on it) until a followed source moves.
A pinned entry is copied as it is, with no network.

The mirror's path is not recorded: it differs between machines, and the file is committed.
A mirror with other bytes for a followed file gives another sha256, so ``fetch`` reruns; a
pinned file must match its pin wherever it comes from.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pipeline.config import MIRROR_ENV, field
from pipeline.errors import PipelineError
from pipeline.io import atomic_path, file_digest
from pipeline.sections import register_section

#: The format tag of ``data/sources.json``.
SOURCES_FORMAT = 1
#: A file id: a key ``dvc exp run -S`` and Hydra read as one part (no dots, slashes or dashes).
FILE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HEX64 = r"[0-9a-fA-F]{64}"
#: ``follow`` values: the url's headers, or the address of a checksum list.
FOLLOW = r"headers|https?://\S+"
#: Digest algorithms of a checksum list, told apart by the length of their hex digits.
DIGESTS = {32: "md5", 40: "sha1", 64: "sha256", 128: "sha512"}
T = TypeVar("T")


@dataclass(frozen=True)
class FileSpec:
    """One file to fetch: where it goes, where it comes from, and how its version is known."""

    path: str = field(doc="where the file is written, under --out (data/raw), e.g. "
                          "fewrel/val_nyt.json; also its place in $REGRAB_DATA_MIRROR")
    url: str | None = field(doc="upstream address of the file; null: the file exists only in "
                                "the project's data mirror ($REGRAB_DATA_MIRROR must be set)")
    sha256: str | None = field(match=(HEX64, "64 hex digits or null"),
                               doc="SHA-256 the file is pinned to; null with follow: null "
                                   "accepts any content")
    follow: str | None = field(match=(FOLLOW, "null, headers or an http(s) URL"),
                               doc="null: pinned to sha256. headers: follow the url's ETag "
                                   "(else Last-Modified); an http(s) URL: follow the url's line "
                                   "in that checksum list (lines of a hex digest and a file "
                                   "name, like Wikimedia's sha1sums). With the mirror set, a "
                                   "followed file's version is its sha256 there. Needs "
                                   "sha256: null")


@register_section("fetch")
@dataclass(frozen=True)
class FetchParams:
    """``params.yaml`` section ``fetch``: the files the pipeline downloads.

    Local copies are read from ``$REGRAB_DATA_MIRROR`` (laid out like the ``path`` values) when
    it is set. ``check_sources`` resolves followed files to ``data/sources.json`` first.
    """

    retries: int = field(ge=1, doc="download attempts per file (and per HEAD request or "
                                   "checksum list of check_sources)")
    timeout_s: float = field(gt=0, doc="seconds before a stalled download is retried")
    files: dict[str, FileSpec] = field(doc="file id (letters, digits, _; e.g. val_nyt) -> its "
                                           "path under --out, url, sha256 and follow rule")

    def __post_init__(self) -> None:
        if not self.files:  # every later stage would fail on its missing inputs instead
            raise ValueError("fetch.files is empty; declare at least one input, e.g. "
                             "val_nyt with its path, url and sha256 (see params.yaml)")
        seen: dict[str, str] = {}
        for name, spec in self.files.items():
            if not FILE_ID.fullmatch(name):
                raise ValueError(f"fetch.files key {name!r} is not an id (letters, digits and _, "
                                 "not starting with a digit); put the file's path in its path: "
                                 "key, so -S fetch.files.<id>.sha256=... can name it")
            parts = Path(spec.path).parts
            if not spec.path or Path(spec.path).is_absolute() or ".." in parts:
                raise ValueError(f"fetch.files.{name}.path {spec.path!r} must be a relative path "
                                 "inside the data folder")
            if spec.path in seen:
                raise ValueError(f"fetch.files.{name} and fetch.files.{seen[spec.path]} both "
                                 f"write {spec.path}; give each file its own path")
            seen[spec.path] = name
            if spec.follow is not None and spec.sha256 is not None:
                raise ValueError(f"fetch.files.{name} follows its source (follow: {spec.follow}) "
                                 "and pins sha256 too; set sha256: null to follow it, or "
                                 "follow: null to keep the pin")


@dataclass(frozen=True)
class Resolved:
    """One entry of ``data/sources.json``: a file's version as the source check found it.

    ``source`` is ``pinned`` (``sha256`` from params), ``mirror`` (``sha256`` of the mirror's
    file) or ``upstream`` (``version`` from the url's headers or a checksum list). ``version``
    is ``sha256:<hex>``, ``md5:<hex>`` (any algorithm of :data:`DIGESTS`), ``etag:<tag>``,
    ``last-modified:<date>``, or null for a pinned file.
    """

    path: str
    follow: str | None
    source: Literal["pinned", "mirror", "upstream"]
    version: str | None
    sha256: str | None

    def digest(self) -> tuple[str, str] | None:
        """``(algorithm, hex)`` the fetched bytes must have, when one is known."""
        if self.sha256:
            return "sha256", self.sha256.lower()
        algo, _, value = (self.version or "").partition(":")
        return (algo, value.lower()) if algo in DIGESTS.values() else None


def retrying(what: str, retries: int, call: Callable[[], T], fix: str) -> T:
    """``call()`` with up to ``retries`` tries, backing off; one error line when all fail."""
    last: Exception | None = None
    for attempt in range(1, retries + 1):
        try:
            return call()
        except urllib.error.HTTPError as exc:
            if exc.code < 500:  # 404, 403: asking again will not help
                raise PipelineError(f"{what}: HTTP {exc.code} {exc.reason}; {fix}") from exc
            last = exc
        except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, short reads
            last = exc
        if attempt < retries:
            time.sleep(min(2**attempt, 30))
    raise PipelineError(f"{what} failed after {retries} tries ({last}); {fix}")


def head_version(url: str, retries: int, timeout: float) -> str:
    """``etag:<tag>`` or ``last-modified:<date>`` of ``url`` from a HEAD request."""
    def call() -> str:
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310
            return header_version(resp.headers) or ""

    version = retrying(f"HEAD {url}", retries, call,
                       f"check the network, or set {MIRROR_ENV} to a local copy of the data")
    if not version:
        raise PipelineError(f"{url} sends neither ETag nor Last-Modified, so follow: headers "
                            "cannot tell its versions apart; follow a checksum list or pin its "
                            "sha256 (follow: null)")
    return version


def header_version(headers: Any) -> str | None:
    """The version a response's headers name (``etag:`` first), or None."""
    if headers.get("ETag"):
        return f"etag:{headers['ETag']}"
    if headers.get("Last-Modified"):
        return f"last-modified:{headers['Last-Modified']}"
    return None


def parse_checksums(text: str) -> dict[str, str]:
    """``file name -> <algorithm>:<hex>`` from ``<hex>  <name>`` lines (``*name`` too)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*([0-9a-fA-F]+)\s+\*?(\S.*?)\s*", line)
        if match and len(match.group(1)) in DIGESTS:
            hexdigest = match.group(1).lower()
            found[Path(match.group(2)).name] = f"{DIGESTS[len(hexdigest)]}:{hexdigest}"
    return found


def checksum_version(name: str, spec: FileSpec, lists: dict[str, dict[str, str]],
                     retries: int, timeout: float) -> str:
    """The version of ``spec.url``'s file in the checksum list ``spec.follow``."""
    assert spec.follow is not None and spec.url
    listing = spec.follow
    if listing not in lists:
        def call() -> str:
            with urllib.request.urlopen(listing, timeout=timeout) as resp:  # noqa: S310
                return resp.read(1 << 24).decode("utf-8", "replace")

        lists[listing] = parse_checksums(retrying(f"checksum list {listing}", retries, call,
                                                  "check the network and the list's address"))
    file_name = Path(urllib.parse.urlparse(spec.url).path).name
    if file_name not in lists[listing]:
        raise PipelineError(f"fetch.files.{name}: the checksum list {listing} has no line for "
                            f"{file_name} ({len(lists[listing])} files listed); fix follow, or "
                            "follow: headers")
    return lists[listing][file_name]


def resolve_all(cfg: FetchParams, mirror: Path | None) -> dict[str, Resolved]:
    """Every file's version: pinned ones as they are, followed ones from their source.

    Raises:
        PipelineError: a followed file missing from the mirror, an unreachable source, a
            source that names no version.
    """
    lists: dict[str, dict[str, str]] = {}
    resolved: dict[str, Resolved] = {}
    for name, spec in sorted(cfg.files.items()):
        if spec.follow is None:
            resolved[name] = Resolved(spec.path, None, "pinned", None, spec.sha256)
        elif mirror is not None:
            digest = file_digest(mirror / spec.path)
            if digest is None:
                raise PipelineError(f"fetch.files.{name}: {spec.path} is missing from the data "
                                    f"mirror {mirror} ({MIRROR_ENV}); copy it there, or unset "
                                    f"{MIRROR_ENV} to follow it upstream")
            resolved[name] = Resolved(spec.path, spec.follow, "mirror", f"sha256:{digest}", digest)
        elif not spec.url:
            raise PipelineError(f"fetch.files.{name} has no url, so it can be followed only in "
                                f"the project's data mirror; set {MIRROR_ENV}")
        else:
            version = (head_version(spec.url, cfg.retries, cfg.timeout_s)
                       if spec.follow == "headers"
                       else checksum_version(name, spec, lists, cfg.retries, cfg.timeout_s))
            sha = version.partition(":")[2] if version.startswith("sha256:") else None
            resolved[name] = Resolved(spec.path, spec.follow, "upstream", version, sha)
    return resolved


def sources_text(resolved: dict[str, Resolved]) -> str:
    """The bytes of ``data/sources.json``: sorted keys, no timestamps, so no change, no diff."""
    doc = {"format": SOURCES_FORMAT, "files": {k: asdict(v) for k, v in resolved.items()}}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def write_sources(resolved: dict[str, Resolved], path: str | os.PathLike[str]) -> None:
    """Write ``data/sources.json`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(sources_text(resolved))


def read_sources(path: str | os.PathLike[str]) -> dict[str, Resolved]:
    """Read and check ``data/sources.json`` as :func:`write_sources` writes it.

    Raises:
        PipelineError: a missing file or one that is not of this format.
    """
    path = Path(path)
    fix = "run dvc repro check_sources to write it"
    if not path.is_file():
        raise PipelineError(f"{path} not found; {fix}")
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise PipelineError(f"{path} is not valid JSON; {fix}") from exc
    if not isinstance(doc, dict) or doc.get("format") != SOURCES_FORMAT \
            or set(doc) != {"format", "files"} or not isinstance(doc["files"], dict):
        raise PipelineError(f"{path} is not a sources file of format {SOURCES_FORMAT}; {fix}")
    keys = {"path", "follow", "source", "version", "sha256"}
    out: dict[str, Resolved] = {}
    for name, entry in doc["files"].items():
        if not isinstance(entry, dict) or set(entry) != keys \
                or entry["source"] not in ("pinned", "mirror", "upstream") \
                or not all(v is None or isinstance(v, str) for v in entry.values()):
            raise PipelineError(f"{path}: entry {name!r} is not a resolved source; {fix}")
        out[name] = Resolved(**entry)
    return out


def check_matches(cfg: FetchParams, resolved: dict[str, Resolved], mirror: Path | None,
                  where: str) -> None:
    """Refuse a sources file written for other params, or for the mirror when it is unset.

    Raises:
        PipelineError: naming the first entry that differs.
    """
    fix = f"run dvc repro check_sources (it runs before fetch) to resolve {where} again"
    if set(resolved) != set(cfg.files):
        extra = sorted(set(resolved) ^ set(cfg.files))
        raise PipelineError(f"{where} lists other files than fetch.files (e.g. {extra[0]}); {fix}")
    for name, spec in cfg.files.items():
        got = resolved[name]
        pinned = spec.follow is None
        kind = "pinned" if pinned else ("mirror" if mirror is not None else "upstream")
        if (got.path, got.follow, got.source) != (spec.path, spec.follow, kind) \
                or (pinned and got.sha256 != spec.sha256):
            raise PipelineError(f"{where} was resolved for another fetch.files.{name} "
                                f"({got.source} {got.path}, follow {got.follow}) than params "
                                f"and {MIRROR_ENV} give ({kind} {spec.path}); {fix}")
