"""Reports of how well each method's uncertainty flags what it should not answer.

Two questions, both answered per split and then as the mean over splits with a t interval of
the split means (:func:`pipeline.report.interval`):

* **Out-of-set detection.** In none-of-the-above episodes some queries come from relations
  outside the support. Every uncertainty score of a method is scored as a detector of those
  queries: AUROC, AUPR (outside positive) and FPR at 95% TPR, in percent. ``best`` is the
  score chosen on validation relations among all the method's scores, ``best_point`` among
  those a point estimate has too (raw and temperature-scaled probabilities). The paired
  difference ``regrab - <method>`` sets REGRAB's ``best`` against each method's
  ``best_point`` on the same episodes; ``regrab_posterior_gain`` sets REGRAB's ``best``
  against its own ``best_point`` (what the posterior samples add).
* **Selective prediction.** On the ordinary episodes, per score: AURC (area under the
  risk-coverage curve, lower is better) and accuracy on the 80% of queries the score is
  surest of.

The cells come from the evaluation library (``uncertainty`` of a setting's cell;
``detection``, ``best``, ``best_point`` and ``roc`` of a NOTA cell).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.io import atomic_path
from pipeline.report import REFERENCE, interval

#: Detection measures; higher is better except ``fpr95``.
MEASURES = ("auroc", "aupr", "fpr95")
LOWER_IS_BETTER = ("fpr95",)


def _by_method(per_split: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """``{split: {method: {key: cell}}}`` -> ``{method: {key: {split: cell}}}``."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for split, methods in per_split.items():
        for method, keys in methods.items():
            for key, cell in keys.items():
                out.setdefault(method, {}).setdefault(key, {})[split] = cell
    return out


def _iv(values: dict[str, float]) -> dict[str, Any]:
    return {**interval(values.values()), "per_split": values}


def summarise_uncertainty(per_split: dict[str, dict[str, dict[str, Any]]],
                          nota: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The ``selective_scores``, ``detection`` and ``detection_paired`` sections of a report,
    from the same per-split cells and NOTA cells as :func:`pipeline.report.summarise`."""
    return {"selective_scores": summarise_selective(per_split), **summarise_detection(nota)}


def summarise_detection(nota: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """``detection`` and ``detection_paired`` sections from per-split NOTA cells."""
    detection: dict[str, Any] = {}
    rows = _by_method(nota)
    for method, keys in rows.items():
        for key, by_split in keys.items():
            if not all("detection" in c for c in by_split.values()):
                continue
            first = next(iter(by_split.values()))
            # Every score's figures over splits, without the per-split values no page reads
            # (they made reports megabytes); the chosen scores keep theirs for the paired test.
            scores = {score: {m: interval(c["detection"][score][m] for c in by_split.values())
                              for m in MEASURES} for score in first["detection"]}
            entry: dict[str, Any] = {"scores": scores}
            for pick in ("best", "best_point"):
                entry[pick] = {
                    **{m: _iv({s: c["detection"][c[pick]][m] for s, c in by_split.items()})
                       for m in MEASURES},
                    "chosen": {s: c[pick] for s, c in by_split.items()}}
            roc = np.array([c["roc"] for c in by_split.values()], dtype=np.float64)
            entry["roc"] = np.nanmean(roc, axis=0).tolist()
            detection.setdefault(method, {})[key] = entry
    return {"detection": detection, "detection_paired": _paired(detection)}


def _diff(mine: dict[str, Any], theirs: dict[str, Any], measure: str) -> dict[str, Any]:
    a, b = mine[measure]["per_split"], theirs[measure]["per_split"]
    diffs = {s: a[s] - b[s] for s in a if s in b and not (math.isnan(a[s]) or math.isnan(b[s]))}
    better = (lambda d: d < 0) if measure in LOWER_IS_BETTER else (lambda d: d > 0)
    iv = interval(diffs.values())
    return {"diff": iv["mean"], "ci95": iv["ci95"], "n_splits": iv["n_splits"],
            "wins": sum(better(d) for d in diffs.values()), "per_split": diffs}


def _paired(detection: dict[str, Any]) -> dict[str, Any]:
    """REGRAB's best score against every method's best point-estimate score, and against its
    own (wins count the splits where REGRAB is better)."""
    ref = detection.get(REFERENCE)
    if ref is None:
        return {}
    out: dict[str, Any] = {}
    for method, keys in detection.items():
        label = (f"{REFERENCE}_posterior_gain" if method == REFERENCE
                 else f"{REFERENCE}_minus_{method}")
        for key, entry in keys.items():
            if key in ref:
                out.setdefault(label, {})[key] = {
                    m: _diff(ref[key]["best"], entry["best_point"], m) for m in MEASURES}
    return out


def summarise_selective(cells: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """``selective_scores``: per method, setting and score, AURC and accuracy at 80% coverage
    (percent) over splits, from per-split cells ``{split: {method: {setting: cell}}}``."""
    out: dict[str, Any] = {}
    for method, settings in _by_method(cells).items():
        for setting, by_split in settings.items():
            if not all("uncertainty" in c for c in by_split.values()):
                continue
            first = next(iter(by_split.values()))["uncertainty"]
            out.setdefault(method, {})[setting] = {
                score: {m: interval(c["uncertainty"][score][m] for c in by_split.values())
                        for m in ("aurc", "acc80")} for score in first}
    return out


def _pm(cell: dict[str, Any], signed: bool = False) -> str:
    mean, ci = cell.get("mean", cell.get("diff")), cell.get("ci95")
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    text = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return text + (f" ± {ci:.2f}" if ci is not None else "")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _chosen(entry: dict[str, Any]) -> str:
    names = list(dict.fromkeys(entry["chosen"].values()))
    return "/".join(names)


def markdown_detection(report: dict[str, Any],
                       chosen_on: str = "validation relations") -> list[str]:
    """The detection and selective-prediction tables of a report, as markdown lines;
    ``chosen_on`` says where the best scores were chosen."""
    lines: list[str] = []
    det = report.get("detection") or {}
    if det:
        keys = list(dict.fromkeys(k for row in det.values() for k in row))
        lines += ["", "Out-of-set detection (outside queries positive), best score chosen on "
                  f"{chosen_on}: AUROC % / FPR@95 %, mean ± t 95% CI over splits, the chosen "
                  "score in brackets (one per split); `best_point`: the best of the scores a "
                  "point estimate has too (probabilities, raw and temperature-scaled, and the "
                  "max logit)", ""]
        lines += _table(["method", "score", *keys], [
            [m, pick, *(f"{_pm(row[k][pick]['auroc'])} / {_pm(row[k][pick]['fpr95'])} "
                        f"({_chosen(row[k][pick])})" if k in row else "–" for k in keys)]
            for m, row in det.items() for pick in ("best", "best_point")
            if pick == "best_point" or m == REFERENCE or any(
                row[k]["best"]["chosen"] != row[k]["best_point"]["chosen"] for k in row)])
        pair = report.get("detection_paired") or {}
        if pair:
            lines += ["", f"Paired AUROC difference, {REFERENCE}'s best score minus each "
                      "method's best point-estimate score, points (mean ± t 95% CI; wins = "
                      f"splits where {REFERENCE} is better)", ""]
            lines += _table(["comparison", *keys], [
                [c, *(f"{_pm(row[k]['auroc'], True)} ({row[k]['auroc']['wins']}/"
                      f"{row[k]['auroc']['n_splits']})" if k in row else "–" for k in keys)]
                for c, row in pair.items()])
    sel = report.get("selective_scores") or {}
    if sel:
        settings = list(dict.fromkeys(s for row in sel.values() for s in row))
        lines += ["", "Selective prediction: AURC % by each method's best-AURC score (lower is "
                  "better) and, in brackets, the score; mean ± t 95% CI over splits", ""]
        rows = []
        for m, row in sel.items():
            cells = []
            for s in settings:
                if s not in row:
                    cells.append("–")
                    continue
                score = min(row[s], key=lambda k: row[s][k]["aurc"]["mean"])
                cells.append(f"{_pm(row[s][score]['aurc'])} ({score})")
            rows.append([m, *cells])
        lines += _table(["method", *settings], rows)
    return lines


def headline_detection(report: dict[str, Any]) -> dict[str, Any]:
    """``detection.<method>.<key>.{auroc,aupr,fpr95}`` of the best score and
    ``aurc.<method>.<setting>`` of max probability, rounded, for the metrics file."""
    def r(x: Any) -> Any:
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, 2)

    det = {m: {k: {ms: r(e["best"][ms]["mean"]) for ms in MEASURES} for k, e in row.items()}
           for m, row in (report.get("detection") or {}).items()}
    aurc = {m: {s: r(c["max_prob"]["aurc"]["mean"]) for s, c in row.items() if "max_prob" in c}
            for m, row in (report.get("selective_scores") or {}).items()}
    return {k: v for k, v in {"detection": det, "aurc": aurc}.items() if v}


def write_roc_csv(report: dict[str, Any], path: Path) -> None:
    """Mean ROC curves of each method's best score, one column ``<method>_<key>`` per curve:
    true-positive rate % at each false-positive rate % of an even grid."""
    curves = {f"{m}_{k}": e["roc"] for m, row in (report.get("detection") or {}).items()
              for k, e in row.items()}
    n = max((len(c) for c in curves.values()), default=0)
    lines = [",".join(["fpr", *curves])]
    for i, fpr in enumerate(np.linspace(0.0, 100.0, n)):
        lines.append(",".join([f"{fpr:.1f}", *(f"{c[i]:.3f}" for c in curves.values())]))
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
