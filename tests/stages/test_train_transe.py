"""Tests for stages/train_transe.py, through it of model/transe/training.py, and of the TransE
model it trains (model/transe/model.py)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os

import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml

from model.files import tensor_file
from model.transe import training as transe_training
from model.transe.model import TransE, TransEConfig, cross_distance
from model.transe.optim import make_optimizer, train_epoch
from model.transe.ranking import filtered_ranks, rank_metrics
from pipeline.config import load_section, parse_section
from pipeline.errors import PipelineError
from pipeline.io import read_parquet, write_parquet
from pipeline.schemas import TRIPLES_SCHEMA, embeddings_schema
from stages import train_transe
from tests.conftest import merged, project_params

#: TransE small enough for ~0.1 s an epoch on a busy core (every key spelled out, so a
#: change of params.yaml does not change what these tests train).
TINY_MODEL = {
    "dim": 16,
    "epochs": 4,
    "batch_size": 64,
    "chunk_size": 16,
    "negatives": 16,
    "lr": 0.05,
    "loss": "margin",
    "margin": 0.5,
    "adversarial_temperature": 1.0,
    "p_norm": 2,
    "normalize_entities": True,
    "seed": 0,
}
#: The stage keys of the tiny runs; the rest of the section comes from params.yaml.
TINY_STAGE = {
    "threads": 1,
    "heldout_fraction": 0.1,
    # Bit-identical reruns are promised on CPU only (CUDA's scatter-add uses atomics).
    "device": "cpu",
}
TINY_CONFIG = TransEConfig(**TINY_MODEL)


def tiny_config(**overrides) -> TransEConfig:
    """:data:`TINY_CONFIG` with some fields replaced (``__post_init__`` checks run again)."""
    return dataclasses.replace(TINY_CONFIG, **overrides)


def geo_triples(
    countries: int = 20, cities: int = 5, continents: int = 4
) -> list[tuple[str, str, str]]:
    """A tiny world TransE can fit: cities in countries in continents, with inverses.

    Every city occurs twice (P17 and its inverse P150), so a held-out P17 triple
    can be inferred from its P150 twin: learning shows up as a high filtered MRR.
    """
    triples = []
    for c in range(countries):
        triples.append((f"Q{c}", "P30", f"Q9{c % continents}"))  # continent
        triples.append((f"Q{c}", "P36", f"Q{c}_0"))  # capital
        triples.append((f"Q{c}_0", "P1376", f"Q{c}"))  # capital of
        for i in range(cities):
            triples.append((f"Q{c}_{i}", "P17", f"Q{c}"))  # country
            triples.append((f"Q{c}", "P150", f"Q{c}_{i}"))  # contains
    return triples


def write_triples(path, triples, source="test"):
    table = pa.table(
        {
            "head": [h for h, _, _ in triples],
            "relation": [r for _, r, _ in triples],
            "tail": [t for _, _, t in triples],
            "source": [source] * len(triples),
        }
    )
    write_parquet(table, path, TRIPLES_SCHEMA)


def write_params(path, model=None, **stage):
    """A params file whose ``train_transe`` section is complete: params.yaml's section with
    the tiny settings, then ``model`` (TransE keys) and ``stage`` (stage keys) merged in."""
    section = merged(
        project_params()["train_transe"],
        {"model": {**TINY_MODEL, **(model or {})}, **TINY_STAGE, **stage},
    )
    path.write_text(yaml.safe_dump({"train_transe": section, "fetch": {"x": 1}}))


def run(tmp_path, name="emb", ckpt=True, triples="triples.parquet", params="params.yaml"):
    argv = [
        "--triples",
        str(tmp_path / triples),
        "--out",
        str(tmp_path / f"{name}.parquet"),
        "--params",
        str(tmp_path / params),
    ]
    if ckpt:
        argv += ["--checkpoint-dir", str(tmp_path / f"ckpt_{name}")]
    return train_transe.main(argv)


def embeddings(tmp_path, name="emb", dim=TINY_MODEL["dim"]):
    table = read_parquet(tmp_path / f"{name}.parquet", embeddings_schema(dim))
    return table["relation"].to_pylist(), np.array(table["embedding"].to_pylist(), np.float32)


@pytest.fixture
def tiny(tmp_path):
    write_triples(tmp_path / "triples.parquet", geo_triples())
    write_params(tmp_path / "params.yaml")
    return tmp_path


def test_output_schema_and_report(tiny):
    report = run(tiny, ckpt=False)
    table = read_parquet(tiny / "emb.parquet")
    assert table.schema.equals(embeddings_schema(TINY_MODEL["dim"]))
    relations, vectors = embeddings(tiny)
    assert relations == ["P1376", "P150", "P17", "P30", "P36"]  # sorted ids
    assert vectors.shape == (5, TINY_MODEL["dim"]) and np.isfinite(vectors).all()
    assert (tiny / "emb.metrics.json").exists()
    assert report["relations"] == 5 and report["entities"] == 124
    assert report["train_triples"] + report["heldout_triples"] == report["triples"]
    assert 0 < report["heldout_mrr"] <= 1


def test_learns_tiny_graph():
    """Loss falls and held-out MRR beats an untrained model by a wide margin."""
    data = transe_training.encode_triples(_table(geo_triples()))
    train_np, held_np = transe_training.split_heldout(data.triples, 0.1, seed=0)
    train, held, known = map(torch.from_numpy, (train_np, held_np, data.triples))
    cfg = tiny_config(epochs=30)
    gen = torch.Generator().manual_seed(0)
    model = TransE(len(data.entities), len(data.relations), cfg, gen)
    before = rank_metrics(filtered_ranks(model, held, known))["mrr"]
    optimizer = make_optimizer(model)
    losses = [train_epoch(model, optimizer, train, gen) for _ in range(cfg.epochs)]
    after = rank_metrics(filtered_ranks(model, held, known))["mrr"]
    assert losses[-1] < 0.3 * losses[0]
    # Random ranking among 124 entities gives MRR ~ 0.05.
    assert before < 0.15
    assert after > 0.7


def _table(triples):
    return pa.table(
        {
            "head": [t[0] for t in triples],
            "relation": [t[1] for t in triples],
            "tail": [t[2] for t in triples],
            "source": ["x"] * len(triples),
        },
        schema=TRIPLES_SCHEMA,
    )


def test_seeded_runs_identical(tiny):
    run(tiny, "a", ckpt=False)
    run(tiny, "b", ckpt=False)
    write_params(tiny / "other.yaml", model={"seed": 1})
    run(tiny, "c", ckpt=False, params="other.yaml")
    _, a = embeddings(tiny, "a")
    _, b = embeddings(tiny, "b")
    _, c = embeddings(tiny, "c")
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_rerun_writes_the_same_report_and_keeps_timings_apart(tiny):
    """The report is a git-tracked DVC output: its wall-clock numbers go to the gitignored
    emb.timing.json, so a rerun writes the report (and the embeddings) byte for byte."""
    first = run(tiny, ckpt=False)
    files = [(tiny / name).read_bytes() for name in ("emb.metrics.json", "emb.parquet")]
    run(tiny, ckpt=False)
    assert [(tiny / name).read_bytes() for name in ("emb.metrics.json", "emb.parquet")] == files
    saved = json.loads(files[0])
    assert not set(train_transe.TIMING_KEYS) & set(saved)
    assert saved == {k: v for k, v in first.items() if k not in train_transe.TIMING_KEYS}
    timing = json.loads((tiny / "emb.timing.json").read_text())
    assert set(timing) == set(train_transe.TIMING_KEYS) and timing["train_seconds"] > 0


def test_a_resumed_run_writes_the_report_of_a_fresh_one(tiny):
    """Where a run resumed is the run's record, not the data's: a rerun that resumes from the
    finished checkpoint writes the tracked report byte for byte."""
    assert run(tiny)["resumed_from_epoch"] == 0
    fresh = (tiny / "emb.metrics.json").read_bytes()
    assert run(tiny)["resumed_from_epoch"] > 0
    assert (tiny / "emb.metrics.json").read_bytes() == fresh
    assert json.loads((tiny / "emb.timing.json").read_text())["resumed_from_epoch"] > 0


def test_resume_after_interruption_matches_uninterrupted(tiny, monkeypatch):
    write_params(tiny / "params.yaml", model={"epochs": 6}, checkpoint_every=2)
    run(tiny, "full")

    calls = itertools.count()
    real_epoch = transe_training.train_epoch

    def killed_in_epoch_five(*args, **kwargs):
        if next(calls) == 4:
            raise KeyboardInterrupt  # as if the process died mid-epoch
        return real_epoch(*args, **kwargs)

    monkeypatch.setattr(transe_training, "train_epoch", killed_in_epoch_five)
    with pytest.raises(KeyboardInterrupt):
        run(tiny, "cut")
    assert not (tiny / "cut.parquet").exists()
    _, ckpt = tensor_file.load(tiny / "ckpt_cut" / "transe.safetensors",
                                  transe_training.TRANSE_FORMAT)
    assert ckpt["epoch"] == 4  # the last checkpoint before the kill
    # Self-contained: config, stage params and relation names travel with the tables.
    assert ckpt["config"]["dim"] == TINY_MODEL["dim"] and ckpt["params"]["checkpoint_every"] == 2
    assert ckpt["relations"] == ["P1376", "P150", "P17", "P30", "P36"]
    assert ckpt["model"]["relations"].shape == (5, TINY_MODEL["dim"])
    assert not list((tiny / "ckpt_cut").glob(".*.tmp"))  # no half-written file left

    # A SIGKILL during a checkpoint write leaves a temporary file; the rerun removes it.
    (tiny / "ckpt_cut" / ".transe.pt.half.tmp").write_bytes(b"partial")
    monkeypatch.setattr(transe_training, "train_epoch", real_epoch)
    report = run(tiny, "cut")
    assert not (tiny / "ckpt_cut" / ".transe.pt.half.tmp").exists()
    assert report["resumed_from_epoch"] == 4
    _, full = embeddings(tiny, "full")
    _, resumed = embeddings(tiny, "cut")
    np.testing.assert_array_equal(full, resumed)


def test_more_epochs_continue_checkpoint(tiny):
    write_params(tiny / "params.yaml", model={"epochs": 6})
    run(tiny, "full", ckpt=False)
    write_params(tiny / "params.yaml", model={"epochs": 3})
    run(tiny, "grow")
    write_params(tiny / "params.yaml", model={"epochs": 6})
    assert run(tiny, "grow")["resumed_from_epoch"] == 3
    np.testing.assert_array_equal(embeddings(tiny, "full")[1], embeddings(tiny, "grow")[1])


def test_stale_checkpoint_is_not_resumed(tiny, caplog):
    run(tiny, "x")
    write_params(tiny / "params.yaml", model={"lr": 0.01})
    with caplog.at_level(logging.WARNING, logger="model.transe.training"):
        report = run(tiny, "x")
    assert report["resumed_from_epoch"] == 0
    assert "other params" in caplog.text
    run(tiny, "fresh", ckpt=False)
    np.testing.assert_array_equal(embeddings(tiny, "x")[1], embeddings(tiny, "fresh")[1])


def test_malformed_and_duplicate_rows_are_counted(tiny):
    rows = geo_triples() + [("Q1_2", "P17", "Q1"), ("", "P17", "Q3"), ("Q1", "  ", "Q3")]
    write_triples(tiny / "dirty.parquet", rows)
    report = run(tiny, ckpt=False, triples="dirty.parquet")
    assert report["malformed_skipped"] == 2
    assert report["duplicates_dropped"] == 1
    assert report["triples"] == len(geo_triples())


def test_bad_input(tiny):
    write_params(tiny / "bad.yaml", dimension=8)
    with pytest.raises(PipelineError, match=r"train_transe has unknown key\(s\) \['dimension'\]"):
        run(tiny, params="bad.yaml")
    write_params(tiny / "bad.yaml", model={"dimension": 8})
    with pytest.raises(PipelineError, match=r"train_transe.model has unknown key\(s\)"):
        run(tiny, params="bad.yaml")
    write_params(tiny / "bad.yaml", model={"p_norm": 3})
    with pytest.raises(PipelineError, match=r"train_transe.model.p_norm = 3"):
        run(tiny, params="bad.yaml")
    write_params(tiny / "bad.yaml", model={"chunk_size": 128})  # > batch_size 64
    with pytest.raises(PipelineError, match="chunk_size"):
        run(tiny, params="bad.yaml")
    write_params(tiny / "bad.yaml", checkpoint_every=0)
    with pytest.raises(PipelineError, match="train_transe.checkpoint_every = 0"):
        run(tiny, params="bad.yaml")
    write_params(tiny / "bad.yaml", heldout_fraction=0.5)
    with pytest.raises(PipelineError, match="train_transe.heldout_fraction = 0.5"):
        run(tiny, params="bad.yaml")
    with pytest.raises(PipelineError, match="does not exist"):
        run(tiny, triples="missing.parquet")
    write_triples(tiny / "empty.parquet", [("", "P1", "Q1")])
    with pytest.raises(PipelineError, match="no usable triples"):
        run(tiny, triples="empty.parquet")


@pytest.mark.parametrize("p", [1, 2])
def test_cross_distance_matches_cdist(p):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, generator=gen, dtype=torch.float64)
    y = torch.randn(3, 7, 8, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(cross_distance(x, y, p), torch.cdist(x, y, p=float(p)))


@pytest.mark.parametrize("p", [1, 2])
def test_filtered_ranks_against_brute_force(p):
    gen = torch.Generator().manual_seed(1)
    cfg = tiny_config(dim=4, p_norm=p, batch_size=1, chunk_size=1)
    model = TransE(12, 3, cfg, gen)
    known = torch.tensor(
        [[0, 0, 1], [0, 0, 2], [0, 0, 3], [4, 1, 3], [5, 1, 3], [6, 2, 7], [1, 2, 0]]
    )
    queries = known[[0, 3, 5]]
    got = filtered_ranks(model, queries, known, batch_size=2)

    ent, rel = model.entities.double(), model.relations.double()
    truth = {tuple(t) for t in known.tolist()}

    def dist(h, r, t):
        return float(torch.linalg.vector_norm(ent[h] + rel[r] - ent[t], ord=p))

    expected = []
    for side in ("tail", "head"):
        for h, r, t in queries.tolist():
            true = dist(h, r, t)
            worse = ties = 0
            for e in range(12):
                cand = (h, r, e) if side == "tail" else (e, r, t)
                if cand == (h, r, t) or cand in truth:
                    continue  # filtered
                d = dist(*cand)
                worse += d < true - 1e-9
                ties += abs(d - true) <= 1e-9
            expected.append(1 + worse + 0.5 * ties)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32))


def test_last_partial_batch_and_small_data():
    """Batches shorter than a chunk are padded, not dropped or crashing."""
    cfg = tiny_config(dim=8, batch_size=32, chunk_size=32, negatives=4, seed=0)
    gen = torch.Generator().manual_seed(0)
    model = TransE(10, 2, cfg, gen)
    triples = torch.tensor([[0, 0, 1], [1, 1, 2], [2, 0, 3]])
    loss = train_epoch(model, make_optimizer(model), triples, gen)
    assert np.isfinite(loss)
    assert torch.allclose(model.entities.norm(dim=1), torch.ones(10), atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_trains_on_cuda(tiny):
    write_params(tiny / "params.yaml", model={"epochs": 30}, device="auto")
    report = run(tiny, "gpu")
    assert report["device"] == "cuda"
    assert report["heldout_mrr"] > 0.5
    # A CUDA checkpoint resumes (tables and moments are stored on the CPU).
    write_params(tiny / "params.yaml", model={"epochs": 32}, device="auto")
    assert run(tiny, "gpu")["resumed_from_epoch"] == 30


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="chunk_size"):
        tiny_config(batch_size=8, chunk_size=16)

    def parse(**overrides):
        return parse_section(TransEConfig, {**TINY_MODEL, **overrides}, "train_transe.model")

    assert parse() == TINY_CONFIG
    with pytest.raises(PipelineError, match="train_transe.model.loss = 'softplus'"):
        parse(loss="softplus")
    with pytest.raises(PipelineError, match="train_transe.model.dim = 0"):
        parse(dim=0)
    with pytest.raises(PipelineError, match="train_transe.model.lr = 0"):
        parse(lr=0)
    with pytest.raises(PipelineError, match="chunk_size"):
        parse(batch_size=8, chunk_size=16)


def test_stage_params_read_nested_model(tiny):
    """The stage section holds TransE's config as a ``model`` subsection."""
    params = load_section(transe_training.TrainTransEParams, "train_transe", tiny / "params.yaml")
    assert params.model == TINY_CONFIG
    assert (params.device, params.threads, params.heldout_fraction) == ("cpu", 1, 0.1)


def random_graph_triples(entities: int = 3000, relations: int = 30, triples: int = 20000,
                         seed: int = 0) -> list[tuple[str, str, str]]:
    """A random multigraph large enough that torch splits its reductions across threads."""
    rng = np.random.default_rng(seed)
    h, t = rng.integers(0, entities, triples), rng.integers(0, entities, triples)
    r = rng.integers(0, relations, triples)
    return [(f"Q{a}", f"P{b}", f"Q{c}") for a, b, c in zip(h, r, t, strict=True)]


@pytest.mark.slow
def test_fresh_processes_give_identical_embeddings_with_one_or_two_threads_and_busy_with_one(
        tmp_path):
    """Bit-identical on one machine type: fresh processes with 2 threads and with 1 on an
    idle machine, and with 1 (params.yaml's) beside busy processes that keep every core
    spinning.

    Batches of 2048 positives x 64 negatives are big enough for torch to split the loss
    reductions and BLAS products across threads, so this would catch an order of
    summation that depends on the thread count or on the machine's load. Two threads on a
    busy machine are not held to it: one such run in a CI run differed in the last digits
    and passed when rerun (the split of the work can follow what the cores are doing),
    which is why the stage trains with one.
    """
    import subprocess
    import sys

    from tests.conftest import ROOT

    write_triples(tmp_path / "triples.parquet", random_graph_triples())
    model = {"dim": 64, "epochs": 2, "batch_size": 2048, "chunk_size": 128,
             "negatives": 64, "lr": 0.01}
    for threads in (1, 2):
        write_params(tmp_path / f"t{threads}.yaml", model=model, threads=threads,
                     heldout_fraction=0.0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_NUM_THREADS", None)

    def train(name: str, threads: int) -> np.ndarray:
        subprocess.run(
            [sys.executable, "-m", "stages.train_transe", "--triples",
             str(tmp_path / "triples.parquet"), "--out", str(tmp_path / f"{name}.parquet"),
             "--params", str(tmp_path / f"t{threads}.yaml")],
            cwd=ROOT, env=env, check=True, capture_output=True,
        )
        return embeddings(tmp_path, name, dim=model["dim"])[1]

    digests = {"a": train("a", 2), "b": train("b", 2), "c": train("c", 1)}
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(2 * (os.cpu_count() or 1))]
    try:
        digests["busy1"] = train("busy1", 1)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    for name in ("b", "c", "busy1"):
        np.testing.assert_array_equal(digests["a"], digests[name], err_msg=name)


def test_the_stage_trains_with_a_fixed_thread_count():
    """params.yaml names the threads: torch's default follows the cores, and a busy machine
    gave other bytes with it than an idle one."""
    from tests.conftest import project_params

    assert project_params()["train_transe"]["threads"] == 1


def test_checkpoint_of_other_code_is_not_resumed(tiny, monkeypatch, caplog):
    """A persisted checkpoint written by other TransE code is trained again, not reused.

    The committed features once came from such a checkpoint (``resumed_from_epoch`` equal
    to ``epochs``), so a fresh clone, which has none, computed other embeddings.
    """
    from pathlib import Path
    from types import SimpleNamespace

    import model.transe.model as transe_module

    first = run(tiny, "x")
    assert first["resumed_from_epoch"] == 0
    assert run(tiny, "x")["resumed_from_epoch"] == TINY_MODEL["epochs"]  # same code: reused
    edited = tiny / "transe_edited.py"
    edited.write_text(Path(transe_module.__file__).read_text() + "\n# a fix\n")
    monkeypatch.setattr(transe_training, "transe_code", SimpleNamespace(__file__=str(edited)),
                        raising=False)
    with caplog.at_level(logging.WARNING, logger="model.transe.training"):
        report = run(tiny, "x")
    assert report["resumed_from_epoch"] == 0
    assert "other code" in caplog.text
