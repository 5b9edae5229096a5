"""The champion/challenger gate: whether a retrained model replaces the promoted one.

The scheduled retrain scores the promoted models (the champion) and the ones it just trained
(the challenger) on the same test episodes with ``scripts/paired_runs.py``, one JSON per
benchmark (``{method: {setting: {a, b, diff, ci95, episode_ci95, per_split}}}``, A the
champion, B the challenger, differences in points). :func:`decide` reads those tables with the
``promote`` section of ``params.yaml`` (:class:`PromoteConfig`):

- the headline of a benchmark is REGRAB's mean accuracy over ``promote.settings``; its paired
  difference is taken split by split (each split's mean over the settings) with the t 95%
  interval over splits (:func:`pipeline.report.interval`), or, with one split, the normal
  interval of the settings' pooled paired episodes. The challenger fails when the difference
  plus its interval is still below ``-headline_margin``: worse beyond its interval;
- the challenger also fails when any setting's mean difference falls below
  ``-setting_margin`` points, so a gain in one setting cannot hide a loss in another.

With no champion there is nothing to compare with, and the first version is promoted.
Nothing here runs a model or knows Prefect: the flow passes the tables in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.config import field, register_section
from pipeline.errors import PipelineError
from pipeline.report import REFERENCE, interval

#: The gate's name when there is no promoted version to compare with.
NO_CHAMPION = "no champion"
#: The gate when the champion saw a test relation of the challenger's splits (the benchmark's
#: relations moved between training and test): no paired comparison is possible.
NOT_COMPARABLE = "not comparable"
#: ``scripts/paired_runs.py``'s exit status for that case (``--a-trained-elsewhere``).
NOT_COMPARABLE_EXIT = 3
#: In place of a benchmark's paired table, and as its rows' verdict: the run's models are the
#: champion's, byte for byte (not scored; every paired difference would be 0).
UNCHANGED = "unchanged"
#: Environment variable that overrides ``promote.webhook``.
WEBHOOK_ENV = "REGRAB_RETRAIN_WEBHOOK"


@register_section("promote")
@dataclass(frozen=True)
class PromoteConfig:
    """``params.yaml`` section ``promote``: when a scheduled retrain replaces the promoted models.

    Read by the retrain flow (``orchestration/``), never by a stage, so no stage reruns when it
    changes (``check_params`` checks it and writes its fixed sentence).
    """

    benchmarks: tuple[str, ...] = field(doc="benchmarks (keys of the benchmarks section) whose "
                                            "REGRAB models are compared; each must pass")
    settings: tuple[str, ...] = field(doc="the headline settings ({N}w{K}s): REGRAB's mean "
                                          "accuracy over them is the headline")
    headline_margin: float = field(ge=0, doc="points the headline may fall below the "
                                             "champion's beyond its 95% interval (0: the "
                                             "challenger fails when it is worse beyond its "
                                             "interval)")
    setting_margin: float = field(ge=0, doc="points any one setting may fall below the "
                                            "champion's (mean over splits) before the "
                                            "challenger fails")
    episodes: int = field(ge=0, doc="test episodes per split and setting that both are "
                                    "scored on (0: evaluate.episodes, the metrics' own)")
    webhook: str = field(doc="URL that gets a JSON POST with the run, the decision and the "
                             f"paired table ('': none; env {WEBHOOK_ENV} overrides it)")


@dataclass(frozen=True)
class Decision:
    """What the gate decided and why.

    Attributes:
        promote: whether the challenger replaces the champion.
        gate: ``"no champion"``, ``"passed"`` or ``"failed"``.
        reasons: one line per failed check (empty when promoted).
        rows: the paired table, one row per benchmark and setting plus each headline.
    """

    promote: bool
    gate: str
    reasons: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]

    def summary(self) -> str:
        """One line: ``promoted (gate: passed)`` or ``not promoted: <reasons>``."""
        if self.promote:
            return f"promoted (gate: {self.gate})"
        return "not promoted: " + "; ".join(self.reasons)


def _row(benchmark: str, setting: str, champion: float | None, challenger: float | None,
         diff: float, ci95: float | None, verdict: str) -> dict[str, Any]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 2)

    return {"benchmark": benchmark, "setting": setting, "champion": r(champion),
            "challenger": r(challenger), "diff": round(diff, 2), "ci95": r(ci95),
            "verdict": verdict}


def headline(table: dict[str, Any], settings: tuple[str, ...]) -> dict[str, Any]:
    """REGRAB's headline difference in one benchmark's paired table.

    Returns:
        ``champion``, ``challenger`` (mean accuracy % over ``settings``), ``diff`` and its
        ``ci95`` (over splits; with one split, over the pooled paired episodes).

    Raises:
        PipelineError: the table lacks REGRAB or one of ``settings``.
    """
    cells = table.get(REFERENCE, {})
    missing = [s for s in settings if s not in cells]
    if missing:
        raise PipelineError(f"the paired table has no {REFERENCE} score for "
                            f"{', '.join(missing)}; score those settings or drop them from "
                            "promote.settings")
    splits = sorted(set.intersection(*(set(cells[s]["per_split"]) for s in settings)))
    if not splits:
        raise PipelineError("the paired table's settings share no split; score the same splits")
    per_split = [sum(cells[s]["per_split"][k] for s in settings) / len(settings) for k in splits]
    spread = interval(per_split)
    ci = spread["ci95"]
    if ci is None:  # one split: the settings' episodes are independent draws
        ci = math.sqrt(sum(cells[s]["episode_ci95"] ** 2 for s in settings)) / len(settings)
    return {"champion": sum(cells[s]["a"] for s in settings) / len(settings),
            "challenger": sum(cells[s]["b"] for s in settings) / len(settings),
            "diff": spread["mean"], "ci95": ci}


def not_comparable(reason: str) -> Decision:
    """The decision when the champion cannot be scored on the challenger's splits: not
    promoted, no table, ``reason`` saying why (a person compares and promotes by hand)."""
    return Decision(False, NOT_COMPARABLE, (f"{NOT_COMPARABLE}: {reason}",), ())


def decide(tables: dict[str, dict[str, Any] | str] | None, cfg: PromoteConfig) -> Decision:
    """The gate on ``{benchmark: paired table}`` (None: there is no champion).

    A benchmark given :data:`UNCHANGED` instead of a table (the run's models are the
    champion's bytes) passes, its rows saying so with no accuracies.

    Raises:
        PipelineError: a benchmark of ``promote.benchmarks`` has no table, or a table lacks
            a headline setting.
    """
    if tables is None:
        return Decision(True, NO_CHAMPION, (), ())
    missing = [b for b in cfg.benchmarks if b not in tables]
    if missing:
        raise PipelineError(f"no paired table for {', '.join(missing)}; every benchmark of "
                            "promote.benchmarks is compared")
    rows: list[dict[str, Any]] = []
    reasons: list[str] = []
    for bench in cfg.benchmarks:
        table = tables[bench]
        if table == UNCHANGED:  # the champion's models: no score, nothing can differ
            rows += [_row(bench, s, None, None, 0.0, 0.0, UNCHANGED)
                     for s in (*cfg.settings, "headline")]
            continue
        head = headline(table, cfg.settings)
        worse = head["diff"] + head["ci95"] < -cfg.headline_margin
        if worse:
            reasons.append(f"{bench} headline {head['diff']:+.2f} ± {head['ci95']:.2f} points, "
                           f"worse beyond its interval (margin {cfg.headline_margin:g})")
        for setting in cfg.settings:
            cell = table[REFERENCE][setting]
            falls = cell["diff"] < -cfg.setting_margin
            if falls:
                reasons.append(f"{bench} {setting} {cell['diff']:+.2f} points, below "
                               f"-{cfg.setting_margin:g}")
            rows.append(_row(bench, setting, cell["a"], cell["b"], cell["diff"],
                             cell.get("ci95"), "falls" if falls else "ok"))
        rows.append(_row(bench, "headline", head["champion"], head["challenger"],
                         head["diff"], head["ci95"], "worse" if worse else "ok"))
    return Decision(not reasons, "failed" if reasons else "passed", tuple(reasons), tuple(rows))
