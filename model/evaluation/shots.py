"""Episodes whose ways have unequal shots, as a user's support set has them.

A setting ``{N}w{a}-{b}s`` (``evaluate.unequal_settings``) brings three sets of test
episodes, seeded per split and setting so every method sees the same ones, each with
balanced queries:

* ``{N}w{a}-{b}s``: each way's shots drawn uniformly from a to b;
* ``{N}w{a}-{b}s_cut1``: the same episodes with every way cut to its first sentence, so
  "what the extra sentences gave" is a paired difference on the same queries;
* ``{N}w{a}-{b}s_step``: the step protocol (Ochal et al., 2023): one way, at a random
  position, with b sentences and the others with a. Its cell also holds the share of the
  predictions given to that way (truth: 1/N), :func:`step_share`.

:mod:`model.evaluation.split_episodes` scores them next to the balanced settings
(:meth:`~model.evaluation.split_episodes.SplitEpisodes.score_extra`); the summaries are
:func:`summarise`.

Shapes:
    B episodes, N ways, K shots (the largest of an episode), Q queries per way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from model.episodes import Episodes, EpisodeSampler
from pipeline.errors import PipelineError
from pipeline.report import _pm, _r, interval

_UNEQUAL = re.compile(r"^(\d+)w(\d+)-(\d+)s$")
#: Suffixes of the episode sets an unequal setting brings, after the setting itself.
CUT, STEP = "_cut1", "_step"


@dataclass(frozen=True)
class UnequalSetting:
    """``{N}w{a}-{b}s``: N ways, each with a to b shots."""

    ways: int
    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> UnequalSetting:
        match = _UNEQUAL.match(text)
        if not match:
            raise PipelineError(f"unequal setting {text!r} is not like 5w1-5s (N ways, 1 to 5 "
                                "shots each)")
        ways, low, high = (int(g) for g in match.groups())
        if ways < 2 or low < 1 or high <= low:
            raise PipelineError(f"unequal setting {text!r} needs N >= 2 ways and 1 <= a < b "
                                "shots; write it like 5w1-5s")
        return cls(ways, low, high)

    @property
    def name(self) -> str:
        return f"{self.ways}w{self.low}-{self.high}s"

    def names(self) -> tuple[str, str, str]:
        """The names of its three episode sets: uniform, cut to one shot, step."""
        return self.name, self.name + CUT, self.name + STEP


def sample_unequal(sampler: EpisodeSampler, setting: UnequalSetting, seed: list[int],
                   queries: int, count: int) -> dict[str, Episodes]:
    """The three episode sets of ``setting`` (see the module doc), from ``seed``."""
    rng = np.random.default_rng([*seed, 0])
    shots = rng.integers(setting.low, setting.high + 1, size=(count, setting.ways))
    uniform = sampler.sample_unequal(rng, shots, queries)
    cut = Episodes(uniform.relation, np.ascontiguousarray(uniform.support[:, :, :1]),
                   uniform.query)
    rng = np.random.default_rng([*seed, 1])
    step_shots = np.full((count, setting.ways), setting.low, dtype=np.int64)
    step_shots[np.arange(count), rng.integers(setting.ways, size=count)] = setting.high
    step = sampler.sample_unequal(rng, step_shots, queries)
    return dict(zip(setting.names(), (uniform, cut, step), strict=True))


def step_share(prediction: np.ndarray, shots: np.ndarray) -> np.ndarray:
    """Per episode, the fraction of its queries predicted as the way with the most shots.

    Shapes:
        prediction: (B, Q) way indices, shots: (B, N) -> (B,)
    """
    big = shots.argmax(1)  # (B,)
    return (prediction == big[:, None]).mean(1)


def summarise(per_split: dict[str, dict[str, dict[str, dict[str, Any]]]],
              settings: tuple[str, ...]) -> dict[str, Any]:
    """Step shares and the gain of the extra sentences, per method, over splits.

    Args:
        per_split: ``{split: {method: {setting: cell}}}`` as the evaluation returns them; a
            step cell has ``share`` (per episode).
        settings: the unequal settings (``evaluate.unequal_settings``).

    Returns:
        ``{"step_share": {setting: {method: interval}}, "gain": {setting: {method: paired
        interval}}}``: the share in percent (truth 100/N) and ``{N}w{a}-{b}s`` minus its
        ``_cut1`` twin in points, per split then over splits.
    """
    share: dict[str, dict[str, Any]] = {}
    gain: dict[str, dict[str, Any]] = {}
    for name in settings:
        whole, cut, step = UnequalSetting.parse(name).names()
        methods = dict.fromkeys(m for cells in per_split.values() for m in cells)
        for method in methods:
            shares = {s: float(cells[method][step]["share"].mean() * 100)
                      for s, cells in per_split.items()
                      if step in cells.get(method, {}) and "share" in cells[method][step]}
            if shares:
                share.setdefault(name, {})[method] = {**interval(shares.values()),
                                                      "per_split": shares}
            diffs = {s: float((cells[method][whole]["episodes"]
                               - cells[method][cut]["episodes"]).mean() * 100)
                     for s, cells in per_split.items()
                     if whole in cells.get(method, {}) and cut in cells[method]}
            if diffs:
                iv = interval(diffs.values())
                gain.setdefault(name, {})[method] = {
                    "diff": iv["mean"], "ci95": iv["ci95"], "n_splits": iv["n_splits"],
                    "per_split": diffs}
    return {"step_share": share, "gain": gain}


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    """DVC metrics ``shots.step_share.<method>`` (the first unequal setting's, percent),
    ``shots.step_share_<setting>.<method>`` for the others, and
    ``shots.gain.<setting>.<method>.{diff,ci95}``."""
    out: dict[str, Any] = {}
    for i, (name, rows) in enumerate(summary["step_share"].items()):
        key = "step_share" if i == 0 else f"step_share_{name}"
        out[key] = {m: _r(r["mean"]) for m, r in rows.items()}
    gains = {name: {m: {"diff": _r(r["diff"]), "ci95": _r(r["ci95"])} for m, r in rows.items()}
             for name, rows in summary["gain"].items()}
    if gains:
        out["gain"] = gains
    return out


def markdown(summary: dict[str, Any]) -> list[str]:
    """Tables of the step shares and the gains (empty without unequal settings)."""
    lines: list[str] = []
    for name, rows in summary["step_share"].items():
        s = UnequalSetting.parse(name)
        lines += ["", f"Step protocol of {name}: one way with {s.high} sentences, the others "
                      f"{s.low}; share of the predictions given to it (%, truth "
                      f"{100 / s.ways:.0f}).", "", "| method | share |", "|---|---|"]
        lines += [f"| {m} | {_pm(r['mean'], r['ci95'])} |" for m, r in rows.items()]
    for name, rows in summary["gain"].items():
        lines += ["", f"{name} minus {name}{CUT} (the same episodes cut to one sentence per "
                      "way), paired per split (points).", "", "| method | gain |", "|---|---|"]
        lines += [f"| {m} | {_pm(r['diff'], r['ci95'], signed=True)} |" for m, r in rows.items()]
    return lines
