"""Tests for stages/build_graph.py: kNN graph against brute force, symmetry, bad input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import yaml

from pipeline.embeddings_pickle import embeddings_table
from pipeline.errors import PipelineError
from pipeline.io import read_parquet, write_parquet
from pipeline.schemas import GRAPH_SCHEMA, embeddings_schema
from stages import build_graph
from tests.conftest import merged, project_params


def brute_force(vectors: np.ndarray, k: int) -> dict[tuple[int, int], float]:
    """Undirected kNN edges by an independent full-matrix computation."""
    x = vectors.astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sim = x @ x.T
    edges = {}
    for i in range(len(x)):
        candidates = [j for j in np.argsort(-sim[i], kind="stable") if j != i][:k]
        for j in candidates:
            edges[(i, j)] = sim[i, j]
            edges[(j, i)] = sim[i, j]
    return edges


def write_embeddings(path, ids, vectors):
    write_parquet(embeddings_table(ids, vectors), path, embeddings_schema(vectors.shape[1]))


def run(tmp_path, embeddings: str, k, out: str):
    """The stage's main with a params file whose complete build_graph section has ``k``."""
    params = tmp_path / f"params-{out}.yaml"
    section = merged(project_params()["build_graph"], {"k": k})
    params.write_text(yaml.safe_dump({"build_graph": section, "train": {"x": 1}}))
    return build_graph.main(
        [
            "--embeddings",
            str(tmp_path / embeddings),
            "--params",
            str(params),
            "--out",
            str(tmp_path / out),
        ]
    )


@pytest.mark.parametrize(("n", "dim", "k"), [(40, 8, 3), (60, 16, 10), (12, 4, 11)])
def test_matches_brute_force(tmp_path, n, dim, k):
    rng = np.random.default_rng(n)
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    ids = [f"P{i}" for i in range(n)]
    write_embeddings(tmp_path / "emb.parquet", ids, vectors)

    run(tmp_path, "emb.parquet", k, "g.parquet")
    graph = read_parquet(tmp_path / "g.parquet", GRAPH_SCHEMA)
    assert graph.schema.equals(GRAPH_SCHEMA)

    index = {name: i for i, name in enumerate(ids)}
    got = {
        (index[s], index[d]): w
        for s, d, w in zip(
            graph["src"].to_pylist(),
            graph["dst"].to_pylist(),
            graph["weight"].to_pylist(),
            strict=True,
        )
    }
    expected = brute_force(vectors, k)
    assert len(got) == graph.num_rows  # no duplicate rows
    assert set(got) == set(expected)
    for edge, weight in expected.items():
        assert got[edge] == pytest.approx(weight, abs=1e-6)
    # Symmetric with identical weights, no self loops, degree >= k.
    assert all(got[(d, s)] == w for (s, d), w in got.items())
    assert all(s != d for s, d in got)
    degree = np.bincount([s for s, _ in got], minlength=n)
    assert degree.min() >= k
    if k == n - 1:
        assert graph.num_rows == n * (n - 1)  # complete graph


def test_output_sorted_and_independent_of_row_order(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(30, 6)).astype(np.float32)
    ids = [f"P{i}" for i in range(30)]
    perm = rng.permutation(30)
    write_embeddings(tmp_path / "a.parquet", ids, vectors)
    write_embeddings(tmp_path / "b.parquet", [ids[i] for i in perm], vectors[perm])
    a = run(tmp_path, "a.parquet", 4, "ga.parquet")
    b = run(tmp_path, "b.parquet", 4, "gb.parquet")
    assert a.equals(b)
    keys = list(zip(a["src"].to_pylist(), a["dst"].to_pylist(), strict=True))
    assert keys == sorted(keys)


def test_ties_break_to_lower_index():
    # Relation 0 is equally similar to 1 and 2 (both identical to it).
    ids = np.array(["P0", "P1", "P2", "P3"], dtype=object)
    vectors = np.array([[1, 0], [1, 0], [1, 0], [0, 1]], dtype=np.float32)
    table = build_graph.build_graph(ids, vectors, 1)
    edges = set(zip(table["src"].to_pylist(), table["dst"].to_pylist(), strict=True))
    # 0 -> 1, 1 -> 0, 2 -> 0, 3 -> 0 (3 is orthogonal to all; ties to the lowest index)
    assert edges == {
        ("P0", "P1"),
        ("P1", "P0"),
        ("P0", "P2"),
        ("P2", "P0"),
        ("P0", "P3"),
        ("P3", "P0"),
    }


@pytest.mark.parametrize(
    ("vectors", "k", "message"),
    [
        (np.eye(3, dtype=np.float32), 3, "k must be below"),
        (np.eye(3, dtype=np.float32), 0, r"build_graph.k = 0: expected a number >= 1"),
        (np.eye(3, dtype=np.float32), "3", r"build_graph.k = '3': expected an integer"),
        (np.eye(3, dtype=np.float32), 1.5, r"build_graph.k = 1.5: expected an integer"),
        (np.array([[1, 0], [0, 0], [0, 1]], dtype=np.float32), 1, "zero vectors"),
        (np.array([[1, 0], [np.nan, 1], [0, 1]], dtype=np.float32), 1, "NaN"),
        (np.array([[1, 0], [np.inf, 1], [0, 1]], dtype=np.float32), 1, "NaN or infinity"),
    ],
)
def test_bad_input(tmp_path, vectors, k, message):
    write_embeddings(tmp_path / "e.parquet", ["P1", "P2", "P3"], vectors)
    with pytest.raises(PipelineError, match=message) as info:
        run(tmp_path, "e.parquet", k, "g.parquet")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "g.parquet").exists()


def test_build_graph_rejects_k_below_one():
    """The function guards k itself too, for callers that bypass params.yaml."""
    with pytest.raises(PipelineError, match="k >= 1"):
        ids = np.array(["P1", "P2"], dtype=object)
        build_graph.build_graph(ids, np.eye(2, dtype=np.float32), 0)


def test_params_need_complete_section(tmp_path):
    write_embeddings(tmp_path / "e.parquet", ["P1", "P2", "P3"], np.eye(3, dtype=np.float32))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"build_graph": {"k": 1}}))
    argv = ["--embeddings", str(tmp_path / "e.parquet"), "--params", str(tmp_path / "p.yaml"),
            "--out", str(tmp_path / "g.parquet")]
    with pytest.raises(PipelineError, match="build_graph.features is missing"):
        build_graph.main(argv)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"train": {}}))
    with pytest.raises(PipelineError, match="no section 'build_graph'"):
        build_graph.main(argv)
    assert not (tmp_path / "g.parquet").exists()


def test_wrong_file_layout(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"relation": ["P1"], "embedding": [[1.0, 2.0]]}), tmp_path / "x.pq")
    with pytest.raises(PipelineError, match="fixed-size"):
        build_graph.read_embeddings(tmp_path / "x.pq")
    pq.write_table(pa.table({"name": ["P1"]}), tmp_path / "y.pq")
    with pytest.raises(PipelineError, match="lacks"):
        build_graph.read_embeddings(tmp_path / "y.pq")


def test_duplicate_ids():
    ids = np.array(["P1", "P1", "P2"], dtype=object)
    with pytest.raises(PipelineError, match="repeat"):
        build_graph.build_graph(ids, np.eye(3, dtype=np.float32), 1)
