"""Stage active_labelling on a toy benchmark: two splits of tiny trained models, their test
relations and a transfer set of another domain."""

import csv
import json
import re

import pyarrow as pa
import pytest
import yaml

from pipeline.errors import PipelineError
from pipeline.io import write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA
from stages import active_labelling, train
from tests.conftest import project_params
from tests.model.tiny_regrab import labels_of, toy_project, toy_table, toy_train_sections

SECTION = {"benchmark": "toy", "transfer_sets": ["other"],
           "methods": {"regrab": ["bald", "entropy", "margin", "random"],
                       "proto": ["entropy", "random"]},
           "ways": 2, "start": 1, "pool": 4, "queries": 3, "labels": 2, "episodes": 3,
           "bar_labels": 2, "seed": 0, "device": "cpu", "threads": 1, "workers": 1,
           "encode_batch": 16}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("active_labelling")
    enc, splits, graph, features = toy_project(root, n_splits=2)
    rows = toy_table(["P6", "P7", "P8"], 9, seed=5).to_pylist()
    for row in rows:  # another domain's keys, none of them in the graph
        row["relation"] = row["relation_name"] = f"verb{row['relation'][1:]}_of"
    other = root / "other.parquet"
    write_parquet(pa.Table.from_pylist(rows, schema=FEWSHOT_SCHEMA), other, FEWSHOT_SCHEMA)
    params = project_params(**{
        **toy_train_sections(enc),
        "benchmarks": {"toy": {"splits": str(splits), "title": "toy test relations"}},
        "transfer": {"sets": {"other": {"data": str(other), "title": "another domain"}},
                     "per_relation": 0},
        "active_labelling": SECTION,
    })
    params["transfer"]["sets"] = {"other": params["transfer"]["sets"]["other"]}
    p = root / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    train.main(["--splits", str(splits), "--graph", str(graph), "--features", str(features),
                "--relations", str(labels_of(graph)), "--out", str(root / "models" / "toy"),
                "--params", str(p)])
    return root, params


def _run(root, params, name="out", **section):
    p = root / f"{name}.yaml"
    p.write_text(yaml.safe_dump({**params, "active_labelling": {**SECTION, **section}},
                                sort_keys=False))
    out = root / name
    active_labelling.main(["--models", str(root / "models"), "--metrics",
                           str(out / "active.json"), "--table", str(out / "active.md"),
                           "--plot", str(out / "active.csv"), "--params", str(p)])
    return out


def test_curves_gains_and_the_bar_for_every_set_method_and_strategy(project):
    root, params = project
    out = _run(root, params)
    summary = json.loads((out / "active.json").read_text())
    assert summary["labels_per_relation"] == [1, 1.5, 2, 2.5, 3]
    assert summary["protocol"]["splits"] == ["split_0", "split_1"]
    for name in ("toy", "other"):
        assert list(summary[name]) == ["regrab", "proto"]
        assert list(summary[name]["regrab"]) == ["bald", "entropy", "margin", "random"]
        for row in summary[name].values():
            for strategy, c in row.items():
                assert len(c["accuracy"]) == 5 and all(0 <= a <= 100 for a in c["accuracy"])
                assert all(ci is not None for ci in c["ci95"])  # two splits
                assert set(c["per_split"]) == {"split_0", "split_1"}
                assert ("minus_random" in c) == (strategy != "random")
        # proto is deterministic: before the first label its strategies agree exactly.
        proto = summary[name]["proto"]
        assert proto["entropy"]["per_split"] == {
            s: [v[0], *proto["entropy"]["per_split"][s][1:]]
            for s, v in proto["random"]["per_split"].items()}
        bar = summary["bar"][name]
        assert bar["bald_labels"] == 2 and bar["random_labels"] == 3
        bald, rand = summary[name]["regrab"]["bald"], summary[name]["regrab"]["random"]
        for split, d in bar["per_split"].items():
            assert d == pytest.approx(bald["per_split"][split][2]
                                      - rand["per_split"][split][-1], abs=0.02)
        assert bar["diff"] == pytest.approx(sum(bar["per_split"].values()) / 2, abs=0.02)
    table = (out / "active.md").read_text()
    assert "## toy test relations" in table and "## another domain" in table
    assert table.count("The bar: REGRAB+BALD with 2 labels per relation") == 2
    with (out / "active.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["labels_per_relation"] for r in rows] == ["1", "1.5", "2", "2.5", "3"]
    assert float(rows[0]["other_proto_random"]) == summary["other"]["proto"]["random"][
        "accuracy"][0]
    # The same numbers whatever the number of worker processes.
    again = _run(root, params, "two_workers", workers=2)
    assert json.loads((again / "active.json").read_text()) == summary


def test_bald_for_a_method_without_samples_names_the_params_key(project):
    root, params = project
    with pytest.raises(PipelineError, match="drop it from active_labelling.methods.proto"):
        _run(root, params, "bad", methods={"proto": ["bald"]})
    assert not (root / "bad" / "active.json").exists()


@pytest.mark.parametrize("section, expected", [
    ({"bar_labels": 9}, "bar_labels 9 is not reached"),
    ({"labels": 5}, "labels 5 exceeds the pool"),
    ({"methods": {"regrab": ["bald", "bald"]}}, "at most once"),
    ({"transfer_sets": ["nowhere"]}, "names 'nowhere', not in transfer.sets"),
    ({"pool": 8, "queries": 4, "transfer_sets": []},
     "split_0 test split: relation P6 has 12 sentences, fewer than active_labelling start + "
     "pool + queries = 13"),
    ({"pool": 6, "queries": 4}, "transfer set other has 0 relations with at least start + "
                                "pool + queries = 11 sentences"),
])
def test_bad_params_are_one_line(project, section, expected):
    root, params = project
    with pytest.raises(PipelineError, match=re.escape(expected)):
        _run(root, params, "bad_params", **section)


def test_a_job_checks_its_split_without_reading_the_split_folder(project, tmp_path):
    """A job on a Dask worker gets its checkpoints, not the split folder: the split's digests
    travel in the job, so a worker without the folder still checks, and a wrong split is
    still refused."""
    import argparse
    import dataclasses

    from model.predict.config import ActiveLabellingParams
    from pipeline.config import load_section

    root, params = project
    p = root / "digests.yaml"
    p.write_text(yaml.safe_dump({**params, "active_labelling": SECTION}, sort_keys=False))
    section = load_section(ActiveLabellingParams, "active_labelling", p)
    jobs, _ = active_labelling.plan(argparse.Namespace(models=root / "models", params=p,
                                                       relations=None), section)
    job = next(job for job in jobs if job.set.split_dir is not None)
    cache, tokens = active_labelling.fill_cache(jobs, section, "cpu")
    splits = job.set.split_dir.parent
    moved = tmp_path / "elsewhere"
    splits.rename(moved)  # as on a worker that has no clone
    try:
        result = active_labelling.label_set(job, section, "cpu", cache, tokens)
        assert set(result) == set(SECTION["methods"])
        wrong = dataclasses.replace(job.set, split_digests={"train": "0" * 64, "val": None})
        with pytest.raises(PipelineError, match="was trained on another split"):
            active_labelling.label_set(dataclasses.replace(job, set=wrong), section, "cpu",
                                       cache, tokens)
    finally:
        moved.rename(splits)
