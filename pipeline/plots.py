"""Report plots: accuracy bars and reliability diagrams, one colour per method in every plot.

``stages/evaluate.py`` draws them from a report (:func:`pipeline.report.summarise`).
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.io import atomic_path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)


#: One colour per method family, the same in every plot: REGRAB and its ablation blue, the
#: prototype methods green, the optimisation-based meta-learners orange and red, the heads
#: with networks of their own purple, pink and olive, MTB brown, the floor grey. A method
#: missing here gets a colour of its own from :data:`OTHER_COLOURS` by its name.
METHOD_COLOURS = {
    "regrab": "#1f4e9c", "regrab_no_prior": "#8fb3e6",
    "proto": "#2e8b57", "proto_label": "#98d8a8",
    "maml": "#e07b00", "bmaml": "#ffbb66", "versa": "#c0392b",
    "gnn": "#7b3fa0", "snail": "#e377c2", "pair": "#9a9a1f",
    "mtb": "#8c564b", "floor": "#9e9e9e",
}
OTHER_COLOURS = ("#17becf", "#000000", "#f1c40f", "#5d6d7e", "#a04000", "#48c9b0")
#: The method the plots draw first and mark (hatched bars, "(ours)" in the legend).
OURS = "regrab"


def method_colour(method: str) -> str:
    """The method's colour in every plot (a stable pick by name for a method not listed)."""
    if method in METHOD_COLOURS:
        return METHOD_COLOURS[method]
    return OTHER_COLOURS[zlib.crc32(method.encode()) % len(OTHER_COLOURS)]


def plot_order(methods: list[str]) -> list[str]:
    """REGRAB first, then the others in their report order."""
    return sorted(methods, key=lambda m: m != OURS)


def plot_accuracy(report: dict[str, Any], settings: list[str], path: Path, title: str) -> None:
    """Grouped bar chart, methods x settings, with the t 95% interval over splits.

    REGRAB's bars come first in each group, hatched; the legend stands right of the axes, so
    it covers no bar.
    """
    plt = _pyplot()
    acc = report["accuracy"]
    methods = plot_order(list(acc))
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(figsize=(1.4 * len(settings) + 4, 4))
    x = np.arange(len(settings))
    for i, m in enumerate(methods):
        row = acc[m]
        mean = [row[s]["mean"] if s in row else np.nan for s in settings]
        ci = [(row[s]["ci95"] or 0.0) if s in row else 0.0 for s in settings]
        ours = m == OURS
        ax.bar(x + (i - (len(methods) - 1) / 2) * width, mean, width, yerr=ci, capsize=2,
               label=f"{m} (ours)" if ours else m, color=method_colour(m),
               edgecolor="black" if ours else "none", linewidth=0.8 if ours else 0,
               hatch="//" if ours else None)
    ax.set_xticks(x, settings)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"{title}, mean over {len(report['splits'])} splits (t 95% CI)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def plot_reliability(report: dict[str, Any], methods: list[str], settings: list[str],
                     path: Path) -> None:
    """Reliability diagrams, one panel per method (rows) and setting (columns)."""
    plt = _pyplot()
    cal = report["calibration"]
    methods = plot_order([m for m in methods if m in cal]) or ["-"]
    fig, axes = plt.subplots(len(methods), len(settings), squeeze=False,
                             figsize=(2.2 * len(settings) + 0.5, 2.2 * len(methods) + 0.5),
                             sharex=True, sharey=True)
    for i, m in enumerate(methods):
        for j, s in enumerate(settings):
            ax = axes[i][j]
            ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle="--")
            cell = cal.get(m, {}).get(s)
            if cell is not None:
                bins = cell["bins"]
                k = len(bins["count"])
                centers = (np.arange(k) + 0.5) / k
                used = np.asarray(bins["count"]) > 0
                ax.bar(centers[used], np.asarray(bins["accuracy"])[used], 1 / k,
                       color=method_colour(m), edgecolor="black", linewidth=0.3)
                if cell["ece"]["mean"] is not None:
                    ax.text(0.04, 0.9, f"ECE {cell['ece']['mean']:.1f}", fontsize=7)
            if i == 0:
                ax.set_title(s, fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{m}\naccuracy", fontsize=8)
            if i == len(methods) - 1:
                ax.set_xlabel("confidence", fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
