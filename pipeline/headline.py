"""The headline of one benchmark: the few numbers ``dvc exp show`` lists.

:func:`headline` keeps, from ``metrics/<benchmark>.json`` (``evaluate``) and
``metrics/transfer.json`` (``transfer``), REGRAB's accuracy for every few-shot setting and
transfer set and the same for the strongest baseline (:func:`is_baseline`: every method but
REGRAB, its ablations and the untrained floor), copied or averaged from the files, never
recomputed from episodes. The ``headline`` stage reads the files and writes the result.
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.errors import PipelineError
from pipeline.report import REFERENCE

#: The untrained encoder: every method's lower bound, not a baseline to beat.
FLOOR = "floor"
#: Top-level keys of ``metrics/transfer.json`` that are not transfer sets.
TRANSFER_EXTRAS = ("paired", "vs_regrab", "ece", "priors", "shuffled")
FEW_SHOT = re.compile(r"\d+w[1-9]\d*s")


def is_baseline(method: str) -> bool:
    """Whether ``method`` is a competitor of REGRAB (not REGRAB, an ablation or the floor)."""
    return method != REFERENCE and not method.startswith(f"{REFERENCE}_") and method != FLOOR


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 2)


def headline(benchmark: str, metrics: dict[str, Any],
             transfer: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The headline numbers of ``benchmark`` and, per column, the baseline that gave ``best``.

    Args:
        benchmark: the benchmark's key in ``params.yaml`` ``benchmarks``.
        metrics: ``metrics/<benchmark>.json`` as ``evaluate`` writes it.
        transfer: ``metrics/transfer.json`` as ``transfer`` writes it (None: no transfer).

    Returns:
        ``{benchmark: {setting: acc, set: acc, "best": {...}}}`` and ``{column: method}``.

    Raises:
        PipelineError: when the file holds no accuracy for REGRAB or no baseline.
    """
    accuracy = metrics.get(benchmark)
    if not isinstance(accuracy, dict) or REFERENCE not in accuracy:
        raise PipelineError(f"no {REFERENCE} accuracy under '{benchmark}' in the metrics file; "
                            "is it metrics/<benchmark>.json of that benchmark?")
    ours: dict[str, Any] = {}
    best: dict[str, Any] = {}
    which: dict[str, str] = {}
    for setting, acc in accuracy[REFERENCE].items():
        rivals = {m: row[setting] for m, row in accuracy.items()
                  if is_baseline(m) and row.get(setting) is not None}
        if not FEW_SHOT.fullmatch(setting) or not rivals:
            continue
        ours[setting] = acc
        # Ties go to the method listed first (params order), so reruns pick the same one.
        which[setting] = max(rivals, key=lambda m: (rivals[m], -list(rivals).index(m)))
        best[setting] = rivals[which[setting]]
    if not ours:
        raise PipelineError(f"'{benchmark}' has no few-shot setting scored for {REFERENCE} "
                            "and a baseline")
    stress = set((transfer or {}).get("shuffled") or [])  # stress tests, not headlines
    for name, by_benchmark in (transfer or {}).items():
        skip = name in TRANSFER_EXTRAS or name in stress
        scored = None if skip else by_benchmark.get(benchmark)
        if not isinstance(scored, dict) or REFERENCE not in scored:
            continue
        # Few-shot settings only: zero-shot ones are scored by the methods that can do them.
        few = {m: [v for s, v in row.items() if FEW_SHOT.fullmatch(s) and v is not None]
               for m, row in scored.items() if is_baseline(m) or m == REFERENCE}
        means = {m: _mean(vs) for m, vs in few.items() if vs}
        rivals = {m: v for m, v in means.items() if m != REFERENCE}
        if REFERENCE not in means:
            continue
        ours[name] = means[REFERENCE]
        if rivals:
            which[name] = max(rivals, key=lambda m: (rivals[m], -list(rivals).index(m)))
            best[name] = rivals[which[name]]
    return {benchmark: {**ours, "best": best}}, which
