"""Tests for pipeline/fewrel.py, the FewRel-format parser (the stage's own tests go through
``stages/prepare_fewshot.py``)."""

import json
from pathlib import Path

import pytest

from pipeline.errors import PipelineError
from pipeline.fewrel import (
    convert,
    load_json,
    load_relation_descriptions,
    load_relation_names,
    load_relation_texts,
    parse_record,
    relation_text,
)
from pipeline.schemas import FEWSHOT_SCHEMA
from tests.conftest import fewrel_record

TOKENS = ["Alice", "was", "born", "in", "Paris", "."]


def test_multi_token_span_is_half_open() -> None:
    tokens = ["The", "United", "States", "capital", "is", "Washington"]
    fields = parse_record(fewrel_record(tokens, [1, 2], [5]))
    assert (fields["head_start"], fields["head_end"]) == (1, 3)
    assert (fields["tail_start"], fields["tail_end"]) == (5, 6)


def test_convert_numbers_records_per_relation_and_counts_what_it_skips() -> None:
    good = fewrel_record(TOKENS, [0], [4])
    data = {"P27": [good], "P19": [fewrel_record(TOKENS, [0], [9]), good], "P1": "nope"}
    table, report = convert("own", data, {"P19": "place of birth"})
    assert table.schema.equals(FEWSHOT_SCHEMA)
    # Relations in sorted order; the index is the record's place in its relation's list.
    assert table.column("instance_id").to_pylist() == ["own-P19-00001", "own-P27-00000"]
    assert table.column("relation_name").to_pylist() == ["place of birth", "P27"]
    assert report["skipped_by_reason"] == {"relation_not_a_list": 1,
                                           "tail_span_outside_sentence": 1}
    assert report["instances_per_relation"] == {"P19": 1, "P27": 1}


def test_convert_refuses_data_without_a_usable_record() -> None:
    with pytest.raises(PipelineError, match=r"own: no usable record \(empty_tokens: 1\)"):
        convert("own", {"P1": [{"tokens": []}]}, {})
    with pytest.raises(PipelineError, match="own: expected a JSON object"):
        convert("own", [], {})


def test_load_json_gives_the_callers_advice(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="x.json not found; give a file"):
        load_json(tmp_path / "x.json", fix="give a file")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PipelineError, match=r"bad.json is not valid JSON \(.*\); give a file"):
        load_json(tmp_path / "bad.json", fix="give a file")


def test_a_key_given_twice_is_refused_naming_it_and_the_file(tmp_path: Path) -> None:
    """json keeps the last of two equal keys: a relation given twice (40 sentences, then 2)
    silently lost its first 40."""
    record = json.dumps(fewrel_record(TOKENS, [0], [4]))
    path = tmp_path / "twice.json"
    path.write_text('{"P1": [' + ",".join([record] * 40) + '], "P2": [' + record
                    + '], "P1": [' + record + "," + record + "]}")
    with pytest.raises(PipelineError, match=r"twice.json: key 'P1' is given twice .*merge "
                                            r".*, give a file$"):
        load_json(path, fix="give a file")
    # A relations file keeps its own rule (regrab-predict refuses different texts only).
    (tmp_path / "names.json").write_text('{"P1": ["a"], "P1": ["a"]}')
    assert load_relation_texts(tmp_path / "names.json") == {"P1": ("a", None)}
    path.write_text('{"P1": [' + record + '], "P2": [' + record + "]}")
    assert sorted(load_json(path)) == ["P1", "P2"]


def test_relation_names_skip_malformed_entries(tmp_path: Path) -> None:
    (tmp_path / "pid2name.json").write_text('{"P1": ["one", "d"], "P2": [], "P3": [3]}')
    assert load_relation_names(tmp_path / "pid2name.json") == ({"P1": "one"}, 2)
    assert load_relation_names(None) == ({}, 0)


@pytest.mark.parametrize(("entry", "want"), [
    (["  place of\tbirth ", " where  born "], ("place of birth", "where born")),
    (["country"], ("country", None)),
    (["country", ""], ("country", None)),
    (["country", "No description defined"], ("country", None)),
    (["country", "  no   description defined "], ("country", None)),
    (["country", "None"], ("country", None)),
    (["  "], None), ([], None), (["a", "b", "c"], None), (["a", 5], None), ("a", None),
])
def test_one_reading_of_a_relations_entry(entry, want) -> None:
    """Spaces collapsed, FewRel's placeholder description dropped, malformed entries None."""
    assert relation_text(entry) == want


def test_relation_texts_read_every_entry_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "pid2name.json"
    path.write_text(json.dumps({"P17": ["country", "No description defined"],
                                "P19": [" place  of birth", "where\nborn"]}))
    assert load_relation_texts(path) == {"P17": ("country", None),
                                         "P19": ("place of birth", "where born")}
    path.write_text(json.dumps({"P17": ["", "x"]}))
    with pytest.raises(PipelineError, match="non-empty name"):
        load_relation_texts(path)


def test_relation_descriptions_are_the_texts_without_their_names(tmp_path):
    path = tmp_path / "relations.json"
    path.write_text(json.dumps({"P1": ["one", "the first"], "P2": ["two"], "P3": ["three", ""]}))
    assert load_relation_descriptions(path) == {"P1": "the first", "P2": None, "P3": None}
    assert load_relation_descriptions(None) == {}
    path.write_text(json.dumps({"P1": [""]}))
    with pytest.raises(PipelineError, match="non-empty name"):
        load_relation_descriptions(path)
