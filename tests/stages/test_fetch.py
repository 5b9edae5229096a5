"""stages/check_sources.py and stages/fetch.py: resolve, then fetch all or nothing.

Upstream is the local HTTP server of :mod:`tests.upstream` (the ``upstream`` fixture).
"""

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from pipeline.errors import PipelineError
from stages import check_sources, fetch
from tests.conftest import project_params
from tests.upstream import Upstream


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry(path: str, url: str | None, sha256: str | None = None,
          follow: str | None = None) -> dict:
    return {"path": path, "url": url, "sha256": sha256, "follow": follow}


def _params(tmp_path: Path, files: dict, **overrides) -> Path:
    """A params file with a complete fetch section (params.yaml's, with ``files`` replaced)."""
    section = {**project_params()["fetch"], "files": files, "retries": 1, **overrides}
    path = tmp_path / "params.yaml"
    # Another stage's section, even one it would refuse, is not read by fetch.
    path.write_text(yaml.safe_dump({"fetch": section, "train": {"x": 1}}))
    return path


def run(tmp_path: Path, files: dict) -> Path:
    """check_sources, then fetch, into tmp_path/out; returns the out folder."""
    params, sources = _params(tmp_path, files), tmp_path / "sources.json"
    check_sources.main(["--params", str(params), "--out", str(sources)])
    fetch.main(["--params", str(params), "--sources", str(sources),
                "--out", str(tmp_path / "out")])
    return tmp_path / "out"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def one_error(capsys, call) -> str:
    """Run ``call`` as a CLI would; return its one stderr line (exit 1 or 2)."""
    from pipeline.errors import run_cli

    with pytest.raises(SystemExit) as info:
        run_cli(lambda argv: call())
    assert info.value.code != 0
    err = capsys.readouterr().err
    # tqdm's bars share stderr; the error is one line, the last.
    (line,) = [x for x in err.splitlines() if "error" in x]
    assert line.startswith("error: ") and err.rstrip().endswith(line)
    return line


@pytest.fixture
def mirror_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    mirror = tmp_path / "mirror"
    (mirror / "fewrel").mkdir(parents=True)
    (mirror / "fewrel" / "a.json").write_bytes(b'{"P1": []}')
    monkeypatch.setenv("REGRAB_DATA_MIRROR", str(mirror))
    return mirror


def test_pinned_files_from_the_mirror(tmp_path: Path, mirror_dir: Path) -> None:
    (mirror_dir / "fewrel" / "b.json").write_bytes(b"{}")
    # A null sha256 with follow null still accepts any content, as before.
    out = run(tmp_path, {"a": entry("fewrel/a.json", "https://example.invalid/a.json",
                                    sha(b'{"P1": []}')),
                         "b": entry("fewrel/b.json", None)})
    assert snapshot(out) == {"fewrel/a.json": b'{"P1": []}', "fewrel/b.json": b"{}"}
    doc = json.loads((tmp_path / "sources.json").read_text())
    assert doc["files"]["a"] == {"path": "fewrel/a.json", "follow": None, "source": "pinned",
                                 "version": None, "sha256": sha(b'{"P1": []}')}


def test_a_pinned_mismatch_is_one_line_and_leaves_the_old_folder(
        tmp_path: Path, mirror_dir: Path, capsys) -> None:
    old = sha(b'{"P1": []}')
    files = {"a": entry("fewrel/a.json", None, old)}
    out = run(tmp_path, files)
    (mirror_dir / "fewrel" / "a.json").write_bytes(b"new bytes")
    (out / "fewrel" / "a.json").write_bytes(b"stale copy")  # not reusable: fetch copies again
    before = snapshot(out)
    line = one_error(capsys, lambda: run(tmp_path, files))
    assert (f"checksum mismatch for fetch.files.a (fewrel/a.json) from {mirror_dir}/fewrel/a.json"
            f": expected sha256 {old}, got {sha(b'new bytes')}") in line
    assert f"-S fetch.files.a.sha256={sha(b'new bytes')}" in line
    assert "-S fetch.files.a.sha256=null -S fetch.files.a.follow=headers" in line
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_followed_upstream_that_moves_is_fetched_again(tmp_path: Path, upstream: Upstream,
                                                         monkeypatch, capsys) -> None:
    monkeypatch.delenv("REGRAB_DATA_MIRROR", raising=False)
    upstream.files |= {"/t.csv": b"v1\n", "/p.json": b"{}"}
    files = {"t": entry("x/t.csv", f"{upstream.base}/t.csv", follow="headers"),
             "p": entry("p.json", f"{upstream.base}/p.json", sha(b"{}"))}
    out = run(tmp_path, files)
    first = (tmp_path / "sources.json").read_bytes()
    assert snapshot(out) == {"x/t.csv": b"v1\n", "p.json": b"{}"}
    # Nothing moved: the same bytes, so DVC would skip fetch.
    check_sources.main(["--params", str(tmp_path / "params.yaml"),
                        "--out", str(tmp_path / "sources.json")])
    assert (tmp_path / "sources.json").read_bytes() == first
    assert "none changed" in capsys.readouterr().out
    upstream.files["/t.csv"] = b"v2, longer\n"
    upstream.requests.clear()
    out = run(tmp_path, files)
    assert (tmp_path / "sources.json").read_bytes() != first
    assert snapshot(out) == {"x/t.csv": b"v2, longer\n", "p.json": b"{}"}
    assert "GET /p.json" not in upstream.requests  # the pinned file was kept, not downloaded
    assert "changed since the last check: t" in capsys.readouterr().out


def test_a_checksum_list_checks_the_download(tmp_path: Path, upstream: Upstream,
                                             monkeypatch, capsys) -> None:
    monkeypatch.delenv("REGRAB_DATA_MIRROR", raising=False)
    upstream.files["/d/a.bz2"] = b"dump"
    files = {"a": entry("a.bz2", f"{upstream.base}/d/a.bz2",
                        follow=f"{upstream.base}/sums/sha1sums")}
    out = run(tmp_path, files)
    assert snapshot(out) == {"a.bz2": b"dump"}
    params, sources = tmp_path / "params.yaml", tmp_path / "sources.json"
    check_sources.main(["--params", str(params), "--out", str(sources)])
    upstream.files["/d/a.bz2"] = b"dump, changed after the check"
    line = one_error(capsys, lambda: fetch.main(["--params", str(params), "--sources",
                                                 str(sources), "--out", str(out)]))
    assert f"expected sha1 {hashlib.sha1(b'dump').hexdigest()}" in line
    assert "the source moved after check_sources resolved it" in line
    assert snapshot(out) == {"a.bz2": b"dump"}


@pytest.mark.parametrize("fault", ["truncated", "missing", "moved"])
def test_a_bad_download_is_one_line_and_leaves_the_old_folder(
        tmp_path: Path, upstream: Upstream, monkeypatch, capsys, fault: str) -> None:
    monkeypatch.delenv("REGRAB_DATA_MIRROR", raising=False)
    upstream.files |= {"/t.csv": b"v1\n", "/u.csv": b"u1\n"}
    files = {"t": entry("t.csv", f"{upstream.base}/t.csv", follow="headers"),
             "u": entry("u.csv", f"{upstream.base}/u.csv", follow="headers")}
    out = run(tmp_path, files)
    upstream.files["/u.csv"] = b"u2, a new version\n"  # one file moved: fetch must rerun
    params, sources = tmp_path / "params.yaml", tmp_path / "sources.json"
    check_sources.main(["--params", str(params), "--out", str(sources)])
    if fault == "truncated":
        upstream.truncate.add("/u.csv")
    elif fault == "missing":
        del upstream.files["/u.csv"]
    else:
        upstream.files["/u.csv"] = b"u3, after the check\n"
    line = one_error(capsys, lambda: fetch.main(["--params", str(params), "--sources",
                                                 str(sources), "--out", str(out)]))
    assert "fetch.files.u" in line and "data/raw was left as it was" in line
    expected = {"truncated": "failed after 1 tries (got 9 of 18 bytes)",
                "missing": "HTTP 404", "moved": "moved after check_sources resolved it"}[fault]
    assert expected in line
    assert snapshot(out) == {"t.csv": b"v1\n", "u.csv": b"u1\n"}


def test_fetch_refuses_sources_resolved_for_other_params(tmp_path: Path, mirror_dir: Path,
                                                         capsys) -> None:
    files = {"a": entry("fewrel/a.json", None, sha(b'{"P1": []}'))}
    run(tmp_path, files)
    params = _params(tmp_path, {"a": entry("fewrel/a.json", None, None)})
    line = one_error(capsys, lambda: fetch.main(
        ["--params", str(params), "--sources", str(tmp_path / "sources.json"),
         "--out", str(tmp_path / "out")]))
    assert "was resolved for another fetch.files.a" in line and "dvc repro check_sources" in line


def test_a_missing_mirror_file_names_the_file_and_fix(tmp_path: Path, mirror_dir: Path,
                                                      capsys) -> None:
    files = {"b": entry("fewrel/b.json", "https://example.invalid/b.json")}
    line = one_error(capsys, lambda: run(tmp_path, files))
    assert "fewrel/b.json is missing from the data mirror" in line and "unset" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"retries": 0}, r"fetch.retries = 0: expected a number >= 1"),
        ({"retries": "3"}, r"fetch.retries = '3': expected an integer"),
        ({"timeout_s": "abc"}, r"fetch.timeout_s = 'abc': expected a number"),
        ({"mirror": "x"}, r"fetch has unknown key\(s\) \['mirror'\]"),
    ],
)
def test_main_rejects_bad_params(tmp_path: Path, overrides: dict, message: str) -> None:
    params = _params(tmp_path, {"a": entry("a.json", None)}, **overrides)
    for stage in (check_sources, fetch):
        with pytest.raises(PipelineError, match=message):
            stage.main(["--params", str(params), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_main_rejects_file_without_url_key(tmp_path: Path) -> None:
    params = _params(tmp_path, {"a": {"path": "a.json", "sha256": None, "follow": None}})
    with pytest.raises(PipelineError, match=r"fetch.files.a.url is missing"):
        check_sources.main(["--params", str(params), "--out", str(tmp_path / "s.json")])


def test_params_declare_every_mirror_file_with_checksum(mirror: Path) -> None:
    files = yaml.safe_load(Path("params.yaml").read_text())["fetch"]["files"]
    for name, spec in files.items():
        path = mirror / spec["path"]
        assert path.is_file(), name
        assert sha(path.read_bytes()) == spec["sha256"], name


def test_committed_sources_are_what_the_check_writes_from_the_mirror(mirror: Path,
                                                                     tmp_path: Path) -> None:
    check_sources.main(["--params", "params.yaml", "--out", str(tmp_path / "sources.json")])
    assert (tmp_path / "sources.json").read_bytes() == Path("data/sources.json").read_bytes()
