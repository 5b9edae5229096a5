import csv
import json
import math

import numpy as np
import pytest

from pipeline import plots, report


@pytest.mark.parametrize("df,value", [(1, 12.7062047), (2, 4.3026527), (4, 2.7764451),
                                      (9, 2.2621572), (30, 2.0422725)])
def test_t_quantile_matches_tables(df, value):
    assert report.t_quantile(0.975, df) == pytest.approx(value, abs=1e-6)


def test_t_quantile_tends_to_the_normal():
    assert report.t_quantile(0.975, 100000) == pytest.approx(1.959964, abs=1e-4)


def test_interval_over_splits_against_numpy():
    v = np.array([66.2, 70.1, 58.3, 61.0, 75.4])
    iv = report.interval(v)
    assert iv["mean"] == pytest.approx(v.mean())
    assert iv["ci95"] == pytest.approx(2.7764451 * np.std(v, ddof=1) / math.sqrt(5), rel=1e-6)
    assert iv["n_splits"] == 5
    assert report.interval([3.0])["ci95"] is None
    assert report.interval([])["mean"] is None


def _cell(acc, ece=5.0):
    episodes = np.asarray(acc, dtype=np.float64)
    return {"episodes": episodes, "ece": ece, "aurc": 10.0,
            "curve": np.full(len(report.COVERAGES), episodes.mean() * 100),
            "bins": {"count": np.array([1, 1]), "confidence": np.array([0.3, 0.9]),
                     "correct": np.array([0.0, 1.0])}}


def _per_split():
    rng = np.random.default_rng(0)
    out = {}
    for i in range(4):
        reg = rng.random(20)
        out[f"split_{i}"] = {
            "regrab": {"5w1s": _cell(reg), "5w0s": _cell(rng.random(20))},
            "mtb": {"5w1s": _cell(np.clip(reg + rng.normal(0, 0.2, 20), 0, 1), ece=7.0 + i)},
        }
    return out


def test_paired_differences_against_numpy():
    per_split = _per_split()
    summary = report.summarise(per_split, {})
    means = {m: np.array([per_split[s][m]["5w1s"]["episodes"].mean() * 100
                          for s in per_split]) for m in ("regrab", "mtb")}
    diff = means["mtb"] - means["regrab"]
    cell = summary["paired"]["mtb_minus_regrab"]["5w1s"]
    assert cell["diff"] == pytest.approx(diff.mean())
    assert cell["ci95"] == pytest.approx(
        report.t_quantile(0.975, 3) * diff.std(ddof=1) / 2, rel=1e-9)
    assert cell["wins"] == int((diff > 0).sum()) and cell["n_splits"] == 4
    assert "5w0s" not in cell  # no zero-shot mtb
    acc = summary["accuracy"]["regrab"]["5w1s"]
    assert acc["mean"] == pytest.approx(means["regrab"].mean())
    pooled = np.concatenate([per_split[s]["regrab"]["5w1s"]["episodes"] for s in per_split])
    assert acc["pooled_ci95"] == pytest.approx(1.96 * pooled.std(ddof=1) / math.sqrt(80) * 100)
    ece = summary["calibration"]["mtb"]["5w1s"]["ece"]
    assert ece["mean"] == pytest.approx(8.5) and ece["n_splits"] == 4
    bins = summary["calibration"]["mtb"]["5w1s"]["bins"]  # summed over 4 splits
    assert bins["count"] == [4, 4] and bins["accuracy"] == [0.0, 1.0]
    assert bins["confidence"] == pytest.approx([0.3, 0.9])


def test_a_method_on_fewer_episodes_is_paired_on_those_episodes():
    per_split = _per_split()
    for s in ("split_0", "split_2"):  # scored on the first 8 of 20 episodes, on 2 splits
        per_split[s]["gnn"] = {"5w1s": _cell(np.random.default_rng(1).random(8))}
    summary = report.summarise(per_split, {})
    cell = summary["paired"]["gnn_minus_regrab"]["5w1s"]
    expected = {s: (per_split[s]["gnn"]["5w1s"]["episodes"].mean()
                    - per_split[s]["regrab"]["5w1s"]["episodes"][:8].mean()) * 100
                for s in ("split_0", "split_2")}
    assert cell["per_split"] == pytest.approx(expected) and cell["n_splits"] == 2
    assert summary["accuracy"]["gnn"]["5w1s"]["episodes"] == 16
    md = report.markdown_report(summary, ["5w1s"], "")
    assert "gnn (2 split(s), 8 episodes per setting and split)" in md


def test_headline_metrics_are_a_flat_scannable_table(tmp_path):
    nota = {f"split_{i}": {"regrab": {"5w1s_r15": {"acc": 60.0 + i, "threshold": 0.5,
                                                   "abstained": 0.2}}} for i in range(4)}
    summary = report.summarise(_per_split(), nota)
    metrics = report.headline_metrics(summary, "nyt25", ("regrab", "mtb"))
    assert list(metrics) == ["nyt25", "paired", "ece", "nota"]
    assert set(metrics["nyt25"]["regrab"]) == {"5w1s", "5w0s"}
    assert isinstance(metrics["nyt25"]["mtb"]["5w1s"], float)  # accuracy only, no ci95 beside it
    assert set(metrics["paired"]["mtb_minus_regrab"]["5w1s"]) == {"diff", "ci95"}
    assert metrics["nota"]["regrab"]["5w1s_r15"] == pytest.approx(61.5)
    path = tmp_path / "m.json"
    report.write_json_ordered(metrics, path)
    assert list(json.loads(path.read_text())) == ["nyt25", "paired", "ece", "nota"]
    report.write_json_ordered({"a": float("nan"), "b": np.float32(1.5)}, path)
    assert json.loads(path.read_text()) == {"a": None, "b": 1.5}


def test_markdown_plots_and_selective_csv(tmp_path):
    summary = report.summarise(_per_split(), {})
    md = report.markdown_report(summary, ["5w1s", "5w0s"], "note")
    assert "mean over 4 split(s) ± t 95% CI" in md and "| mtb_minus_regrab |" in md
    assert "Pooled-episode 95% CI" in md and "| regrab | 5w1s |" in md
    plots.plot_accuracy(summary, ["5w1s", "5w0s"], tmp_path / "a.png", "NYT-25")
    plots.plot_reliability(summary, ["regrab", "mtb"], ["5w1s", "5w0s"], tmp_path / "r.png")
    for name in ("a.png", "r.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    report.write_selective_csv(summary, tmp_path / "s.csv")
    rows = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert len(rows) == 100 and rows[-1]["coverage"] == "1.00"
    assert set(rows[0]) == {"coverage", "regrab_5w1s", "mtb_5w1s", "regrab_5w0s"}


def test_every_method_keeps_one_colour_of_its_own_and_regrab_comes_first():
    methods = ["regrab", "regrab_no_prior", "mtb", "proto", "proto_label", "maml", "versa",
               "bmaml", "gnn", "snail", "pair", "floor"]
    colours = [plots.method_colour(m) for m in methods]
    assert len(set(colours)) == len(methods)  # regrab/pair and regrab_no_prior/floor apart
    assert plots.method_colour("new_method") == plots.method_colour("new_method")
    assert plots.method_colour("new_method") not in colours
    assert plots.plot_order(["floor", "proto", "regrab", "mtb"]) == [
        "regrab", "floor", "proto", "mtb"]


def test_the_accuracy_legend_stands_beside_the_bars(tmp_path, monkeypatch):
    """The legend lies right of the axes, so it covers no bar; REGRAB's bars are hatched."""
    figures = []
    plt = plots._pyplot()
    monkeypatch.setattr(plt, "close", figures.append)
    summary = {"splits": ["split_0"], "accuracy": {
        m: {"5w1s": {"mean": 90.0, "ci95": 1.0}} for m in ("proto", "regrab", "floor")}}
    plots.plot_accuracy(summary, ["5w1s"], tmp_path / "a.png", "NYT-25")
    fig = figures[0]
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.x0 >= ax.get_window_extent(renderer).x1
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["regrab (ours)", "proto", "floor"]
    assert ax.patches[0].get_hatch() == "//"
    plt.close(fig)
