"""pipeline/sources.py: the fetch schema, and resolving followed files to versions.

Upstream is a local HTTP server on 127.0.0.1 (a thread, stopped by its fixture) that serves
files with an ETag and Last-Modified, and checksum lists of them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pipeline.config import parse_section
from pipeline.errors import PipelineError
from pipeline.sources import (
    FetchParams,
    Resolved,
    check_matches,
    parse_checksums,
    read_sources,
    resolve_all,
    sources_text,
    write_sources,
)
from tests.upstream import Upstream


def config(files: dict, retries: int = 1) -> FetchParams:
    return parse_section(FetchParams, {"retries": retries, "timeout_s": 5, "files": files},
                         "fetch")


def entry(path: str, url: str | None, sha256: str | None = None,
          follow: str | None = None) -> dict:
    return {"path": path, "url": url, "sha256": sha256, "follow": follow}


def test_headers_resolve_to_the_etag_and_move_with_the_bytes(upstream: Upstream) -> None:
    upstream.files["/t.csv"] = b"a,b\n"
    cfg = config({"t": entry("x/t.csv", f"{upstream.base}/t.csv", follow="headers")})
    first = resolve_all(cfg, None)["t"]
    assert first.source == "upstream" and first.version.startswith('etag:"')
    assert first.sha256 is None and first.digest() is None
    assert resolve_all(cfg, None)["t"] == first  # nothing moved: the same record
    upstream.files["/t.csv"] = b"a,b\nc,d\n"
    assert resolve_all(cfg, None)["t"].version != first.version
    assert upstream.requests == ["HEAD /t.csv"] * 3  # HEAD only: no download


def test_headers_fall_back_to_last_modified_and_refuse_neither(upstream: Upstream) -> None:
    upstream.files["/t.csv"] = b"a"
    upstream.etag = False
    upstream.modified["/t.csv"] = "Tue, 01 Dec 2026 10:00:00 GMT"
    cfg = config({"t": entry("t.csv", f"{upstream.base}/t.csv", follow="headers")})
    assert resolve_all(cfg, None)["t"].version == "last-modified:Tue, 01 Dec 2026 10:00:00 GMT"
    del upstream.modified["/t.csv"]
    with pytest.raises(PipelineError, match="sends neither ETag nor Last-Modified") as info:
        resolve_all(cfg, None)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("algo", ["md5", "sha1", "sha256"])
def test_a_checksum_list_names_the_version(upstream: Upstream, algo: str) -> None:
    body = b"x" * 10
    upstream.files |= {"/dump/a.json.bz2": body, "/dump/b.json.bz2": b"other"}
    url = f"{upstream.base}/dump/a.json.bz2"
    cfg = config({"a": entry("a.json.bz2", url, follow=f"{upstream.base}/sums/{algo}sums"),
                  "b": entry("b.json.bz2", f"{upstream.base}/dump/b.json.bz2",
                             follow=f"{upstream.base}/sums/{algo}sums")})
    got = resolve_all(cfg, None)
    digest = hashlib.new(algo, body).hexdigest()
    assert got["a"].version == f"{algo}:{digest}" and got["a"].digest() == (algo, digest)
    assert got["a"].sha256 == (digest if algo == "sha256" else None)
    assert upstream.requests == [f"GET /sums/{algo}sums"]  # one list, read once for both


def test_a_checksum_list_without_the_file_is_one_line(upstream: Upstream) -> None:
    upstream.files["/other.csv"] = b"o"
    cfg = config({"t": entry("t.csv", f"{upstream.base}/t.csv",
                             follow=f"{upstream.base}/sums/md5sums")})
    with pytest.raises(PipelineError, match=r"fetch.files.t: the checksum list .* has no line "
                                            r"for t.csv \(1 files listed\)"):
        resolve_all(cfg, None)


def test_an_unreachable_source_is_one_line() -> None:
    cfg = config({"t": entry("t.csv", "http://127.0.0.1:9/t.csv", follow="headers")})
    with pytest.raises(PipelineError, match=r"HEAD http://127.0.0.1:9/t.csv failed after 1 "
                                            r"tries .*REGRAB_DATA_MIRROR"):
        resolve_all(cfg, None)


def test_pinned_files_are_copied_without_network(upstream: Upstream) -> None:
    sha = "ab" * 32
    cfg = config({"p": entry("p.json", f"{upstream.base}/p.json", sha256=sha),
                  "n": entry("n.json", None)})
    got = resolve_all(cfg, None)
    assert got["p"] == Resolved("p.json", None, "pinned", None, sha)
    assert got["n"] == Resolved("n.json", None, "pinned", None, None)
    assert upstream.requests == []


def test_the_mirror_stands_for_upstream(tmp_path: Path, upstream: Upstream) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "t.csv").write_bytes(b"v1")
    cfg = config({"t": entry("x/t.csv", f"{upstream.base}/t.csv", follow="headers")})
    first = resolve_all(cfg, tmp_path)["t"]
    assert first.sha256 == hashlib.sha256(b"v1").hexdigest() and first.source == "mirror"
    assert first.version == f"sha256:{first.sha256}"
    (tmp_path / "x" / "t.csv").write_bytes(b"v2")
    assert resolve_all(cfg, tmp_path)["t"].sha256 == hashlib.sha256(b"v2").hexdigest()
    assert upstream.requests == []
    (tmp_path / "x" / "t.csv").unlink()
    with pytest.raises(PipelineError, match="x/t.csv is missing from the data mirror"):
        resolve_all(cfg, tmp_path)


def test_sources_file_is_deterministic_and_read_back(tmp_path: Path) -> None:
    resolved = {"b": Resolved("b.csv", "headers", "upstream", 'etag:"1"', None),
                "a": Resolved("a.csv", None, "pinned", None, "cd" * 32)}
    path = tmp_path / "sources.json"
    write_sources(resolved, path)
    first = path.read_bytes()
    write_sources(dict(reversed(list(resolved.items()))), path)
    assert path.read_bytes() == first == sources_text(resolved).encode()
    assert first.index(b'"a"') < first.index(b'"b"')  # sorted, whatever the order given
    assert read_sources(path) == resolved
    for bad in ("{", '{"format": 2, "files": {}}',
                '{"format": 1, "files": {"a": {"path": "a"}}}'):
        path.write_text(bad)
        with pytest.raises(PipelineError, match="run dvc repro check_sources"):
            read_sources(path)


def test_a_sources_file_for_other_params_or_no_mirror_is_refused(tmp_path: Path) -> None:
    cfg = config({"t": entry("t.csv", "http://x/t.csv", follow="headers")})
    mirrored = {"t": Resolved("t.csv", "headers", "mirror", "sha256:" + "0" * 64, "0" * 64)}
    check_matches(cfg, mirrored, tmp_path, "s.json")
    with pytest.raises(PipelineError, match=r"s.json was resolved for another fetch.files.t "
                                            r"\(mirror .*\(upstream t.csv\)"):
        check_matches(cfg, mirrored, None, "s.json")
    with pytest.raises(PipelineError, match="s.json lists other files than fetch.files"):
        check_matches(cfg, {}, None, "s.json")


@pytest.mark.parametrize(("files", "message"), [
    ({"a.json": entry("a.json", None)}, r"key 'a.json' is not an id"),
    ({"a": entry("../a", None)}, r"fetch.files.a.path '../a' must be a relative path"),
    ({"a": entry("a", None), "b": entry("a", None)}, r"both write a; give each file its own"),
    ({"a": entry("a", "http://x/a", sha256="0" * 64, follow="headers")},
     r"follows its source \(follow: headers\) and pins sha256 too; set sha256: null"),
    ({"a": entry("a", None, sha256="12e45")}, r"expected 64 hex digits or null"),
    ({"a": entry("a", None, follow="etag")}, r"expected null, headers or an http\(s\) URL"),
])
def test_schema_refuses(files: dict, message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        config(files)


def test_parse_checksums_reads_the_common_forms() -> None:
    text = ("d41d8cd98f00b204e9800998ecf8427e  dumps/a.bz2\n"
            "da39a3ee5e6b4b0d3255bfef95601890afd80709 *b.bz2\n# comment\nnot a line\n")
    assert parse_checksums(text) == {"a.bz2": "md5:d41d8cd98f00b204e9800998ecf8427e",
                                     "b.bz2": "sha1:da39a3ee5e6b4b0d3255bfef95601890afd80709"}
