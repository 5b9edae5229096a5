"""Tests for stages/import_embeddings.py: the restricted unpickler and the conversion."""

from __future__ import annotations

import os
import pickle
import pickletools

import numpy as np
import pytest

from pipeline import embeddings_pickle
from pipeline.config import data_mirror
from pipeline.errors import PipelineError
from pipeline.io import read_parquet
from pipeline.schemas import embeddings_schema
from stages import import_embeddings


def official_like(n: int = 7, dim: int = 5, protocol: int = 3) -> tuple[bytes, dict]:
    """A pickle laid out like the released file: dict of Pid list and float32 matrix."""
    rng = np.random.default_rng(0)
    obj = {
        "relations": [f"P{i}" for i in range(1, n + 1)],
        "embeddings": rng.normal(size=(n, dim)).astype(np.float32),
    }
    return pickle.dumps(obj, protocol=protocol), obj


def globals_named(data: bytes) -> set[str]:
    return {str(arg) for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}


class CallsSystem:
    """Unpickling this runs os.system: the attack the restricted loader must stop."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


class CallsEval:
    def __reduce__(self):
        return (eval, ("1 + 1",))


# Protocol 3 is the released file's; 4 names the same globals via STACK_GLOBAL. Protocols 2
# and 5 would need codecs.encode / numpy's _frombuffer, which the file never uses.
@pytest.mark.parametrize("protocol", [3, 4])
def test_accepts_official_layout(tmp_path, protocol):
    data, obj = official_like(protocol=protocol)
    (tmp_path / "e.pkl").write_bytes(data)
    relations, emb = import_embeddings.main(
        ["--pickle", str(tmp_path / "e.pkl"), "--out", str(tmp_path / "e.parquet")]
    )
    assert relations == obj["relations"]
    np.testing.assert_array_equal(emb, obj["embeddings"])
    table = read_parquet(tmp_path / "e.parquet", embeddings_schema(5))
    assert table.schema.equals(embeddings_schema(5))
    assert table["relation"].to_pylist() == obj["relations"]
    got = np.array(table["embedding"].to_pylist(), dtype=np.float32)
    np.testing.assert_array_equal(got, obj["embeddings"])


def test_protocol3_uses_only_allowed_globals():
    # The released file is protocol 3; its globals must be within the allow-list.
    data, _ = official_like(protocol=3)
    allowed = {f"{m} {n}" for m, n in embeddings_pickle.ALLOWED_GLOBALS}
    assert globals_named(data) <= allowed


@pytest.mark.parametrize("payload", [CallsSystem(), CallsEval(), {"relations": [CallsSystem()]}])
def test_rejects_function_calls(tmp_path, payload, capfd):
    data = pickle.dumps(payload, protocol=3)
    (tmp_path / "evil.pkl").write_bytes(data)
    with pytest.raises(PipelineError, match="does not admit"):
        import_embeddings.main(
            ["--pickle", str(tmp_path / "evil.pkl"), "--out", str(tmp_path / "e.parquet")]
        )
    assert "pwned" not in capfd.readouterr().out
    assert not (tmp_path / "e.parquet").exists()


def test_rejects_other_numpy_callables():
    # Allowed module, other name: numpy.load could read files; it must stay out.
    data = b"\x80\x03cnumpy\nload\nq\x00X\x05\x00\x00\x00/x.nyq\x01\x85q\x02Rq\x03."
    with pytest.raises(PipelineError, match="numpy.load"):
        import_embeddings.restricted_loads(data)


def test_rejects_garbage():
    with pytest.raises(PipelineError, match="cannot read the pickle"):
        import_embeddings.restricted_loads(b"not a pickle at all")


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([1, 2], "dict with keys"),
        ({"relations": ["P1"]}, "dict with keys"),
        ({"relations": ["P1", "P2"], "embeddings": np.zeros((3, 4), np.float32)}, "2 relation ids"),
        ({"relations": ["P1"], "embeddings": np.zeros(4, np.float32)}, "2-D float"),
        ({"relations": ["P1"], "embeddings": np.zeros((1, 4), np.int64)}, "2-D float"),
        ({"relations": ["P1", "P1"], "embeddings": np.zeros((2, 4), np.float32)}, "duplicate"),
        ({"relations": ["P1", ""], "embeddings": np.zeros((2, 4), np.float32)}, "non-empty"),
        ({"relations": ["P1", 2], "embeddings": np.zeros((2, 4), np.float32)}, "non-empty"),
        ({"relations": ["P1"], "embeddings": np.full((1, 4), np.nan, np.float32)}, "NaN"),
        ({"relations": ["P1"], "embeddings": np.full((1, 4), np.inf, np.float32)}, "NaN"),
        ({"relations": [], "embeddings": np.zeros((0, 4), np.float32)}, "nothing to import"),
    ],
)
def test_validation(obj, message):
    data = pickle.dumps(obj, protocol=3)
    with pytest.raises(PipelineError, match=message):
        import_embeddings.validate(import_embeddings.restricted_loads(data))


def test_float64_is_stored_as_float32(tmp_path):
    obj = {"relations": ["P1", "P2"], "embeddings": np.array([[0.1, 0.2], [0.3, 0.4]])}
    (tmp_path / "e.pkl").write_bytes(pickle.dumps(obj, protocol=3))
    _, emb = import_embeddings.main(
        ["--pickle", str(tmp_path / "e.pkl"), "--out", str(tmp_path / "e.parquet")]
    )
    assert emb.dtype == np.float32


def test_missing_file(tmp_path):
    with pytest.raises(PipelineError, match="not found"):
        import_embeddings.main(["--pickle", str(tmp_path / "no.pkl"), "--out", str(tmp_path / "o")])


def test_mirror_official_file(tmp_path):
    mirror = data_mirror()
    if mirror is None:
        pytest.skip("REGRAB_DATA_MIRROR is unset; point it at shared/data to import the real file")
    path = mirror / "regrab_official" / "embeddings.pkl"
    if not path.exists():
        pytest.skip(f"{path} is not in the mirror")
    relations, emb = import_embeddings.main(
        ["--pickle", str(path), "--out", str(tmp_path / "official.parquet")]
    )
    assert emb.shape == (828, 512)
    assert len(set(relations)) == 828 and all(r.startswith("P") for r in relations)
    table = read_parquet(tmp_path / "official.parquet", embeddings_schema(512))
    assert table.num_rows == 828
    # The paper's datasets' relations are covered (README of the mirror says all of them).
    assert {"P31", "P413", "P17"} <= set(relations)
