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


def test_multi_token_span_is_half_open(tmp_path: Path) -> None:
    tokens = ["The", "United", "States", "capital", "is", "Washington"]
    fields = prepare_fewshot.parse_record(fewrel_record(tokens, [1, 2], [5]))
    assert (fields["head_start"], fields["head_end"]) == (1, 3)
    assert (fields["tail_start"], fields["tail_end"]) == (5, 6)


def test_unknown_dataset_name(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="unknown dataset 'val_nytt'.*known"):
        prepare_fewshot.prepare(tmp_path, tmp_path / "out", ["val_nytt"], None)


def test_corrupt_json_is_one_line_error(tmp_path: Path) -> None:
    _write(tmp_path, "val_nyt.json", '{"P19": [')
    with pytest.raises(PipelineError) as info:
        prepare_fewshot.prepare(tmp_path, tmp_path / "out", ["val_nyt"], None)
    assert "not valid JSON" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out" / "val_nyt.parquet").exists()


def test_missing_input_file(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="not found; run the fetch stage"):
        prepare_fewshot.prepare(tmp_path, tmp_path / "out", ["val_wiki"], None)


def test_mirror_datasets_convert_completely(mirror: Path, tmp_path: Path) -> None:
    reports = prepare_fewshot.prepare(
        mirror / "fewrel", tmp_path, ["val_nyt", "val_wiki"], mirror / "fewrel" / "pid2name.json"
    )
    assert (reports["val_nyt"]["kept"], reports["val_nyt"]["relations"]) == (2500, 25)
    assert (reports["val_wiki"]["kept"], reports["val_wiki"]["relations"]) == (11200, 16)
    nyt = pq.read_table(tmp_path / "val_nyt.parquet")
    assert nyt.schema.equals(FEWSHOT_SCHEMA)
    assert len(set(nyt["instance_id"].to_pylist())) == nyt.num_rows
