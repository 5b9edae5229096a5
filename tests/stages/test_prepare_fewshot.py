import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.errors import PipelineError
from pipeline.schemas import FEWSHOT_SCHEMA
from stages import prepare_fewshot
from tests.conftest import fewrel_record

TOKENS = ["Alice", "was", "born", "in", "Paris", "."]


def _write(raw: Path, name: str, data) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    (raw / name).write_text(json.dumps(data) if not isinstance(data, str) else data)


def test_valid_and_malformed_records_are_counted(tmp_path: Path) -> None:
    good = fewrel_record(TOKENS, [0], [4])
    data = {
        "P19": [
            good,
            fewrel_record(TOKENS, [0], [9]),  # tail outside sentence
            {"tokens": [], "h": good["h"], "t": good["t"]},  # empty tokens
            fewrel_record(TOKENS, [0, 1], [1, 2]),  # overlapping entities
            {"tokens": TOKENS, "h": ["Alice", "Q1", []], "t": good["t"]},  # no mention
            "not a record",
        ],
        "P27": [fewrel_record(TOKENS, [4], [0], head_id="", tail_id="Q9")],
    }
    raw = tmp_path / "raw"
    _write(raw, "val_nyt.json", data)
    _write(raw, "pid2name.json", {"P19": ["place of birth", "d"]})
    reports = prepare_fewshot.prepare(raw, tmp_path / "out", ["val_nyt"], raw / "pid2name.json")
    report = reports["val_nyt"]
    assert report["kept"] == 2
    assert report["skipped"] == 5
    assert report["skipped_by_reason"] == {
        "empty_tokens": 1,
        "head_no_mention": 1,
        "not_an_object": 1,
        "overlapping_entities": 1,
        "tail_span_outside_sentence": 1,
    }
    table = pq.read_table(tmp_path / "out" / "val_nyt.parquet")
    assert table.schema.equals(FEWSHOT_SCHEMA)
    rows = table.to_pylist()
    assert rows[0] == {
        "instance_id": "val_nyt-P19-00000",
        "relation": "P19",
        "relation_name": "place of birth",
        "tokens": TOKENS,
        "head_start": 0,
        "head_end": 1,
        "tail_start": 4,
        "tail_end": 5,
        "head_id": "Q1",
        "tail_id": "Q2",
    }
    # No name in pid2name: the id stands in; an empty Qid becomes null.
    assert rows[1]["relation_name"] == "P27" and rows[1]["head_id"] is None
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["val_nyt"]["skipped"] == 5


def test_any_dataset_listed_in_params_is_converted(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _write(raw, "my-corpus.v2.json", {"P19": [fewrel_record(TOKENS, [0], [4])]})
    reports = prepare_fewshot.prepare(raw, tmp_path / "out", ["my-corpus.v2"], None)
    assert reports["my-corpus.v2"]["kept"] == 1
    assert pq.read_table(tmp_path / "out" / "my-corpus.v2.parquet").num_rows == 1


@pytest.mark.parametrize(
    ("datasets", "message"),
    [
        (["../val_nyt"], "not a file name stem"),
        ([".hidden"], "not a file name stem"),
        (["val_nyt", "val_nyt"], r"lists \['val_nyt'\] more than once"),
        ([], "is empty"),
    ],
)
def test_bad_dataset_names(tmp_path: Path, datasets: list[str], message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        prepare_fewshot.prepare(tmp_path, tmp_path / "out", datasets, None)
    assert not (tmp_path / "out").exists()


def test_corrupt_json_is_one_line_error(tmp_path: Path) -> None:
    _write(tmp_path, "val_nyt.json", '{"P19": [')
    with pytest.raises(PipelineError) as info:
        prepare_fewshot.prepare(tmp_path, tmp_path / "out", ["val_nyt"], None)
    assert "not valid JSON" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out" / "val_nyt.parquet").exists()


def test_missing_input_file_names_the_real_fix(tmp_path: Path) -> None:
    # fetch only produces the files listed in fetch.files: the hint must say so.
    with pytest.raises(PipelineError) as info:
        prepare_fewshot.prepare(tmp_path, tmp_path / "out", ["val_pubmed"], None)
    message = str(info.value)
    assert "val_pubmed.json not found" in message
    assert "fetch.files" in message and f"copy it into {tmp_path}" in message


def test_failure_in_a_later_dataset_leaves_no_partial_output(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _write(raw, "val_nyt.json", {"P19": [fewrel_record(TOKENS, [0], [4])]})
    _write(raw, "val_wiki.json", '{"P19": [')
    out = tmp_path / "out"
    with pytest.raises(PipelineError, match="not valid JSON"):
        prepare_fewshot.prepare(raw, out, ["val_nyt", "val_wiki"], None)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


def test_failed_rerun_keeps_the_previous_output_whole(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _write(raw, "val_nyt.json", {"P19": [fewrel_record(TOKENS, [0], [4])]})
    out = tmp_path / "out"
    prepare_fewshot.prepare(raw, out, ["val_nyt"], None)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _write(raw, "val_nyt.json", {"P19": [fewrel_record(TOKENS, [0], [4])] * 2})
    with pytest.raises(PipelineError, match="not found"):
        prepare_fewshot.prepare(raw, out, ["val_nyt", "val_wiki"], None)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # A successful rerun replaces the folder as a whole, and leaves no temporaries.
    (out / "stale.parquet").write_bytes(b"old")
    prepare_fewshot.prepare(raw, out, ["val_nyt"], None)
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "val_nyt.parquet"]
    assert pq.read_table(out / "val_nyt.parquet").num_rows == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "raw"]


def test_leftover_temporary_folder_is_removed(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _write(raw, "val_nyt.json", {"P19": [fewrel_record(TOKENS, [0], [4])]})
    leftover = tmp_path / ".out.abc123.tmp"  # what a SIGKILL mid-run leaves
    leftover.mkdir()
    (leftover / "val_nyt.parquet").write_bytes(b"half")
    prepare_fewshot.prepare(raw, tmp_path / "out", ["val_nyt"], None)
    assert not leftover.exists()


@pytest.mark.parametrize("content", ['["P19", "place of birth"]', '"names"', "{", "[" * 100_000])
def test_malformed_pid2name_is_one_line_error(tmp_path: Path, content: str) -> None:
    raw = tmp_path / "raw"
    _write(raw, "val_nyt.json", {"P19": [fewrel_record(TOKENS, [0], [4])]})
    _write(raw, "pid2name.json", content)
    with pytest.raises(PipelineError, match="pid2name.json") as info:
        prepare_fewshot.prepare(raw, tmp_path / "out", ["val_nyt"], raw / "pid2name.json")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_malformed_pid2name_entries_are_skipped_and_counted(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _write(raw, "val_nyt.json", {"P19": [fewrel_record(TOKENS, [0], [4])],
                                 "P27": [fewrel_record(TOKENS, [0], [4])]})
    _write(raw, "pid2name.json", {"P19": [7, "d"], "P27": ["citizenship", "d"], "P1": "x"})
    reports = prepare_fewshot.prepare(raw, tmp_path / "out", ["val_nyt"], raw / "pid2name.json")
    assert reports["val_nyt"]["relation_names_skipped"] == 2
    names = pq.read_table(tmp_path / "out" / "val_nyt.parquet")["relation_name"].to_pylist()
    assert names == ["P19", "citizenship"]


@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000,
                                     '{"P19": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                     '{"P19": [' + "1" * 5000 + "]}"])
def test_hostile_json_is_one_line_error(tmp_path: Path, content: str) -> None:
    _write(tmp_path, "val_nyt.json", content)
    with pytest.raises(PipelineError, match="val_nyt.json is (nested too deeply|not valid)") \
            as info:
        prepare_fewshot.prepare(tmp_path, tmp_path / "out", ["val_nyt"], None)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("data", [
    {"P19": ["junk", {"tokens": []}, fewrel_record(TOKENS, [0], [9])], "P27": "nope"},
    {},
    {"P19": []},
])
def test_dataset_without_a_usable_record_fails(tmp_path: Path, data: dict) -> None:
    raw = tmp_path / "raw"
    _write(raw, "val_nyt.json", data)
    with pytest.raises(PipelineError, match="val_nyt: no usable record") as info:
        prepare_fewshot.prepare(raw, tmp_path / "out", ["val_nyt"], None)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_main_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from pipeline.errors import run_cli

    raw = tmp_path / "raw"
    _write(raw, "val_nyt.json", {"P19": ["junk"]})
    params = _params(tmp_path, {"datasets": ["val_nyt"]})
    with pytest.raises(SystemExit) as info:
        run_cli(prepare_fewshot.main, ["--raw", str(raw), "--out", str(tmp_path / "out"),
                                       "--params", str(params)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_mirror_datasets_convert_completely(mirror: Path, tmp_path: Path) -> None:
    reports = prepare_fewshot.prepare(
        mirror / "fewrel", tmp_path, ["val_nyt", "val_wiki"], mirror / "fewrel" / "pid2name.json"
    )
    assert (reports["val_nyt"]["kept"], reports["val_nyt"]["relations"]) == (2500, 25)
    assert (reports["val_wiki"]["kept"], reports["val_wiki"]["relations"]) == (11200, 16)
    nyt = pq.read_table(tmp_path / "val_nyt.parquet")
    assert nyt.schema.equals(FEWSHOT_SCHEMA)
    assert len(set(nyt["instance_id"].to_pylist())) == nyt.num_rows


def _params(tmp_path: Path, section: dict) -> Path:
    import yaml

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"prepare_fewshot": section, "fetch": {"x": 1}}))
    return path


def test_main_reads_validated_params(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _write(raw, "val_nyt.json", {"P19": [fewrel_record(TOKENS, [0], [4])]})
    _write(raw, "pid2name.json", {"P19": ["place of birth", "d"]})
    params = _params(tmp_path, {"datasets": ["val_nyt"]})
    prepare_fewshot.main(["--raw", str(raw), "--out", str(tmp_path / "out"),
                          "--params", str(params)])
    assert pq.read_table(tmp_path / "out" / "val_nyt.parquet").num_rows == 1


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"datasets": "val_nyt"}, r"prepare_fewshot.datasets = 'val_nyt': expected a list"),
        ({"datasets": [1]}, r"prepare_fewshot.datasets\[0\] = 1: expected a string"),
        ({}, r"prepare_fewshot.datasets is missing"),
        ({"datasets": [], "extra": 1}, r"prepare_fewshot has unknown key\(s\) \['extra'\]"),
    ],
)
def test_main_rejects_bad_params(tmp_path: Path, section: dict, message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        prepare_fewshot.main(["--raw", str(tmp_path), "--out", str(tmp_path / "out"),
                              "--params", str(_params(tmp_path, section))])
    assert not (tmp_path / "out").exists()
