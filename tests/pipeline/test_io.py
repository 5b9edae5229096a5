from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.errors import PipelineError
from pipeline.io import atomic_path, read_parquet, write_json, write_parquet
from pipeline.schemas import GRAPH_SCHEMA


def test_atomic_path_leaves_nothing_after_failure(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.bin"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("crash mid-write")
    assert not target.exists()
    assert list((tmp_path / "sub").iterdir()) == []


def test_atomic_path_keeps_old_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    write_json({"a": 1}, target)
    with pytest.raises(ValueError), atomic_path(target) as tmp:
        tmp.write_text("{broken")
        raise ValueError
    assert target.read_text().strip().startswith("{")
    assert '"a": 1' in target.read_text()


def test_parquet_roundtrip_and_schema_check(tmp_path: Path) -> None:
    table = pa.table({"src": ["P1"], "dst": ["P2"], "weight": [0.5]})
    path = tmp_path / "g.parquet"
    write_parquet(table, path, GRAPH_SCHEMA)
    back = read_parquet(path, GRAPH_SCHEMA)
    assert back.schema.equals(GRAPH_SCHEMA)
    assert back.to_pydict() == {"src": ["P1"], "dst": ["P2"], "weight": [0.5]}
    with pytest.raises(PipelineError, match="lacks columns"):
        read_parquet(path, pa.schema([pa.field("nope", pa.string())]))
    with pytest.raises(PipelineError, match="does not exist"):
        read_parquet(tmp_path / "missing.parquet")


def test_write_parquet_rejects_wrong_columns(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        write_parquet(pa.table({"src": ["P1"]}), tmp_path / "g.parquet", GRAPH_SCHEMA)
    assert not (tmp_path / "g.parquet").exists()


def _graph_file(path: Path, rows: int = 200) -> Path:
    table = pa.table({
        "src": [f"P{i}" for i in range(rows)],
        "dst": [f"P{i + 1}" for i in range(rows)],
        "weight": [0.5] * rows,
    })
    write_parquet(table, path, GRAPH_SCHEMA)
    return path


def test_read_parquet_rejects_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "g.parquet"
    path.write_text("src,dst,weight\nP1,P2,0.5\n")
    with pytest.raises(PipelineError, match="not a readable Parquet file") as info:
        read_parquet(path, GRAPH_SCHEMA)
    assert "\n" not in str(info.value)
    with pytest.raises(PipelineError, match="not a readable Parquet file"):
        read_parquet(path)


def test_read_parquet_rejects_a_folder(tmp_path: Path) -> None:
    (tmp_path / "g.parquet").mkdir()
    with pytest.raises(PipelineError, match="is not a file"):
        read_parquet(tmp_path / "g.parquet", GRAPH_SCHEMA)


def test_read_parquet_rejects_a_truncated_file(tmp_path: Path) -> None:
    path = _graph_file(tmp_path / "g.parquet")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(PipelineError, match="not a readable Parquet file"):
        read_parquet(path, GRAPH_SCHEMA)


def test_read_parquet_damaged_bytes_give_one_error_or_a_valid_table(tmp_path: Path) -> None:
    """Random byte damage anywhere in the file: a PipelineError, never a pyarrow exception."""
    import random

    path = _graph_file(tmp_path / "g.parquet")
    original = path.read_bytes()
    rng = random.Random(0)
    errors = 0
    for _ in range(150):
        data = bytearray(original)
        for _ in range(rng.choice([1, 4, 16])):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        try:
            table = read_parquet(path, GRAPH_SCHEMA)
        except PipelineError as exc:
            assert "\n" not in str(exc)
            errors += 1
        else:
            assert table.schema.equals(GRAPH_SCHEMA)
    assert errors > 0


def test_read_parquet_rejects_nulls_in_id_columns(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "g.parquet"
    # Written with a nullable schema, as a foreign tool would.
    pq.write_table(pa.table({"src": ["P1", None, None], "dst": ["P2", "P3", "P4"],
                             "weight": [0.5, 0.5, 0.5]}), path)
    with pytest.raises(PipelineError, match=r"nulls .*src: 2 rows"):
        read_parquet(path, GRAPH_SCHEMA)


def test_read_parquet_rejects_uncastable_types(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "g.parquet"
    pq.write_table(pa.table({"src": ["P1"], "dst": ["P2"], "weight": ["heavy"]}), path)
    with pytest.raises(PipelineError, match="wrong column types"):
        read_parquet(path, GRAPH_SCHEMA)


def test_atomic_dir_replaces_a_folder_whole_or_not_at_all(tmp_path: Path) -> None:
    from pipeline.io import atomic_dir

    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("1")
    assert sorted(p.name for p in out.iterdir()) == ["a.txt"]
    with pytest.raises(RuntimeError), atomic_dir(out) as tmp:
        (tmp / "b.txt").write_text("half")
        raise RuntimeError("second dataset failed")
    assert sorted(p.name for p in out.iterdir()) == ["a.txt"]
    with atomic_dir(out) as tmp:
        (tmp / "c.txt").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["c.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_remove_stale_temporaries_removes_files_and_folders(tmp_path: Path) -> None:
    from pipeline.io import remove_stale_temporaries

    (tmp_path / ".state.pt.x1.tmp").write_bytes(b"half")
    (tmp_path / ".out.x2.tmp").mkdir()
    (tmp_path / ".out.x2.tmp" / "f").write_text("half")
    (tmp_path / "model.pt").write_bytes(b"ok")
    removed = remove_stale_temporaries(tmp_path)
    assert [p.name for p in removed] == [".out.x2.tmp", ".state.pt.x1.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]
