"""Reports of a mislabelled support sentence: what it costs each method, and how well each
method's suspicion score finds it.

The noisy setting (``<setting>_noisy``) holds the clean setting's episodes with one support
sentence replaced by a sentence of another way, and the same queries, so its cost is a
paired difference per split (noisy minus clean accuracy), reported as the mean over splits
with a t interval of the split differences (:func:`pipeline.report.interval`). The cost of
every method is also set against REGRAB's (``cost_minus_regrab``: positive, the method loses
less than REGRAB). The detector is scored per split (AUROC, AUPR and FPR at 95% TPR of the
planted sentence among all support sentences, percent) and reported the same way.

Inputs are the per-split cells of the evaluation (a noisy cell has ``episodes`` and
``support_noise``); nothing here runs a model.
"""

from __future__ import annotations

from typing import Any

from pipeline.report import REFERENCE, _pm, _r, _table, interval

SUFFIX = "_noisy"
MEASURES = ("auroc", "aupr", "fpr95")


def _iv(values: dict[str, float]) -> dict[str, Any]:
    return {**interval(values.values()), "per_split": values}


def summarise(per_split: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The ``support_noise`` section: per method and noisy setting, ``clean``, ``noisy``,
    ``cost`` (paired, noisy minus clean), ``cost_minus_regrab`` and the detector's measures,
    each a mean over splits with its interval; empty when no setting was noisy."""
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for split, methods in per_split.items():
        for method, settings in methods.items():
            for setting, cell in settings.items():
                clean = setting.removesuffix(SUFFIX)
                if setting.endswith(SUFFIX) and clean in settings:
                    cells.setdefault(method, {}).setdefault(clean, {})[split] = (
                        settings[clean], cell)
    out: dict[str, Any] = {}
    for method, settings in cells.items():
        for clean, by_split in settings.items():
            acc = {s: (float(c["episodes"][: len(n["episodes"])].mean() * 100),
                       float(n["episodes"].mean() * 100)) for s, (c, n) in by_split.items()}
            out.setdefault(method, {})[clean + SUFFIX] = {
                "clean": _iv({s: a for s, (a, _) in acc.items()}),
                "noisy": _iv({s: b for s, (_, b) in acc.items()}),
                "cost": _iv({s: b - a for s, (a, b) in acc.items()}),
                **{m: _iv({s: n["support_noise"][m] for s, (_, n) in by_split.items()})
                   for m in MEASURES}}
    ref = out.get(REFERENCE, {})
    for method, settings in out.items():
        for name, row in settings.items():
            if method == REFERENCE or name not in ref:
                continue
            theirs = ref[name]["cost"]["per_split"]
            row["cost_minus_regrab"] = _iv({s: v - theirs[s] for s, v in
                                            row["cost"]["per_split"].items() if s in theirs})
    return {"support_noise": out} if out else {}


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    """``support_noise.auroc.<method>``, ``support_noise.cost.<method>`` (accuracy points,
    noisy minus clean) and ``support_noise.cost_minus_regrab.<method>`` of the first noisy
    setting, for ``dvc metrics``."""
    rows = summary.get("support_noise") or {}
    first = next((n for settings in rows.values() for n in settings), None)
    if first is None:
        return {}
    got = {m: row[first] for m, row in rows.items() if first in row}
    out = {"setting": first,
           "auroc": {m: _r(c["auroc"]["mean"]) for m, c in got.items()},
           "cost": {m: _r(c["cost"]["mean"]) for m, c in got.items()},
           "cost_minus_regrab": {m: _r(c["cost_minus_regrab"]["mean"]) for m, c in got.items()
                                 if "cost_minus_regrab" in c}}
    return {"support_noise": out}


def markdown(summary: dict[str, Any]) -> list[str]:
    """The report's table of every noisy setting (no lines when there is none)."""
    rows = summary.get("support_noise") or {}
    lines: list[str] = []
    for name in dict.fromkeys(n for settings in rows.values() for n in settings):
        clean = name.removesuffix(SUFFIX)
        lines += ["", f"A mislabelled support sentence ({name}: the {clean} episodes with one "
                  "support sentence of one way replaced by a sentence of another way, same "
                  "queries). Accuracy %, its paired cost (noisy minus clean) and that cost "
                  f"against {REFERENCE}'s, and the AUROC % / FPR at 95% TPR % of the method's "
                  "suspicion score for the replaced sentence among all support sentences; "
                  "mean over splits ± t 95% CI", ""]
        lines += _table(["method", clean, name, "cost", f"cost vs {REFERENCE}", "AUROC",
                         "FPR95"], [
            [m, _pm(c["clean"]["mean"], c["clean"]["ci95"]),
             _pm(c["noisy"]["mean"], c["noisy"]["ci95"]),
             _pm(c["cost"]["mean"], c["cost"]["ci95"], True),
             _pm(c["cost_minus_regrab"]["mean"], c["cost_minus_regrab"]["ci95"], True)
             if "cost_minus_regrab" in c else "–",
             _pm(c["auroc"]["mean"], c["auroc"]["ci95"]),
             _pm(c["fpr95"]["mean"], c["fpr95"]["ci95"])]
            for m, row in rows.items() for n, c in row.items() if n == name])
    return lines
