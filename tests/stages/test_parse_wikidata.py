"""Tests for stages.parse_wikidata: tiny dumps and triple files built here, exact triple sets."""

from __future__ import annotations

import bz2
import csv
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.config import data_mirror
from pipeline.errors import PipelineError, run_cli
from pipeline.io import read_parquet
from pipeline.schemas import RELATIONS_SCHEMA, TRIPLES_SCHEMA
from pipeline.wikidata import formats, parse, ranges
from stages import parse_wikidata as pw

# --------------------------------------------------------------------------- builders


def item_value(qid: str, fmt: str = "current") -> dict:
    """An item datavalue in the current (``id`` + ``numeric-id``) or older (numeric) form."""
    value = {"entity-type": "item", "numeric-id": int(qid[1:])}
    if fmt == "current":
        value["id"] = qid
    return {"value": value, "type": "wikibase-entityid"}


def snak(pid: str, datavalue: dict | None = None, snaktype: str = "value") -> dict:
    out = {"snaktype": snaktype, "property": pid, "datatype": "wikibase-item"}
    if datavalue is not None:
        out["datavalue"] = datavalue
    return out


def statement(pid: str, target: str, rank: str = "normal", fmt: str = "current", **extra) -> dict:
    return {
        "mainsnak": snak(pid, item_value(target, fmt)),
        "type": "statement",
        "rank": rank,
        **extra,
    }


def item(qid: str, *statements: dict, **extra) -> dict:
    claims: dict[str, list] = {}
    for st in statements:
        claims.setdefault(st["mainsnak"]["property"], []).append(st)
    return {"type": "item", "id": qid, "labels": {}, "claims": claims, **extra}


def prop(
    pid: str, label: str | None, description: str | None = None, aliases: tuple[str, ...] = ()
) -> dict:
    """A property entity as the dump writes it: English and German texts."""

    def texts(value: str | None) -> dict:
        en = {"en": {"language": "en", "value": value}} if value else {}
        return {**en, "de": {"language": "de", "value": "x"}}

    return {
        "type": "property",
        "id": pid,
        "datatype": "wikibase-item",
        "labels": texts(label),
        "descriptions": texts(description),
        "aliases": {
            "en": [{"language": "en", "value": alias} for alias in aliases],
            "de": [{"language": "de", "value": "y"}],
        },
        "claims": {},
    }


def write_lines(path: Path, lines: list[str]) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    if path.suffix == ".bz2":
        path.write_bytes(bz2.compress(data))
    elif path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def write_dump(path: Path, entities: list, layout: str = "official", raw: list[str] = ()) -> Path:
    """A dump in the official layout (``[``, lines ending in ``,``, ``]``) or one per line.

    ``raw`` lines are inserted verbatim after the first entity.
    """
    lines = [json.dumps(e) for e in entities]
    lines[1:1] = list(raw)
    if layout == "official":
        lines = ["["] + [f"{line}," if line else "" for line in lines[:-1]] + [lines[-1], "]"]
    return write_lines(path, lines)


def run(tmp_path: Path, inputs: list[Path], *extra: str) -> tuple[set, list[dict], dict]:
    """Run the stage; return the triple set, the rows in order, and the report."""
    out, report = tmp_path / "out" / "triples.parquet", tmp_path / "out" / "report.json"
    result = pw.main(
        [
            "--out",
            str(out),
            "--report",
            str(report),
            "--workers",
            "0",
            "--no-progress",
            *map(str, inputs),
            *extra,
        ]
    )
    rows = read_parquet(out, TRIPLES_SCHEMA).to_pylist()
    written, timing = pw.split_timing(result)
    assert json.loads(report.read_text()) == json.loads(json.dumps(written))
    assert json.loads((report.parent / "report.timing.json").read_text()) == timing
    return {(r["head"], r["relation"], r["tail"]) for r in rows}, rows, result


def by_name(report: dict) -> dict[str, dict]:
    return {item["name"]: item for item in report["inputs"]}


# --------------------------------------------------------------------------- dumps

ENTITIES = [
    item("Q1", statement("P31", "Q5"), statement("P17", "Q30", rank="preferred")),
    item("Q2", statement("P31", "Q5"), statement("P31", "Q6", rank="deprecated")),
    item("Q3", statement("P150", "Q1"), statement("P150", "Q2")),
]
EXPECTED = {
    ("Q1", "P31", "Q5"),
    ("Q1", "P17", "Q30"),
    ("Q2", "P31", "Q5"),
    ("Q3", "P150", "Q1"),
    ("Q3", "P150", "Q2"),
}


@pytest.mark.parametrize("layout", ["official", "lines"])
@pytest.mark.parametrize("suffix", [".json", ".json.bz2", ".json.gz"])
@pytest.mark.parametrize("fmt", ["current", "old"])
def test_dump_layouts_compressions_and_id_formats(tmp_path, layout, suffix, fmt):
    entities = json.loads(json.dumps(ENTITIES))
    if fmt == "old":
        for entity in entities:
            for statements in entity["claims"].values():
                for st in statements:
                    del st["mainsnak"]["datavalue"]["value"]["id"]
    path = write_dump(tmp_path / f"dump{suffix}", entities, layout)
    triples, rows, report = run(tmp_path, [path])
    assert triples == EXPECTED
    assert len(rows) == 5
    stats = report["inputs"][0]
    assert stats["format"] == "dump"
    assert stats["compression"] == {".json": "none", ".json.bz2": "bz2", ".json.gz": "gzip"}[suffix]
    assert (stats["entities"], stats["triples"], stats["distinct_triples"]) == (3, 5, 5)
    assert stats["malformed_lines"] == 0 and stats["malformed_statements"] == 0
    assert stats["lines"] == (5 if layout == "official" else 3)
    assert {r["source"] for r in rows} == {path.name}


def test_only_item_valued_main_snaks_of_non_deprecated_statements(tmp_path):
    string_value = {"value": "abc", "type": "string"}
    quantity = {"value": {"amount": "+5", "unit": "1"}, "type": "quantity"}
    property_value = {
        "value": {"entity-type": "property", "numeric-id": 31, "id": "P31"},
        "type": "wikibase-entityid",
    }
    lexeme_value = {
        "value": {"entity-type": "lexeme", "numeric-id": 7, "id": "L7"},
        "type": "wikibase-entityid",
    }
    id_only = {"value": {"id": "Q77"}, "type": "wikibase-entityid"}
    qualifiers = {"P580": [snak("P580", item_value("Q900"))]}
    references = [{"snaks": {"P143": [snak("P143", item_value("Q901"))]}}]
    entity = item(
        "Q10",
        statement("P31", "Q5", rank="normal", qualifiers=qualifiers, references=references),
        statement("P27", "Q30", rank="preferred"),
        statement("P106", "Q40", rank="deprecated"),
        statement("P69", "Q50", rank="deprecated"),
        statement("P69", "Q50", rank="normal"),  # deprecated twin does not hide it
        statement("P31", "Q5", rank="preferred"),  # the same triple again
        {"mainsnak": snak("P1", string_value), "rank": "normal"},
        {"mainsnak": snak("P2", quantity), "rank": "normal"},
        {"mainsnak": snak("P3", property_value), "rank": "normal"},
        {"mainsnak": snak("P4", lexeme_value), "rank": "normal"},
        {"mainsnak": snak("P5", snaktype="somevalue"), "rank": "normal"},
        {"mainsnak": snak("P6", snaktype="novalue"), "rank": "normal"},
        {"mainsnak": snak("P7", id_only)},  # no rank: a normal statement
    )
    # Property and lexeme entities carry statements too, but their heads are not items.
    other_heads = [
        {**prop("P31", "instance of"), "claims": {"P1629": [statement("P1629", "Q21")]}},
        {"type": "lexeme", "id": "L1", "claims": {"P5137": [statement("P5137", "Q22")]}},
        {"type": "item", "id": "Q11", "claims": []},  # no statements serialises as []
    ]
    path = write_dump(tmp_path / "d.json", [entity, *other_heads])
    triples, rows, report = run(tmp_path, [path])
    assert triples == {
        ("Q10", "P31", "Q5"),
        ("Q10", "P27", "Q30"),
        ("Q10", "P69", "Q50"),
        ("Q10", "P7", "Q77"),
    }
    assert len(rows) == 4
    stats = report["inputs"][0]
    assert (stats["entities"], stats["property_entities"], stats["triples"]) == (4, 1, 5)
    assert stats["malformed_lines"] == 0 and stats["malformed_statements"] == 0


def test_malformed_lines_are_skipped_and_counted(tmp_path):
    good = [
        item("Q1", statement("P31", "Q5")),
        item("Q2", statement("P31", "Q6")),
        item("Q3", statement("P17", "Q7")),
    ]
    broken_statement = item("Q4", statement("P31", "Q8"))
    broken_statement["claims"]["P17"] = [{"rank": "normal"}]  # no mainsnak
    broken_statement["claims"]["P18"] = [
        {
            "mainsnak": snak(
                "P18", {"type": "wikibase-entityid", "value": {"entity-type": "item", "id": "Qx"}}
            )
        },
        # int() of this id would raise rather than parse.
        {"mainsnak": snak("P18", {"type": "wikibase-entityid", "value": {"id": "Q" + "7" * 5000}})},
    ]
    raw = [
        '{"type": "item", "id": "Q90", "claims": {"P31": [{"mainsnak"',  # truncated
        "{not json}",
        "42",
        '{"type": "item", "claims": {}}',  # no id
        '{"type": "item", "id": "Q91"}',  # no claims
        '{"type": "item", "id": "Q-3", "claims": {}}',
        "",  # blank lines are not malformed
        json.dumps(broken_statement),
    ]
    path = write_dump(tmp_path / "d.json.bz2", good, raw=raw)
    text = bz2.decompress(path.read_bytes()).decode().splitlines()
    # A dump cut mid-entity: the last line is incomplete.
    cut = tmp_path / "cut.json"
    cut.write_text(
        json.dumps(item("Q60", statement("P31", "Q5")))
        + ",\n"
        + json.dumps(item("Q61", statement("P31", "Q5")))[:40]
    )
    triples, _, report = run(tmp_path, [path, cut])
    assert triples == {
        ("Q1", "P31", "Q5"),
        ("Q2", "P31", "Q6"),
        ("Q3", "P17", "Q7"),
        ("Q4", "P31", "Q8"),
        ("Q60", "P31", "Q5"),
    }
    stats = by_name(report)
    d = stats["d.json.bz2"]
    assert d["malformed_lines"] == 6
    assert d["malformed_reasons"] == {
        "bad_entity_id": 1,
        "bad_json": 2,
        "missing_claims": 1,
        "missing_id": 1,
        "not_an_object": 1,
    }
    assert d["malformed_statements"] == 3
    assert d["entities"] == 4  # the three good ones and Q4
    examples = [(e["line"], e["reason"]) for e in d["malformed_examples"]]
    assert examples == [
        (3, "bad_json"),
        (4, "bad_json"),
        (5, "not_an_object"),
        (6, "missing_id"),
        (7, "missing_claims"),
    ]
    assert text[2].startswith('{"type": "item", "id": "Q90"')
    c = stats["cut.json"]
    assert (c["malformed_lines"], c["malformed_reasons"], c["lines"]) == (1, {"bad_json": 1}, 2)


# --------------------------------------------------------------------------- triple files


def test_triple_files_separators_bad_lines_and_duplicates(tmp_path):
    tsv = write_lines(
        tmp_path / "codex.tsv",
        [
            "Q1\tP31\tQ5",
            "Q1\tP31\tQ5",
            "Q2\tP17\tQ30\r",
            "",
            "Q3\tP31",
            "Q4\tP31\tQ5\tQ6",
            "X4\tP31\tQ5",
            "Q0\tP31\tQ5",
            "Q01\tP31\tQ5",
            "Q5\tQ31\tQ5",
            " Q6 \t P31 \t Q7 ",
        ],
    )
    csv_path = write_lines(
        tmp_path / "wd50k.csv",
        [
            "head,relation,tail",
            "Q2,P17,Q30",
            "Q8,P150,Q9",
            "Q8,P150,Q9",
            "Q10,P150,",
        ],
    )
    wikidata5m = write_lines(tmp_path / "wikidata5m.txt.gz", ["Q11\tP47\tQ12", "Q1\tP31\tQ5"])
    triples, rows, report = run(tmp_path, [tsv, csv_path, wikidata5m])
    assert triples == {
        ("Q1", "P31", "Q5"),
        ("Q2", "P17", "Q30"),
        ("Q6", "P31", "Q7"),
        ("Q8", "P150", "Q9"),
        ("Q11", "P47", "Q12"),
    }
    assert [(r["head"], r["source"]) for r in rows] == [
        ("Q1", "codex.tsv"),
        ("Q2", "codex.tsv"),
        ("Q6", "codex.tsv"),
        ("Q8", "wd50k.csv"),
        ("Q11", "wikidata5m.txt.gz"),
    ]
    s = by_name(report)
    assert s["codex.tsv"]["separator"] == "\t" and s["wd50k.csv"]["separator"] == ","
    assert s["wikidata5m.txt.gz"]["separator"] == "\t"
    assert s["wikidata5m.txt.gz"]["compression"] == "gzip"
    counts = {
        name: (
            v["records"],
            v["triples"],
            v["distinct_triples"],
            v["new_triples"],
            v["malformed_lines"],
        )
        for name, v in s.items()
    }
    assert counts == {
        "codex.tsv": (10, 4, 3, 3, 6),
        "wd50k.csv": (5, 3, 2, 1, 2),
        "wikidata5m.txt.gz": (2, 2, 2, 1, 0),
    }
    assert s["codex.tsv"]["malformed_reasons"] == {"bad_id": 4, "wrong_field_count": 2}
    assert s["codex.tsv"]["lines"] == 11
    assert report["triples"] == 5


def test_separator_sniffed_when_extension_says_nothing(tmp_path):
    comma = write_lines(tmp_path / "triples.dat", ["Q1,P31,Q5"])
    tab = write_lines(tmp_path / "triples.bz2", ["Q2\tP31\tQ5"])
    assert formats.detect_format(comma) == formats.InputFormat("triples", "none", ",")
    assert formats.detect_format(tab) == formats.InputFormat("triples", "bz2", "\t")


def test_duplicates_across_inputs_keep_the_first_source(tmp_path):
    dump = write_dump(tmp_path / "dump.json", [item("Q1", statement("P31", "Q5"))])
    tsv = write_lines(tmp_path / "t.tsv", ["Q1\tP31\tQ5", "Q2\tP31\tQ5"])
    _, rows, report = run(tmp_path, [dump, tsv])
    assert [(r["head"], r["source"]) for r in rows] == [("Q1", "dump.json"), ("Q2", "t.tsv")]
    assert by_name(report)["t.tsv"]["new_triples"] == 1
    _, rows, _ = run(tmp_path, [tsv, dump])
    assert [(r["head"], r["source"]) for r in rows] == [("Q1", "t.tsv"), ("Q2", "t.tsv")]


# --------------------------------------------------------------------------- labels, coverage


RELATION_COLUMNS = [  # written out here, not read from RELATIONS_SCHEMA: readers rely on it
    ("relation", pa.string(), False),
    ("label", pa.string(), True),
    ("triple_count", pa.int64(), False),
    ("description", pa.string(), True),
    ("aliases", pa.list_(pa.string()), False),  # equal whatever the list's item is named
    ("label_source", pa.string(), True),
    ("description_source", pa.string(), True),
]


def relation_row(relation: str, label: str | None, count: int, description: str | None = None,
                 aliases: list[str] = (), sources: tuple = (None, None)) -> dict:
    return {"relation": relation, "label": label, "triple_count": count,
            "description": description, "aliases": list(aliases),
            "label_source": sources[0], "description_source": sources[1]}


def run_relations(tmp_path: Path, inputs: list[Path], pid2name: dict) -> tuple[list[dict], dict]:
    """Run the stage with ``pid2name``; return the relations table's rows and the report."""
    path = tmp_path / "pid2name.json"
    path.write_text(json.dumps(pid2name))
    relations_out = tmp_path / "relations.parquet"
    _, _, report = run(
        tmp_path, inputs, "--pid2name", str(path), "--relations-out", str(relations_out)
    )
    columns = [(f.name, f.type, f.nullable) for f in pq.read_schema(relations_out)]
    assert columns == RELATION_COLUMNS  # exactly the declared schema, in this order
    return read_parquet(relations_out, RELATIONS_SCHEMA).to_pylist(), report


def test_relations_schema_is_as_declared():
    assert [(f.name, f.type, f.nullable) for f in RELATIONS_SCHEMA] == RELATION_COLUMNS


def test_texts_from_property_entities_then_pid2name(tmp_path):
    dump = write_dump(
        tmp_path / "d.json.bz2",
        [
            prop("P31", "instance of", "that class of which this subject is an example",
                 ("is a", "is an")),
            prop("P150", None),
            item(
                "Q1",
                statement("P31", "Q5"),
                statement("P17", "Q30"),
                statement("P150", "Q2"),
                statement("P999", "Q3"),
                statement("P998", "Q3"),
            ),
        ],
    )
    tsv = write_lines(tmp_path / "t.tsv", ["Q4\tP17\tQ30"])
    pid2name = {
        "P0": ["None", "None"],
        "P31": ["is a", "x"],
        "P17": ["country", "sovereign state"],
        "P150": ["contains", "y"],
        "P998": ["None", "No description defined"],  # FewRel's placeholders: missing
    }
    relations, report = run_relations(tmp_path, [dump, tsv], pid2name)
    dump_, fewrel = ("dump", "dump"), ("pid2name", "pid2name")
    assert relations == [
        relation_row("P17", "country", 2, "sovereign state", sources=fewrel),
        relation_row("P31", "instance of", 1, "that class of which this subject is an example",
                     ["is a", "is an"], dump_),
        relation_row("P150", "contains", 1, "y", sources=fewrel),
        relation_row("P998", None, 1),
        relation_row("P999", None, 1),
    ]
    assert report["labels"] == {"dump": 1, "pid2name": 2, "missing": 2}
    assert report["descriptions"] == {"dump": 1, "pid2name": 2, "missing": 2}
    assert report["aliases"] == {"relations": 1, "aliases": 2}
    assert report["pid2name"] == {"names": 3, "descriptions": 3, "malformed_descriptions": 0}
    assert report["inputs"][0]["property_entities"] == 2


def test_property_texts_are_cleaned_and_malformed_ones_skipped_and_counted(tmp_path):
    def edited(pid: str, **fields) -> dict:
        entity = prop(pid, f"label {pid}", f"about {pid}", (f"alias {pid}",))
        entity.update(fields)
        return entity

    properties = [
        edited("P1", labels={"en": {"value": "  a\tb\x00c \u2028"}},  # cleaned like labels
               descriptions={"en": "line\nbreak   text"},  # the bare form is read too
               aliases={"en": [{"value": " x "}, {"value": "x"}, {"value": "\n"}, "bare"]}),
        edited("P2", descriptions={"en": {"value": 5}}),  # falls back to pid2name
        edited("P3", aliases={"en": "not a list"}),
        edited("P4", aliases={"en": [{"value": "ok"}, {"value": 7}]}),
        edited("P5", descriptions="not an object"),
        edited("P6", labels={"en": ["x"]}),  # falls back to pid2name
        edited("P7", descriptions=[], aliases=[]),  # how an empty map may be serialised
    ]
    head = item("Q1", *(statement(f"P{i}", "Q2") for i in range(1, 9)))
    dump = write_dump(tmp_path / "d.json.bz2", [*properties, head])
    pid2name = {"P2": ["two", "about two"], "P6": ["six", "about six"], "P8": ["eight", 5]}
    relations, report = run_relations(tmp_path, [dump], pid2name)
    dump_ = ("dump", "dump")
    assert relations == [
        relation_row("P1", "a b c", 1, "line break text", ["x", "bare"], dump_),
        relation_row("P2", "label P2", 1, "about two", ["alias P2"], ("dump", "pid2name")),
        relation_row("P3", "label P3", 1, "about P3", [], dump_),
        relation_row("P4", "label P4", 1, "about P4", [], dump_),
        relation_row("P5", "label P5", 1, None, ["alias P5"], ("dump", None)),
        relation_row("P6", "six", 1, "about P6", ["alias P6"], ("pid2name", "dump")),
        relation_row("P7", "label P7", 1, None, [], ("dump", None)),
        relation_row("P8", "eight", 1, None, [], ("pid2name", None)),
    ]
    stats = report["inputs"][0]
    assert stats["malformed_texts"] == {"label": 1, "description": 2, "aliases": 2}
    assert (stats["malformed_lines"], stats["malformed_statements"]) == (0, 0)
    assert (stats["entities"], stats["property_entities"]) == (8, 7)
    examples = [(e["line"], e["reason"], e["text"]) for e in stats["malformed_examples"]]
    assert examples == [
        (3, "description", "P2: descriptions.en is a int, not a string"),
        (4, "aliases", "P3: aliases.en is a str, not a list"),
        (5, "aliases", "P4: an alias is a int, not a string"),
        (6, "description", "P5: descriptions is a str, not an object"),
        (7, "label", "P6: labels.en is a list, not a string"),
    ]
    assert report["descriptions"] == {"dump": 4, "pid2name": 1, "missing": 3}
    assert report["aliases"] == {"relations": 4, "aliases": 5}
    assert report["pid2name"] == {"names": 3, "descriptions": 2, "malformed_descriptions": 1}


def test_property_texts_survive_any_cut_into_ranges(tmp_path):
    """Texts travel from the ranges through the part store: the first seen of each wins."""
    entities = [prop(f"P{i}", f"p{i}", f"d{i}", (f"a{i}",)) for i in range(1, 60)]
    entities += [item(f"Q{i}", statement(f"P{i}", "Q1")) for i in range(1, 60)]
    entities.append(prop("P1", "later", "later", ("later",)))  # a repeat: ignored
    dump = write_dump(tmp_path / "d.json.bz2", entities)
    expected = [relation_row(f"P{i}", f"p{i}", 1, f"d{i}", [f"a{i}"], ("dump", "dump"))
                for i in range(1, 60)]
    for extra in ([], ["--range-mb", "0.0005", "--batch-mb", "0.001"]):
        relations, report = run_relations(tmp_path, [dump, *extra], {})
        assert relations == expected
    assert report["inputs"][0]["ranges"] > 2


def test_coverage_of_fewrel_files(tmp_path, capsys):
    tsv = write_lines(tmp_path / "t.tsv", ["Q1\tP31\tQ5", "Q2\tP17\tQ30"])
    fewrel = tmp_path / "val.json"
    fewrel.write_text(json.dumps({"P171": [], "P31": [{"tokens": ["a"]}], "P17": []}))
    _, _, report = run(tmp_path, [tsv], "--coverage", str(fewrel))
    assert report["coverage"]["val.json"] == {
        "path": str(fewrel),
        "relations": 3,
        "covered": 2,
        "missing": ["P171"],
    }
    assert "coverage val.json: 2 of 3 relations; missing: P171" in capsys.readouterr().out


def test_summary_and_progress_bar(tmp_path, capsys):
    dump = write_dump(tmp_path / "d.json.gz", [item("Q1", statement("P31", "Q5"))], raw=["{"])
    tsv = write_lines(tmp_path / "t.tsv", ["Q1\tP31\tQ5", "Q2\tP17\tQ30"])
    pw.main(["--out", str(tmp_path / "t.parquet"), "--workers", "0", str(dump), str(tsv)])
    out, err = capsys.readouterr()
    assert out.splitlines()[:4] == [
        "d.json.gz: 1 triples (1 new) from 1 entities; 1 malformed lines",
        "t.tsv: 2 triples (1 new) from 2 rows; 0 malformed lines",
        "total: 2 distinct triples, 2 relations (labels: 0 from dumps, 0 from pid2name, 2 missing)",
        "descriptions: 0 from dumps, 0 from pid2name, 2 missing; 0 relations with aliases (0 in "
        "all)",
    ]
    # tqdm's last refresh: all compressed bytes done, with the entity and row rates.
    size = dump.stat().st_size + tsv.stat().st_size
    err = err.replace(".00", "")
    assert f"{size}/{size}" in err and "entities/s" in err and "rows/s" in err


def test_rerun_writes_the_same_report_and_keeps_timings_apart(tmp_path):
    """The report is a git-tracked DVC output: wall-clock seconds and the engine that ran
    go to report.timing.json (gitignored), so a rerun leaves the report byte for byte."""
    dump = write_dump(tmp_path / "d.json.bz2", [item(f"Q{i}", statement("P31", "Q5"))
                                                for i in range(1, 50)])
    tsv = write_lines(tmp_path / "t.tsv", ["Q1\tP31\tQ5", "Q2\tP17\tQ30"])
    report = tmp_path / "out" / "report.json"
    written = []
    for extra in ([], ["--range-mb", "0.0005"]):  # same work, another cut and speed
        result = run(tmp_path, [dump, tsv], *extra)[2]
        written.append(report.read_bytes())
    assert written[0] == written[1]
    saved = json.loads(written[0])
    assert "settings" not in saved
    assert not {"seconds", "cpu_seconds"} & {k for item in saved["inputs"] for k in item}
    timing = json.loads((tmp_path / "out" / "report.timing.json").read_text())
    assert [item["name"] for item in timing["inputs"]] == ["d.json.bz2", "t.tsv"]
    assert all(item["seconds"] >= 0 and item["cpu_seconds"] >= 0 for item in timing["inputs"])
    assert timing["settings"] == result["settings"] and timing["settings"]["range_mb"] == 0.0005


# --------------------------------------------------------------------------- streaming


def test_line_batches_cut_at_line_ends_and_drop_overlong_lines():
    lines = [b"short", b"x" * 50, b"", b"another line", b"y" * 200, b"end"]
    data = b"\n".join(lines)  # no final newline
    result = ranges.RangeResult()
    pieces = (data[i : i + 7] for i in range(0, len(data), 7))
    batches = list(ranges.line_batches(pieces, result, batch_bytes=16, max_line_bytes=64))
    kept = [
        (first + i, line)
        for first, blob in batches
        for i, line in enumerate(blob.split(b"\n"))
        if line
    ]
    assert kept == [(1, b"short"), (2, b"x" * 50), (4, b"another line"), (6, b"end")]
    assert all(blob.endswith(b"\n") for _, blob in batches[:-1])
    assert result.lines == 6
    assert result.malformed == {"line_too_long": 1} and result.examples[0][0] == 5


def test_range_sizes_and_batch_sizes_give_the_same_output(tmp_path):
    entities = [
        item(f"Q{i}", statement("P31", f"Q{i % 7 + 1}"), statement("P17", "Q30"))
        for i in range(1, 400)
    ]
    paths = [
        write_dump(tmp_path / "d.json.bz2", entities, raw=["{bad"]),
        write_dump(tmp_path / "e.json.gz", entities[::-1], layout="lines"),
        write_lines(tmp_path / "t.csv", [f"Q{i},P47,Q{i + 1}" for i in range(1, 301)]),
    ]
    reference, ref_rows, ref_report = run(tmp_path, paths)
    assert len(reference) == 2 * 399 + 300
    assert [item["ranges"] for item in ref_report["inputs"]] == [1, 1, 1]
    for extra in (["--batch-mb", "0.002"], ["--range-mb", "0.0005", "--batch-mb", "0.001"]):
        _, rows, report = run(tmp_path, paths, *extra)
        assert rows == ref_rows
        cuts = [item["ranges"] for item in report["inputs"]]
        for a, b in zip(report["inputs"], ref_report["inputs"], strict=True):
            for key in ("seconds", "cpu_seconds", "ranges"):
                a.pop(key), b.pop(key, None)
            assert a == b
    # The last run cut the bz2 and the plain file into many ranges; gzip is one range.
    assert cuts[0] > 2 and cuts[1] == 1 and cuts[2] > 2
    assert by_name(ref_report)["d.json.bz2"]["malformed_examples"][0]["line"] == 3


def test_damaged_stream_keeps_what_came_before_and_fails_unless_allowed(tmp_path, capsys):
    lines = [json.dumps(item(f"Q{i}", statement("P31", "Q5"))) + "\n" for i in range(1, 401)]
    second = bz2.compress((json.dumps(item("Q9", statement("P31", "Q5"))) + "\n").encode() * 50)
    path = tmp_path / "dump.json.bz2"
    # Two bzip2 streams, the second cut short: as a download that broke off.
    path.write_bytes(bz2.compress("".join(lines).encode()) + second[: len(second) // 2])
    out = tmp_path / "t.parquet"
    args = ["--out", str(out), "--workers", "0", "--no-progress", str(path), "--batch-mb", "0.005"]
    with pytest.raises(PipelineError, match="damaged compressed input"):
        pw.main(args)
    heads = [r["head"] for r in read_parquet(out, TRIPLES_SCHEMA).to_pylist()]
    # What comes back is every line of the intact first stream, in order.
    assert heads == [f"Q{i}" for i in range(1, 401)]
    report = pw.main([*args, "--allow-damaged"])
    stats = report["inputs"][0]
    assert stats["stream_error"].endswith("(range 0, after line 400)")
    assert stats["lines"] == len(heads) and stats["malformed_lines"] == 0
    assert report["damaged"] is True and report["damaged_ranges"] == stats["damaged_ranges"] == 1
    assert "WARNING: damaged stream" in capsys.readouterr().out


def test_columnar_triple_parse_agrees_with_the_line_loop():
    clean = b"Q1\tP31\tQ5\nQ22 \t P17\tQ30\r\nQ4294967295\tP1\tQ3\nQ7\tP8\tQ9"
    fast = parse.parse_triples_batch(1, clean, "\t")
    assert [list(c) for c in parse._triples_columnar(clean, "\t")] == [
        [1, 22, 4294967295, 7], [31, 17, 1, 8], [5, 30, 3, 9]]
    # A blank line sends the batch through the line loop.
    assert parse._triples_columnar(clean + b"\n\n", "\t") is None
    slow = parse.parse_triples_batch(1, clean + b"\n\n", "\t")
    for a, b in (
        (fast.heads, slow.heads),
        (fast.relations, slow.relations),
        (fast.tails, slow.tails),
    ):
        assert list(a) == list(b)
    assert list(fast.heads) == [1, 22, 4294967295, 7] and fast.records == slow.records == 4
    for bad in (
        b"Q1\tP31\tQ4294967296\n",
        b"Q1\tP31\tQ\xc2\xa05\n",
        b"Q1\tP31\tQ05\n",
        b"Q1\tP31\n",
        b"Q1\tP31\tQ5\tQ6\n",
        b'"Q1"\tP31\tQ5\n',
    ):
        assert parse._triples_columnar(bad, "\t") is None
        assert len(parse.parse_triples_batch(1, bad, "\t").heads) == 0


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.json.bz2", None, "does not exist"),
        ("notes.txt", b"hello world\n", "unknown format"),
        ("fake.json.bz2", b"[\n]\n", "not bz2-compressed"),
        ("empty.tsv", b"", "is empty"),
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path, capsys, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(pw.main, ["--out", str(tmp_path / "t.parquet"), "--no-progress", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "t.parquet").exists()


def test_clashing_names_missing_inputs_and_bad_side_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = write_lines(tmp_path / "a" / "t.tsv", ["Q1\tP31\tQ5"])
    two = write_lines(tmp_path / "b" / "t.tsv", ["Q2\tP31\tQ5"])
    out = ["--out", str(tmp_path / "t.parquet"), "--no-progress", "--workers", "0"]
    with pytest.raises(PipelineError, match="share the file name"):
        pw.main([*out, str(one), str(two)])
    with pytest.raises(PipelineError, match="no INPUT files"):
        pw.main([*out, "--coverage", str(one), str(two)])
    fewrel = write_lines(tmp_path / "val.json", [json.dumps({"P31": [{"tokens": ["a"]}]})])
    with pytest.raises(PipelineError, match="no usable line in"):
        pw.main([*out, str(one), str(fewrel)])
    bad = write_lines(tmp_path / "bad.json", ['["P31"]'])
    with pytest.raises(PipelineError, match="not FewRel-format"):
        pw.main([*out, str(one), "--coverage", str(bad)])
    with pytest.raises(PipelineError, match="pid2name"):
        pw.main([*out, "--pid2name", str(bad), str(one)])


# --------------------------------------------------------------------------- data mirror


def _independent_dump_triples(path: Path) -> set:
    """A plain bz2 + json reading of a dump, written without the stage's code."""
    triples = set()
    with bz2.open(path, "rt") as fh:
        for line in fh:
            line = line.strip().rstrip(",")
            if line in ("[", "]", ""):
                continue
            entity = json.loads(line)
            for pid, statements in entity["claims"].items():
                for st in statements:
                    main = st["mainsnak"]
                    if st["rank"] == "deprecated" or main["snaktype"] != "value":
                        continue
                    value = main["datavalue"]["value"]
                    if (
                        main["datavalue"]["type"] == "wikibase-entityid"
                        and value["entity-type"] == "item"
                    ):
                        triples.add((entity["id"], pid, value["id"]))
    return triples


def test_data_mirror_counts_and_coverage(tmp_path):
    mirror = data_mirror()
    if mirror is None:
        pytest.skip("REGRAB_DATA_MIRROR is unset; point it at shared/data to run this test")
    triple_files = sorted((mirror / "wikidata" / "triples").iterdir())
    dumps = sorted((mirror / "wikidata" / "dumps").glob("*.json.bz2"))
    fewrel = mirror / "fewrel"
    # Triple files first, so every triple they hold keeps one of their names as source.
    out = tmp_path / "triples.parquet"
    report = pw.main(
        [
            "--out",
            str(out),
            "--workers",
            "0",
            "--no-progress",
            *map(str, triple_files),
            *map(str, dumps),
            "--pid2name",
            str(fewrel / "pid2name.json"),
            "--coverage",
            str(fewrel / "val_nyt.json"),
            str(fewrel / "val_wiki.json"),
        ]
    )
    table = read_parquet(out, TRIPLES_SCHEMA)
    columns = (table.column(c).to_pylist() for c in ("head", "relation", "tail"))
    triples = set(zip(*columns, strict=True))
    stats = by_name(report)
    measured = {
        "codex-m-test.tsv": 10311,
        "codex-m-train.tsv": 185584,
        "codex-m-valid.tsv": 10310,
        "wd50k-test.csv": 46023,
        "wd50k-train.csv": 164631,
        "wd50k-valid.csv": 23860,
        "opentapioca_sample_wikidata_items.json.bz2": 5548,
        "opentapioca_short_stream.json.bz2": 3534,
    }
    assert {name: s["distinct_triples"] for name, s in stats.items()} == measured
    for path in triple_files:
        with path.open(newline="") as fh:
            records = list(csv.reader(fh, delimiter="\t" if path.suffix == ".tsv" else ","))
        assert stats[path.name]["lines"] == len(records)  # wc -l: every line ends in \n
        assert stats[path.name]["distinct_triples"] == len({tuple(r) for r in records})
        assert stats[path.name]["malformed_lines"] == 0
    for path in dumps:
        assert stats[path.name]["malformed_lines"] == 0
        expected = _independent_dump_triples(path)
        assert stats[path.name]["distinct_triples"] == len(expected)
        assert expected <= triples
    assert stats["opentapioca_sample_wikidata_items.json.bz2"]["entities"] == 100
    assert stats["opentapioca_short_stream.json.bz2"]["entities"] == 635
    # The mirror's dumps hold items only: every label and description is pid2name's.
    assert all(s["property_entities"] == 0 for s in stats.values())
    assert report["labels"] == {"dump": 0, "pid2name": 426, "missing": 91}
    assert report["descriptions"] == {"dump": 0, "pid2name": 425, "missing": 92}
    assert report["aliases"] == {"relations": 0, "aliases": 0}
    assert report["triples"] == len(triples) == table.num_rows == 407279

    cov = report["coverage"]
    assert (cov["val_nyt.json"]["covered"], cov["val_nyt.json"]["relations"]) == (24, 25)
    assert cov["val_nyt.json"]["missing"] == ["P171"]
    assert (cov["val_wiki.json"]["covered"], cov["val_wiki.json"]["relations"]) == (14, 16)
    assert cov["val_wiki.json"]["missing"] == ["P59", "P177"]
    # The README's figure for wd50k + codex-m alone: 60 of the 64 train relations.
    from_triple_files = table.filter(pc.match_substring_regex(table["source"], r"\.(tsv|csv)$"))
    from_triple_files = set(from_triple_files.column("relation").unique().to_pylist())
    train = json.loads((fewrel / "train_wiki.json").read_text())
    assert len(set(train) & from_triple_files) == 60


def test_mirror_dump_cut_in_half_keeps_what_the_stdlib_reader_keeps(tmp_path, mirror, capsys):
    """A .json.bz2 cut in half kept fewer entities than the standard library's
    reader (0 in the report), and ``--allow-damaged`` hid the damage from the report."""
    source = mirror / "wikidata" / "dumps" / "opentapioca_sample_wikidata_items.json.bz2"
    data = source.read_bytes()
    cut = tmp_path / "cut.json.bz2"
    cut.write_bytes(data[: len(data) // 2])
    text = b""
    with pytest.raises(EOFError), bz2.open(cut) as stream:  # what the stdlib reader keeps
        while piece := stream.read1(4096):
            text += piece
    whole = text[: text.rfind(b"\n") + 1].split(b"\n")
    expected = [line for line in whole if line.strip() not in (b"", b"[", b"]")]
    assert 0 < len(expected) < 100

    args = ["--out", str(tmp_path / "t.parquet"), "--report", str(tmp_path / "r.json")]
    args += ["--no-progress", "--workers", "0", str(cut)]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(pw.main, args)
    assert exit_info.value.code == 2
    assert "error: damaged compressed input(s) ['cut.json.bz2']" in capsys.readouterr().err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["damaged"] is True and report["inputs"][0]["entities"] == len(expected)

    report = pw.main([*args, "--allow-damaged"])
    stats = report["inputs"][0]
    assert report["damaged"] is True and report["damaged_ranges"] == 1
    assert stats["entities"] == len(expected) and stats["triples"] > 0
    assert stats["stream_error"].startswith("file ends inside the block")
    assert "WARNING: damaged stream" in capsys.readouterr().out
