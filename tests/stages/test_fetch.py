import hashlib
from pathlib import Path

import pytest
import yaml

from pipeline.errors import PipelineError
from stages import fetch


def _mirror(tmp_path: Path) -> tuple[Path, dict]:
    mirror = tmp_path / "mirror"
    (mirror / "fewrel").mkdir(parents=True)
    payload = b'{"P1": []}'
    (mirror / "fewrel" / "a.json").write_bytes(payload)
    files = {
        "fewrel/a.json": {
            "url": "https://example.invalid/a.json",
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
    }
    return mirror, files


def test_fetch_from_mirror_copies_and_verifies(tmp_path: Path) -> None:
    mirror, files = _mirror(tmp_path)
    hashes = fetch.fetch_all(files, tmp_path / "out", mirror=mirror)
    assert (tmp_path / "out" / "fewrel" / "a.json").read_bytes() == b'{"P1": []}'
    assert hashes["fewrel/a.json"] == files["fewrel/a.json"]["sha256"]


def test_checksum_mismatch_is_one_line_error_and_leaves_no_file(tmp_path: Path) -> None:
    mirror, files = _mirror(tmp_path)
    files["fewrel/a.json"]["sha256"] = "0" * 64
    with pytest.raises(PipelineError) as info:
        fetch.fetch_all(files, tmp_path / "out", mirror=mirror)
    message = str(info.value)
    assert "\n" not in message
    assert "fewrel/a.json" in message and "0" * 64 in message
    assert hashlib.sha256(b'{"P1": []}').hexdigest() in message
    out_dir = tmp_path / "out" / "fewrel"
    assert not out_dir.exists() or list(out_dir.iterdir()) == []


def test_unknown_checksum_is_accepted(tmp_path: Path) -> None:
    mirror, files = _mirror(tmp_path)
    files["fewrel/a.json"]["sha256"] = None
    fetch.fetch_all(files, tmp_path / "out", mirror=mirror)
    assert (tmp_path / "out" / "fewrel" / "a.json").exists()


def test_missing_mirror_file_names_file_and_fix(tmp_path: Path) -> None:
    mirror, files = _mirror(tmp_path)
    files["fewrel/b.json"] = {"url": "https://example.invalid/b.json", "sha256": None}
    with pytest.raises(
        PipelineError,
        match=r"fewrel/b.json is missing from the data mirror.*unset",
    ):
        fetch.fetch_all(files, tmp_path / "out", mirror=mirror)


def test_download_failure_after_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def refuse(url, timeout):
        calls.append(url)
        raise ConnectionRefusedError("refused")

    monkeypatch.setattr(fetch.urllib.request, "urlopen", refuse)
    monkeypatch.setattr(fetch.time, "sleep", lambda s: None)
    spec = {"url": "https://example.invalid/x", "sha256": None}
    with pytest.raises(PipelineError, match="after 3 tries"):
        fetch.download("x", spec, tmp_path / "x", retries=3, timeout=1)
    assert len(calls) == 3
    assert not (tmp_path / "x").exists()


def test_path_escape_rejected(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="relative path"):
        fetch.fetch_all({"../evil": {"url": "u"}}, tmp_path / "out", mirror=tmp_path)


def test_params_declare_every_mirror_file_with_checksum(mirror: Path) -> None:
    params = yaml.safe_load(Path("params.yaml").read_text())["fetch"]["files"]
    for name, spec in params.items():
        path = mirror / name
        assert path.is_file(), name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == spec["sha256"], name


def _params(tmp_path: Path, files: dict, **overrides) -> Path:
    """A params file with a complete fetch section (params.yaml's, with ``files`` replaced)."""
    from tests.conftest import project_params

    section = {**project_params()["fetch"], "files": files, **overrides}
    path = tmp_path / "params.yaml"
    # Another stage's section, even one it would refuse, is not read by fetch.
    path.write_text(yaml.safe_dump({"fetch": section, "train": {"x": 1}}))
    return path


def test_main_reads_validated_params(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror, files = _mirror(tmp_path)
    (mirror / "fewrel" / "b.json").write_bytes(b"{}")
    # A null sha256 is how the checksum-mismatch message tells users to accept a file.
    files["fewrel/b.json"] = {"url": "https://example.invalid/b.json", "sha256": None}
    monkeypatch.setenv("REGRAB_DATA_MIRROR", str(mirror))
    fetch.main(["--params", str(_params(tmp_path, files)), "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "fewrel" / "a.json").read_bytes() == b'{"P1": []}'
    assert (tmp_path / "out" / "fewrel" / "b.json").read_bytes() == b"{}"


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
    _, files = _mirror(tmp_path)
    params = _params(tmp_path, files, **overrides)
    with pytest.raises(PipelineError, match=message):
        fetch.main(["--params", str(params), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_main_rejects_file_without_url(tmp_path: Path) -> None:
    params = _params(tmp_path, {"fewrel/a.json": {"sha256": None}})
    with pytest.raises(PipelineError, match=r"fetch.files.fewrel/a.json.url is missing"):
        fetch.main(["--params", str(params), "--out", str(tmp_path / "out")])
