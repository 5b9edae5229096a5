"""Tests for pipeline.wikidata.engine through the stage: one process and Dask give the same
tables, a killed run resumes without re-reading finished ranges, damage stays in its range."""

from __future__ import annotations

import bz2
import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline import cluster as cluster_module
from pipeline.errors import PipelineError, run_cli
from pipeline.wikidata import engine
from pipeline.wikidata.collect import work_dir_for
from pipeline.wikidata.ranges import parse_range
from stages import parse_wikidata as pw

distributed = pytest.importorskip("distributed")


def entity(i: int, rng: random.Random) -> dict:
    statements = {
        f"P{rng.randrange(1, 40)}": [
            {
                "mainsnak": {
                    "snaktype": "value",
                    "property": "P1",
                    "datavalue": {
                        "type": "wikibase-entityid",
                        "value": {"entity-type": "item", "id": f"Q{rng.randrange(1, 500)}"},
                    },
                },
                "rank": "normal",
            }
        ]
        for _ in range(rng.randrange(1, 4))
    }
    for key, statements_of_key in statements.items():
        statements_of_key[0]["mainsnak"]["property"] = key
    pad = rng.randbytes(rng.randrange(200)).hex()  # text that compresses like a real dump
    return {"type": "item", "id": f"Q{i}", "claims": statements, "pad": pad}


def multi_block_dump(path: Path, entities: int = 2500, seed: int = 0) -> Path:
    """An official-layout dump of about 1.5 MB in two bzip2 streams of 100 kB blocks (15
    blocks, 0.3 MB compressed)."""
    rng = random.Random(seed)
    lines = [json.dumps(entity(i, rng)) + "," for i in range(1, entities + 1)]
    text = ("[\n" + "\n".join(lines) + "\n]\n").encode()
    half = len(text) // 3
    path.write_bytes(bz2.compress(text[:half], 1) + bz2.compress(text[half:], 1))
    return path


@pytest.fixture(scope="module")
def cluster():
    """A two-worker local cluster in this process (threads: fast to start)."""
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as local:
        yield local.scheduler_address


def run(out: Path, inputs: list[Path], *extra: str) -> tuple[bytes, bytes, dict]:
    """Run the stage; return both tables' bytes and the report."""
    relations = out.with_name(out.stem + ".relations.parquet")
    report = pw.main(
        [
            "--out",
            str(out),
            "--relations-out",
            str(relations),
            "--no-progress",
            "--allow-damaged",
            *map(str, inputs),
            *extra,
        ]
    )
    return out.read_bytes(), relations.read_bytes(), report


def without_timing(report: dict) -> list[dict]:
    timing = ("seconds", "cpu_seconds")
    return [{k: v for k, v in item.items() if k not in timing} for item in report["inputs"]]


def test_dask_cluster_and_one_process_give_identical_tables(tmp_path, cluster, monkeypatch):
    dump = multi_block_dump(tmp_path / "dump.json.bz2")
    tsv = tmp_path / "extra.tsv"
    # Repeats inside the file and of the dump's triples: deduplication across ranges.
    tsv.write_text("".join(f"Q{i % 300 + 1}\tP{i % 7 + 1}\tQ{i % 5 + 1}\n" for i in range(6000)))
    inputs = [dump, tsv]
    small = ["--range-mb", "0.03"]  # ranges smaller than a block: some own no block at all
    serial = run(tmp_path / "serial.parquet", inputs, "--workers", "0")
    serial_cut = run(tmp_path / "serial_cut.parquet", inputs, "--workers", "0", *small)
    on_cluster = run(tmp_path / "cluster.parquet", inputs, "--cluster", cluster, *small)
    monkeypatch.setenv(engine.ADDRESS_ENV, cluster)  # as the Prefect flow passes it
    from_env = run(tmp_path / "env.parquet", inputs, *small)
    assert serial[2]["inputs"][0]["ranges"] == 1 and on_cluster[2]["inputs"][0]["ranges"] > 8
    assert on_cluster[2]["settings"]["cluster"] == from_env[2]["settings"]["cluster"] == cluster
    for other in (serial_cut, on_cluster, from_env):
        assert other[:2] == serial[:2]  # byte for byte: content and order
        ranges = [item.pop("ranges") for item in other[2]["inputs"]]
        assert ranges[0] > 8 and ranges[1] > 1
        assert without_timing(other[2]) == [
            {k: v for k, v in item.items() if k != "ranges"} for item in without_timing(serial[2])
        ]
    assert serial[2]["inputs"][0]["entities"] == 2500
    assert serial[2]["triples"] < sum(item["triples"] for item in serial[2]["inputs"])


def test_mirror_dumps_on_the_cluster_match_one_process(tmp_path, mirror, cluster):
    inputs = sorted((mirror / "wikidata" / "dumps").glob("*.json.bz2"))
    inputs += sorted((mirror / "wikidata" / "triples").iterdir())
    serial = run(tmp_path / "serial.parquet", inputs, "--workers", "0")
    on_cluster = run(
        tmp_path / "cluster.parquet", inputs, "--cluster", cluster, "--range-mb", "0.2"
    )
    assert on_cluster[:2] == serial[:2]
    assert on_cluster[2]["triples"] == serial[2]["triples"] == 407279
    assert sum(item["ranges"] for item in on_cluster[2]["inputs"]) > 30


def test_a_killed_run_resumes_without_rereading_finished_ranges(tmp_path, monkeypatch):
    dump = multi_block_dump(tmp_path / "dump.json.bz2")
    args = ("--workers", "0", "--range-mb", "0.05")
    reference = run(tmp_path / "reference.parquet", [dump], *args)
    ranges = reference[2]["inputs"][0]["ranges"]
    real, calls = engine.parse_range, []

    def killed_after_three(work, *rest):
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a kill in the middle of the run
        calls.append(work.index)
        return real(work, *rest)

    monkeypatch.setattr(engine, "parse_range", killed_after_three)
    out = tmp_path / "triples.parquet"
    with pytest.raises(KeyboardInterrupt):
        run(out, [dump], *args)
    parts = work_dir_for(out)
    assert len(list(parts.glob("*.parquet"))) == 3 and not out.exists()

    calls.clear()

    def counted(work, *rest):
        calls.append(work.index)
        return real(work, *rest)

    monkeypatch.setattr(engine, "parse_range", counted)
    resumed = run(out, [dump], *args)
    assert calls == list(range(3, ranges))  # the three finished ranges were not read again
    assert resumed[:2] == reference[:2]
    assert without_timing(resumed[2]) == without_timing(reference[2])
    assert not parts.exists()  # removed after success


def test_changed_input_starts_over(tmp_path):
    dump = multi_block_dump(tmp_path / "dump.json.bz2", entities=300)
    out = tmp_path / "triples.parquet"
    parts = work_dir_for(out)
    parts.mkdir()
    (parts / "manifest.json").write_text('{"version": 0}')
    (parts / "00000-0000000.parquet").write_text("stale")
    _, _, report = run(out, [dump], "--workers", "0")
    assert report["inputs"][0]["entities"] == 300 and not parts.exists()


def test_a_damaged_range_is_skipped_and_counted_the_others_finish(tmp_path, cluster):
    dump = multi_block_dump(tmp_path / "dump.json.bz2")
    data = bytearray(dump.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one corrupt block in the middle
    dump.write_bytes(bytes(data))
    args = ("--range-mb", "0.05")
    serial = run(tmp_path / "serial.parquet", [dump], "--workers", "0", *args)
    on_cluster = run(tmp_path / "cluster.parquet", [dump], "--cluster", cluster, *args)
    assert on_cluster[:2] == serial[:2]
    report = serial[2]
    stats = report["inputs"][0]
    assert report["damaged"] is True and report["damaged_ranges"] == stats["damaged_ranges"] == 1
    assert 0 < stats["entities"] < 2500
    heads = set(pq.read_table(tmp_path / "serial.parquet").column("head").to_pylist())
    assert "Q2500" in heads and "Q1" in heads  # ranges after the damage were read
    strict = ["--out", str(tmp_path / "t.parquet"), "--no-progress", "--workers", "0", *args]
    with pytest.raises(PipelineError, match="damaged compressed input"):
        pw.main([*strict, str(dump)])


def test_unreachable_scheduler_is_one_line(tmp_path, capsys, monkeypatch):
    tsv = tmp_path / "t.tsv"
    tsv.write_text("Q1\tP31\tQ5\n")
    address = "tcp://127.0.0.1:9"  # discard port: nothing listens
    monkeypatch.setattr(cluster_module, "CONNECT_TIMEOUT_S", 2)
    args = ["--out", str(tmp_path / "o.parquet"), "--no-progress", "--cluster", address, str(tsv)]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(pw.main, args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: cannot reach Dask scheduler at {address}")
    assert engine.ADDRESS_ENV in err and not (tmp_path / "o.parquet").exists()


def test_workers_get_absolute_paths_and_a_missing_input_is_one_line(
    tmp_path, cluster, capsys, monkeypatch
):
    """A worker started in another folder cannot open ``data/dump.tsv``: ranges carry the
    absolute path, and a worker that still cannot open it stops the stage with one line."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.tsv").write_text("Q1\tP31\tQ5\n")
    monkeypatch.chdir(tmp_path)
    record = tmp_path / "opened.txt"  # the task is pickled: a list would be a copy

    def recording(work, batch_bytes):
        with open(record, "a") as fh:
            fh.write(work.path + "\n")
        return parse_range(work, batch_bytes)

    monkeypatch.setattr(engine, "parse_range", recording)
    args = ["--out", "o.parquet", "--no-progress", "--cluster", cluster, "data/t.tsv"]
    report = pw.main(args)
    assert record.read_text().splitlines() == [str(tmp_path / "data" / "t.tsv")]
    assert report["inputs"][0]["path"] == "data/t.tsv"  # the report keeps what the user gave

    def unreadable(work, batch_bytes):
        raise FileNotFoundError(2, "No such file or directory", work.path)

    monkeypatch.setattr(engine, "parse_range", unreadable)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(pw.main, ["--out", "p.parquet", *args[2:]])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: a Dask worker cannot read {tmp_path / 'data' / 't.tsv'}")
    assert "shared file system" in err and not (tmp_path / "p.parquet").exists()
