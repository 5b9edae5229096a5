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
