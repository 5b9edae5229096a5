"""The summary, table and plot data of the ``active_labelling`` stage, from its accuracies.

Inputs are plain numbers: per set, method and split, the query accuracy of every episode and
strategy after every label (what the simulation returns). As everywhere in the reports
(:mod:`pipeline.report`), the unit of replication is the split: each curve point is the mean
of the per-split means with a Student-t 95% interval over splits, and a comparison of two
strategies is paired (both label on the same episodes), so its interval is that of the
per-split differences.

Shapes:
    T = L + 1 accuracy points (before the first label and after each), B episodes,
    A strategies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipeline import plots, report

#: The strategy every other one is compared with.
FLOOR = "random"
#: The method and strategy the bar is about.
BAR = ("regrab", "bald")


def labels_axis(start: int, ways: int, labels: int) -> list[float]:
    """Labelled sentences per relation at each accuracy point: ``start``, then one more
    sentence in ``ways`` relations at a time, up to ``start + labels``."""
    return [round(start + t / ways, 6) for t in range(labels * ways + 1)]


def _round(values: Sequence[float | None]) -> list[float | None]:
    return [None if v is None or math.isnan(v) else round(float(v), 2) for v in values]


def _curve(per_split: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Mean and t interval over splits at every point of per-split curves (T,)."""
    points = [report.interval([c[t] for c in per_split.values()])
              for t in range(len(next(iter(per_split.values()))))]
    return {"accuracy": _round([p["mean"] for p in points]),
            "ci95": _round([p["ci95"] for p in points]),
            "per_split": {s: _round(list(c)) for s, c in per_split.items()}}


def _paired(diffs: Mapping[str, float]) -> dict[str, Any]:
    """A paired difference: its mean and t interval over splits, and each split's value."""
    out = report.interval(diffs.values())
    return {"diff": _round([out["mean"]])[0], "ci95": _round([out["ci95"]])[0],
            "per_split": {s: round(float(d), 2) for s, d in diffs.items()}}


def summarise(acc: Mapping[str, Mapping[str, Mapping[str, np.ndarray]]],
              strategies: Mapping[str, Sequence[str]], axis: Sequence[float],
              bar_labels: int) -> dict[str, Any]:
    """The stage's JSON: curves, gains over random and the bar.

    Args:
        acc: ``{set: {method: {split: accuracy}}}``, each accuracy a fraction, (T, B, A) with
            the method's ``strategies`` in order along A.
        strategies: each method's strategies.
        axis: labels per relation at each point (:func:`labels_axis`).
        bar_labels: labels per relation at which REGRAB+BALD is read for the bar.

    Returns:
        ``labels_per_relation``; per set ``{method: {strategy: {accuracy, ci95, per_split,
        minus_random}}}`` (accuracy in percent at every point; ``minus_random``: the paired
        difference with random averaged over the curve, in points); and ``bar``: per set,
        REGRAB+BALD at ``bar_labels`` minus random at the last point, paired per split.
    """
    out: dict[str, Any] = {"labels_per_relation": list(axis)}
    bar: dict[str, Any] = {}
    at = int(np.argmin(np.abs(np.asarray(axis) - bar_labels)))
    for name, methods in acc.items():
        block: dict[str, Any] = {}
        for method, by_split in methods.items():
            names = list(strategies[method])
            curves = {s: {split: a[:, :, j].mean(1) * 100 for split, a in by_split.items()}
                      for j, s in enumerate(names)}
            block[method] = {s: _curve(c) for s, c in curves.items()}
            if FLOOR in curves:
                for s, c in curves.items():
                    if s != FLOOR:
                        block[method][s]["minus_random"] = _paired(
                            {k: float((c[k] - curves[FLOOR][k]).mean()) for k in c})
            if (method, BAR[1]) == BAR and BAR[1] in curves and FLOOR in curves:
                diffs = {k: float(curves[BAR[1]][k][at] - curves[FLOOR][k][-1])
                         for k in curves[FLOOR]}
                bar[name] = {"bald_labels": axis[at], "random_labels": axis[-1],
                             "bald": block[method][BAR[1]]["accuracy"][at],
                             "random": block[method][FLOOR]["accuracy"][-1],
                             **_paired(diffs)}
        out[name] = block
    out["bar"] = bar
    return out


def _pm(mean: float | None, ci: float | None, signed: bool = False) -> str:
    if mean is None:
        return "–"
    text = f"{mean:+.1f}" if signed else f"{mean:.1f}"
    return text + (f" ± {ci:.1f}" if ci is not None else "")


def markdown(summary: Mapping[str, Any], titles: Mapping[str, str], note: str) -> str:
    """One table per set: accuracy at every whole number of labels per relation, and the
    paired gain over random averaged over the curve; then the bar."""
    axis = summary["labels_per_relation"]
    whole = [i for i, x in enumerate(axis) if float(x).is_integer()]
    header = ["method", "strategy", *(f"{axis[i]:g} / rel" for i in whole),
              "minus random (curve mean)"]
    parts = [note, ""]
    for name, title in titles.items():
        rows = []
        for method, by_strategy in summary[name].items():
            for s, c in by_strategy.items():
                gain = c.get("minus_random")
                rows.append([method, s, *(_pm(c["accuracy"][i], c["ci95"][i]) for i in whole),
                             "–" if gain is None else _pm(gain["diff"], gain["ci95"], True)])
        parts += [f"## {title}", "", "| " + " | ".join(header) + " |",
                  "|---|---|" + "---:|" * (len(header) - 2),
                  *("| " + " | ".join(r) + " |" for r in rows), ""]
        bar = summary["bar"].get(name)
        if bar is not None:
            parts += [f"The bar: REGRAB+BALD with {bar['bald_labels']:g} labels per relation "
                      f"({_pm(bar['bald'], None)}) minus random with "
                      f"{bar['random_labels']:g} ({_pm(bar['random'], None)}): "
                      f"{_pm(bar['diff'], bar['ci95'], True)} points (paired per split, "
                      "t 95% CI).", ""]
    return "\n".join(parts)


def curves_csv(summary: Mapping[str, Any], sets: Sequence[str]) -> str:
    """Accuracy (%) against labels per relation, one column ``<set>_<method>_<strategy>``
    per curve (a DVC plot)."""
    curves = {f"{name}_{m}_{s}": c["accuracy"] for name in sets
              for m, row in summary[name].items() for s, c in row.items()}
    lines = [",".join(["labels_per_relation", *curves])]
    for i, x in enumerate(summary["labels_per_relation"]):
        lines.append(",".join([f"{x:g}", *("" if c[i] is None else f"{c[i]:.2f}"
                                           for c in curves.values())]))
    return "\n".join(lines) + "\n"


def plot_curves(summary: Mapping[str, Any], sets: Mapping[str, str], path: Any) -> None:
    """Accuracy against labels per relation, one panel per set: each method in its own
    colour, ``random`` solid and BALD (or, for a head without posterior samples, its first
    other strategy) dashed, with the t 95% band over splits (a PNG)."""
    plt = plots._pyplot()
    axis = np.asarray(summary["labels_per_relation"], dtype=float)
    fig, axes = plt.subplots(1, len(sets), figsize=(5.2 * len(sets), 3.8), squeeze=False)
    for ax, (name, title) in zip(axes[0], sets.items(), strict=True):
        for method, by_strategy in summary[name].items():
            colour = plots.method_colour(method)
            active = BAR[1] if BAR[1] in by_strategy else next(
                (s for s in by_strategy if s != FLOOR), None)
            for strategy, style in ((FLOOR, "-"), (active, "--")):
                if strategy not in by_strategy:
                    continue
                c = by_strategy[strategy]
                y = np.array([np.nan if v is None else v for v in c["accuracy"]], dtype=float)
                ci = np.array([0.0 if v is None else v for v in c["ci95"]], dtype=float)
                ax.plot(axis, y, style, color=colour, label=f"{method} {strategy}")
                ax.fill_between(axis, y - ci, y + ci, color=colour, alpha=0.07, linewidth=0)
        ax.set_title(title[:60], fontsize=9)
        ax.set_xlabel("labelled sentences per relation")
        ax.set_ylabel("accuracy %")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    plots._save(fig, path)
    plt.close(fig)
