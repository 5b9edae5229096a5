"""Tests for stages/headline.py: the few DVC metrics, and that `dvc exp show` views of them fit
a 200-column terminal as DVC prints them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from pipeline.errors import PipelineError
from stages import headline as hl

ROOT = Path(__file__).resolve().parents[2]


def accuracy(**rows):
    return {"b": rows}


def test_strongest_baseline_skips_regrab_variants_floor_and_zero_shot():
    metrics = accuracy(
        regrab={"5w1s": 70.0, "5w5s": 80.0, "5w0s": 50.0},
        regrab_no_prior={"5w1s": 99.0, "5w5s": 99.0},  # an ablation, not a baseline
        proto={"5w1s": 60.0, "5w5s": 81.0},
        proto_label={"5w1s": 65.0, "5w5s": 81.0, "5w0s": 45.0},
        floor={"5w1s": 98.0, "5w5s": 98.0},  # the untrained encoder
    )
    numbers, which = hl.headline("b", metrics)
    assert numbers == {"b": {"5w1s": 70.0, "5w5s": 80.0, "best": {"5w1s": 65.0, "5w5s": 81.0}}}
    # A tie goes to the method listed first; zero-shot settings are left out.
    assert which == {"5w1s": "proto_label", "5w5s": "proto"}


def test_transfer_columns_are_means_over_the_set_settings():
    metrics = accuracy(regrab={"5w1s": 70.0}, mtb={"5w1s": 60.0})
    transfer = {
        "semeval": {"b": {"regrab": {"5w1s": 40.0, "5w5s": 51.0},
                          "mtb": {"5w1s": 30.0, "5w5s": 61.0},
                          "proto": {"5w1s": 41.0, "5w5s": 45.0}, "floor": {"5w1s": 90.0}},
                    "other": {"regrab": {"5w1s": 1.0}}},
        "paired": {"semeval": {"b": {"regrab_minus_floor": {"5w1s": {"diff": 1.0}}}}},
        "ece": {}, "priors": {},
    }
    numbers, which = hl.headline("b", metrics, transfer)
    assert numbers["b"]["semeval"] == 45.5
    assert numbers["b"]["best"]["semeval"] == 45.5 and which["semeval"] == "mtb"
    assert list(numbers["b"]) == ["5w1s", "semeval", "best"]  # the column order of exp show


def test_stress_test_sets_and_zero_shot_settings_stay_out_of_the_headline():
    metrics = accuracy(regrab={"5w1s": 70.0}, mtb={"5w1s": 60.0})
    transfer = {
        "semeval": {"b": {"regrab": {"5w1s": 40.0, "5w0s": 10.0}, "mtb": {"5w1s": 30.0}}},
        "semeval_shuffled": {"b": {"regrab": {"5w1s": 20.0}, "mtb": {"5w1s": 30.0}}},
        "paired": {}, "vs_regrab": {}, "ece": {}, "priors": {},
        "shuffled": ["semeval_shuffled"],
    }
    numbers, _ = hl.headline("b", metrics, transfer)
    assert numbers["b"]["semeval"] == 40.0  # the zero-shot 10.0 is no part of the mean
    assert "semeval_shuffled" not in numbers["b"] and "shuffled" not in numbers["b"]


@pytest.mark.parametrize("metrics", [{}, {"b": {"proto": {"5w1s": 1.0}}},
                                     {"b": {"regrab": {"5w1s": 1.0}, "floor": {"5w1s": 1.0}}}])
def test_no_regrab_or_no_baseline_is_an_error(metrics):
    with pytest.raises(PipelineError, match="regrab"):
        hl.headline("b", metrics)


def committed(benchmark: str) -> dict:
    return json.loads((ROOT / "metrics" / f"{benchmark}.json").read_text())


@pytest.mark.parametrize("benchmark", ["nyt25", "fewrel"])
def test_headline_of_the_committed_metrics(benchmark, tmp_path):
    """REGRAB's numbers are copied as they are; best is the best baseline; a rerun writes the
    same bytes."""
    out = tmp_path / "h.json"
    argv = ["--benchmark", benchmark, "--metrics", str(ROOT / "metrics" / f"{benchmark}.json"),
            "--transfer", str(ROOT / "metrics" / "transfer.json"), "--out", str(out)]
    row = hl.main(argv)[benchmark]
    first = out.read_bytes()
    hl.main(argv)
    assert out.read_bytes() == first and json.loads(first) == {benchmark: row}
    table = committed(benchmark)[benchmark]
    settings = ["5w1s", "5w5s", "10w1s", "10w5s"]
    assert [row[s] for s in settings] == [table["regrab"][s] for s in settings]
    for s in settings:
        assert row["best"][s] == max(table[m][s] for m in table
                                     if m not in ("regrab", "regrab_no_prior", "floor"))
    assert set(row) == {*settings, "semeval", "best"}


def test_only_headline_files_are_dvc_metrics():
    """`dvc exp show` shows every declared metric: only the headline files are declared, and
    the full files stay outputs of their stages."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    declared = {name: [next(iter(m)) if isinstance(m, dict) else m
                       for m in stage.get("do", stage).get("metrics", [])]
                for name, stage in stages.items()}
    assert {k: v for k, v in declared.items() if v} == {
        "headline": ["metrics/${key}_headline.json"]}
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in stages["evaluate"]["do"]["outs"]]
    assert "metrics/${key}.json" in outs
    assert "metrics/transfer.json" in [next(iter(o)) if isinstance(o, dict) else o
                                       for o in stages["transfer"]["outs"]]


def exp_show_table(keep: str, width: int = 200) -> tuple[str, list[str]]:
    """``dvc exp show --drop '.*' --keep KEEP`` as DVC renders it, for the workspace and an
    experiment row, with the committed headline numbers and params.yaml values; and the names
    of the columns kept."""
    from dvc.commands.experiments.show import show_experiments
    from dvc.compare import TabularData
    from dvc.ui import ui
    from dvc.utils.flatten import flatten

    transfer = json.loads((ROOT / "metrics" / "transfer.json").read_text())
    cells: dict[str, str] = {}
    for benchmark in ("nyt25", "fewrel"):
        numbers, _ = hl.headline(benchmark, committed(benchmark), transfer)
        cells.update({k: str(v) for k, v in flatten(numbers).items()})
    metrics = list(cells)
    params = flatten(yaml.safe_load((ROOT / "params.yaml").read_text()))
    cells.update({k: str(v) for k, v in params.items()})
    pattern = re.compile(keep)
    kept = [c for c in cells if pattern.match(c)]
    td = TabularData(["Experiment", "rev", "typ", "Created", "parent", "State", "Executor",
                      *kept], fill_value="-")
    for name, rev, typ, created in [("", "workspace", "baseline", "-"),
                                    ("gpu-mpnet", "a1b2c3d", "branch_commit", "Nov 27, 2026")]:
        td.append([name, rev, typ, created, "", None, None, *(cells[c] for c in kept)])
    console = ui.rich_console
    enabled, old_width = ui._enabled, console.width
    ui.enable()
    console.width = width
    try:
        with console.capture() as captured:
            show_experiments(td, {"metrics": [c for c in kept if c in metrics],
                                  "params": [c for c in kept if c not in metrics], "deps": []},
                             pager=False)
    finally:
        ui._enabled, console.width = enabled, old_width
    return captured.get(), kept


@pytest.mark.parametrize("view", list(hl.VIEWS))
def test_exp_show_views_fit_200_columns(view):
    table, kept = exp_show_table(hl.VIEWS[view])
    assert max(map(len, table.splitlines())) <= 200
    assert "…" not in table  # no column collapsed or cut
    assert "a1b2c3d [gpu-mpnet]" in table
    assert len(kept) >= 6 and all(column in table for column in kept)


def test_every_headline_column_is_in_a_view_and_the_renderer_does_collapse():
    """The views together show every headline column; and the check above can fail: all of
    them at once do not fit 200 columns."""
    columns = []
    for benchmark in ("nyt25", "fewrel"):
        numbers, _ = hl.headline(benchmark, committed(benchmark))
        columns += [f"{benchmark}.{k}" for k in numbers[benchmark] if k != "best"]
        columns += [f"{benchmark}.best.{k}" for k in numbers[benchmark]["best"]]
    columns += ["nyt25.semeval", "fewrel.semeval", "nyt25.best.semeval", "fewrel.best.semeval"]
    views = [re.compile(v) for v in hl.VIEWS.values()]
    assert all(any(v.match(c) for v in views) for c in columns)
    assert "…" in exp_show_table(r"Experiment|Created|(nyt25|fewrel)[.]")[0]
