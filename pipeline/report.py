"""Evaluation summaries: intervals over splits, paired comparisons, tables and plots.

The unit of replication is the split (each has its own test relations), so every headline
interval is over splits: the mean of the per-split means with a Student-t 95% interval on
``n_splits - 1`` degrees of freedom. The interval that pools every episode of every split
ignores how much the splits differ and is kept as a secondary number only. A comparison of
two methods is paired: both see the same episodes on every split, so the interval is that of
the per-split differences.

Inputs are plain numbers per split (see :func:`summarise`); nothing here runs a model.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.io import atomic_path

#: Method every other method is compared with.
REFERENCE = "regrab"
#: Coverages of the selective-prediction curve (1%, 2%, ..., 100%).
COVERAGES = np.round(np.arange(1, 101) / 100, 2)


def t_quantile(p: float, df: int) -> float:
    """Quantile ``p`` (in (0.5, 1)) of Student's t with ``df`` degrees of freedom.

    Bisection on the CDF, integrated with Simpson's rule (no SciPy): exact to ~1e-9 for
    the small ``df`` of a handful of splits.
    """
    if df < 1 or not 0.5 < p < 1:
        raise ValueError(f"t_quantile needs df >= 1 and 0.5 < p < 1 (got {df}, {p})")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(t: float) -> float:
        x = np.linspace(0.0, t, 4001)
        pdf = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
        h = t / 4000
        return 0.5 + h / 3 * (pdf[0] + pdf[-1] + 4 * pdf[1:-1:2].sum() + 2 * pdf[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def interval(values: Any) -> dict[str, Any]:
    """Mean and t-based 95% half-width of per-split values (``ci95`` None for one split)."""
    v = np.asarray(list(values), dtype=np.float64)
    v = v[~np.isnan(v)]
    n = len(v)
    if n == 0:
        return {"mean": None, "ci95": None, "n_splits": 0}
    ci = t_quantile(0.975, n - 1) * v.std(ddof=1) / math.sqrt(n) if n > 1 else None
    return {"mean": float(v.mean()), "ci95": None if ci is None else float(ci), "n_splits": n}


def normal_ci95(values: Any) -> float:
    """Normal 95% half-width of the mean of ``values``, ``1.96 sd / sqrt(n)`` (NaN for n < 2).

    The one normal interval of the project: pooled episodes, paired episode differences and
    ``regrab-fewrel-test``'s accuracy (each caller scales it to percent itself).
    """
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return float("nan")
    return float(1.96 * v.std(ddof=1) / math.sqrt(len(v)))


def pooled_ci95(episode_acc: list[np.ndarray]) -> float | None:
    """Normal 95% half-width (percent) over every episode of every split pooled together."""
    acc = np.concatenate(episode_acc) if episode_acc else np.zeros(0)
    if len(acc) < 2:
        return None
    return float(normal_ci95(acc) * 100)


def summarise(per_split: dict[str, dict[str, dict[str, dict[str, Any]]]],
              nota: dict[str, dict[str, dict[str, dict[str, float]]]]) -> dict[str, Any]:
    """The full report from per-split cells.

    Args:
        per_split: ``{split: {method: {setting: cell}}}``; a cell has ``episodes`` (per-episode
            accuracy, fraction), ``ece``, ``aurc`` (percent), ``curve`` (selective accuracy at
            :data:`COVERAGES`, percent) and ``bins``
            (the evaluation's reliability bins).
        nota: ``{split: {method: {"{setting}_r{pct}": {"acc", "threshold", "abstained"}}}}``.

    Returns:
        ``accuracy``, ``paired``, ``calibration``, ``selective`` and ``nota`` sections, each
        with the interval over splits and the per-split values.
    """
    splits = list(per_split)
    cells: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for split, methods in per_split.items():
        for method, settings in methods.items():
            for setting, cell in settings.items():
                cells.setdefault(method, {}).setdefault(setting, {})[split] = cell
    # A method scored on later splits only (the comparison's) still comes before the floor.
    cells = dict(sorted(cells.items(), key=lambda item: item[0] == "floor"))
    accuracy, calibration, selective = {}, {}, {}
    for method, settings in cells.items():
        accuracy[method], calibration[method] = {}, {}
        for setting, by_split in settings.items():
            means = {s: float(c["episodes"].mean() * 100) for s, c in by_split.items()}
            accuracy[method][setting] = {
                **interval(means.values()), "per_split": means,
                "pooled_ci95": pooled_ci95([c["episodes"] for c in by_split.values()]),
                "episodes": int(sum(len(c["episodes"]) for c in by_split.values()))}
            bins = {k: sum(np.asarray(c["bins"][k]) for c in by_split.values())
                    for k in ("count", "confidence", "correct")}
            count = np.maximum(bins["count"], 1)
            calibration[method][setting] = {
                "ece": {**interval(c["ece"] for c in by_split.values()),
                        "per_split": {s: c["ece"] for s, c in by_split.items()}},
                "aurc": {**interval(c["aurc"] for c in by_split.values()),
                         "per_split": {s: c["aurc"] for s, c in by_split.items()}},
                **({"ece_ts": {**interval(c["ece_ts"] for c in by_split.values()),
                               "per_split": {s: c["ece_ts"] for s, c in by_split.items()},
                               "temperature": {s: c["temperature"]
                                               for s, c in by_split.items()}}}
                   if all("ece_ts" in c for c in by_split.values()) else {}),
                "bins": {"count": bins["count"].tolist(),
                         "confidence": (bins["confidence"] / count).tolist(),
                         "accuracy": (bins["correct"] / count).tolist()}}
            selective.setdefault(setting, {})[method] = np.mean(
                [c["curve"] for c in by_split.values()], axis=0).tolist()
    return {"splits": splits, "accuracy": accuracy, "paired": paired(accuracy, cells),
            "calibration": calibration, "selective": selective,
            "nota": _nota_summary(nota)}


def paired(accuracy: dict[str, dict[str, dict[str, Any]]],
           cells: dict[str, dict[str, dict[str, dict[str, Any]]]] | None = None,
           ) -> dict[str, Any]:
    """Per-split differences ``method - regrab`` and their interval over splits.

    With the ``cells`` (``{method: {setting: {split: cell}}}``), a method scored on fewer
    episodes than REGRAB is compared with REGRAB on those same (first) episodes.
    """
    ref = accuracy.get(REFERENCE)
    if ref is None:
        return {}
    out: dict[str, Any] = {}
    for method, settings in accuracy.items():
        if method == REFERENCE:
            continue
        for setting, row in settings.items():
            if setting not in ref:
                continue
            common = [s for s in row["per_split"] if s in ref[setting]["per_split"]]
            diffs = {s: row["per_split"][s] - ref[setting]["per_split"][s] for s in common}
            if cells is not None:
                for s in common:
                    mine = cells[method][setting][s]["episodes"]
                    theirs = cells[REFERENCE][setting][s]["episodes"]
                    n = min(len(mine), len(theirs))
                    if n < max(len(mine), len(theirs)):
                        diffs[s] = float(mine[:n].mean() * 100) - float(theirs[:n].mean() * 100)
            iv = interval(diffs.values())
            out.setdefault(f"{method}_minus_{REFERENCE}", {})[setting] = {
                "diff": iv["mean"], "ci95": iv["ci95"], "n_splits": iv["n_splits"],
                "wins": sum(d > 0 for d in diffs.values()), "per_split": diffs}
    return out


#: Keys of a NOTA cell that hold figures of every uncertainty score (left out of reports).
PER_SCORE = ("detection", "roc")


def _nota_summary(nota: dict[str, dict[str, dict[str, dict[str, float]]]]) -> dict[str, Any]:
    rows: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for split, methods in nota.items():
        for method, keys in methods.items():
            for key, cell in keys.items():
                rows.setdefault(method, {}).setdefault(key, {})[split] = cell
    # A split's cell without its detection figures of every score and its ROC curve: the
    # detection section summarises those (pipeline.detection), no page reads them per split.
    return {method: {key: {**interval(c["acc"] for c in by_split.values()),
                           "per_split": {s: {k: v for k, v in c.items() if k not in PER_SCORE}
                                         for s, c in by_split.items()}}
                     for key, by_split in keys.items()}
            for method, keys in rows.items()}


def _r(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, 2)


def headline_metrics(report: dict[str, Any], benchmark: str,
                     calibrated: tuple[str, ...]) -> dict[str, Any]:
    """The few numbers declared as DVC metrics, named for ``dvc exp show`` columns.

    ``<benchmark>.<method>.<setting>`` (accuracy, mean over splits),
    ``paired.<method>_minus_regrab.<setting>.{diff,ci95}``, ``ece.<method>.<setting>`` (for
    the ``calibrated`` methods) and ``nota.<method>.<setting>_r<percent>``.
    """
    acc = {m: {s: _r(c["mean"]) for s, c in row.items()} for m, row in
           report["accuracy"].items()}
    pair = {k: {s: {"diff": _r(c["diff"]), "ci95": _r(c["ci95"])} for s, c in row.items()}
            for k, row in report["paired"].items()}
    ece = {m: {s: _r(c["ece"]["mean"]) for s, c in row.items()}
           for m, row in report["calibration"].items() if m in calibrated}
    ece_ts = {m: {s: _r(c["ece_ts"]["mean"]) for s, c in row.items() if "ece_ts" in c}
              for m, row in report["calibration"].items() if m in calibrated}
    nota = {m: {k: _r(c["mean"]) for k, c in row.items()} for m, row in report["nota"].items()}
    out = {benchmark: acc, "paired": pair, "ece": ece,
           "ece_ts": {m: row for m, row in ece_ts.items() if row}, "nota": nota}
    return {k: v for k, v in out.items() if v}


#: An indented JSON list that holds only numbers and nulls.
NUMBER_LIST = re.compile(r"\[\s*((?:-?[\d.eE+-]+|null)(?:,\s*(?:-?[\d.eE+-]+|null))*)\s*\]")


def write_json_ordered(obj: Any, path: str | os.PathLike[str], digits: int | None = None
                       ) -> None:
    """Indented JSON in insertion order (``dvc exp show`` keeps it), NaN written as null;
    with ``digits``, numbers rounded to that many decimals (reports: the pages show two)."""
    def clean(x: Any) -> Any:
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, (float, np.floating)):
            return None if math.isnan(x) else float(x if digits is None else round(x, digits))
        if isinstance(x, np.integer):
            return int(x)
        return x

    text = json.dumps(clean(obj), indent=2, allow_nan=False)
    # A list of numbers on one line: curves of a hundred points stay a line each, not a page.
    text = NUMBER_LIST.sub(lambda m: "[" + ", ".join(v.strip() for v in m[1].split(",")) + "]",
                           text)
    with atomic_path(path) as tmp:
        tmp.write_text(text + "\n")


def _pm(mean: float | None, ci: float | None, signed: bool = False) -> str:
    if mean is None:
        return "–"
    text = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return text + (f" ± {ci:.2f}" if ci is not None else "")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1),
            *("| " + " | ".join(r) + " |" for r in rows)]


def markdown_report(report: dict[str, Any], settings: list[str], note: str) -> str:
    """Every table of the report in markdown, each with its interval over splits."""
    n = len(report["splits"])
    acc, pair, cal = report["accuracy"], report["paired"], report["calibration"]
    lines = [f"Accuracy % (mean over {n} split(s) ± t 95% CI of the split means)", ""]
    lines += _table(["method", *settings], [
        [m] + [_pm(row[s]["mean"], row[s]["ci95"]) if s in row else "–" for s in settings]
        for m, row in acc.items()])
    fewer = [f"{m} ({row[s]['n_splits']} split(s), {row[s]['episodes'] // row[s]['n_splits']} "
             "episodes per setting and split)" for m, row in acc.items()
             for s in list(row)[:1] if row[s]["n_splits"] < n
             or row[s]["episodes"] < max(r[s]["episodes"] for r in acc.values() if s in r)]
    if fewer:
        lines += ["", "Scored on fewer splits or episodes (paired with REGRAB on the same "
                  "ones): " + "; ".join(fewer) + "."]
    lines += ["", note, "", "Pooled-episode 95% CI (secondary: ignores the between-split "
              "variance)", ""]
    lines += _table(["method", *settings], [
        [m] + [f"± {row[s]['pooled_ci95']:.2f}" if s in row and row[s]["pooled_ci95"]
               is not None else "–" for s in settings] for m, row in acc.items()])
    if pair:
        lines += ["", f"Paired difference vs {REFERENCE}, accuracy points (mean of per-split "
                  f"differences ± t 95% CI; wins = splits where the method beats {REFERENCE})",
                  ""]
        lines += _table(["comparison", *settings], [
            [k] + [f"{_pm(row[s]['diff'], row[s]['ci95'], True)} "
                   f"({row[s]['wins']}/{row[s]['n_splits']} wins)" if s in row else "–"
                   for s in settings] for k, row in pair.items()])
    lines += ["", "Per-split accuracy %", ""]
    lines += _table(["method", "setting", *report["splits"]], [
        [m, s] + [f"{row[s]['per_split'][sp]:.2f}" if sp in row[s]["per_split"] else "–"
                  for sp in report["splits"]]
        for m, row in acc.items() for s in settings if s in row])
    lines += ["", "Calibration: ECE % (15 equal-width bins of the max probability) and AURC % "
              "(area under the risk-coverage curve, lower is better), mean ± t 95% CI", ""]
    lines += _table(["method", *settings], [
        [m] + [f"ECE {_pm(row[s]['ece']['mean'], row[s]['ece']['ci95'])}; AURC "
               f"{_pm(row[s]['aurc']['mean'], row[s]['aurc']['ci95'])}" if s in row else "–"
               for s in settings] for m, row in cal.items()])
    scaled = {m: row for m, row in cal.items() if any("ece_ts" in c for c in row.values())}
    if scaled:
        lines += ["", "ECE % after temperature scaling (one temperature per model, setting and "
                  "split, fitted on validation relations; accuracy unchanged), mean ± t 95% CI",
                  ""]
        lines += _table(["method", *settings], [
            [m] + [_pm(row[s]["ece_ts"]["mean"], row[s]["ece_ts"]["ci95"])
                   if "ece_ts" in row.get(s, {}) else "–" for s in settings]
            for m, row in scaled.items()])
    if report["nota"]:
        keys = list(dict.fromkeys(k for row in report["nota"].values() for k in row))
        lines += ["", "None-of-the-above accuracy % (threshold chosen per split on validation "
                  "relations; an outside query is correct iff abstained, an inside one iff "
                  "answered with its relation), mean ± t 95% CI", ""]
        share = {k: next(c["per_split"][sp].get("outside") for row in report["nota"].values()
                         for kk, c in row.items() if kk == k for sp in c["per_split"])
                 for k in keys}
        lines += _table(["method", *(f"{k} ({share[k]:.0%} outside)" if share[k] is not None
                                     else k for k in keys)], [
            [m] + [_pm(row[k]["mean"], row[k]["ci95"]) if k in row else "–" for k in keys]
            for m, row in report["nota"].items()])
    return "\n".join(lines) + "\n"


def write_selective_csv(report: dict[str, Any], path: Path) -> None:
    """Selective accuracy (%) against coverage, one column ``<method>_<setting>`` per curve."""
    curves = {f"{m}_{s}": c for s, row in report["selective"].items() for m, c in row.items()}
    lines = [",".join(["coverage", *curves])]
    for i, cov in enumerate(COVERAGES):
        lines.append(",".join([f"{cov:.2f}", *(f"{c[i]:.3f}" for c in curves.values())]))
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
