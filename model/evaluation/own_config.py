"""``params.yaml`` section ``evaluate_own``, read by the ``evaluate_own`` stage (FewRel's models
on the held-out own relations of :mod:`model.own_data`; the scoring is
:func:`model.evaluation.transfer.score_table`).

A schema only: this module imports no torch, so the params checks read it at once."""

from __future__ import annotations

from dataclasses import dataclass

from model.episodes import Setting
from pipeline.config import field, register_section


@register_section("evaluate_own")
@dataclass(frozen=True)
class EvaluateOwnParams:
    """``params.yaml`` section ``evaluate_own``: FewRel's models on the held-out own
    relations (the rest of the scoring, queries and methods included, is ``evaluate``'s)."""

    settings: tuple[str, ...] = field(doc="{N}w{K}s settings scored; one with more ways than "
                                          "there are held-out relations is skipped and named "
                                          "in the report")
    episodes: int = field(ge=1, doc="episodes per setting")
    per_relation: int = field(ge=0, doc="sentences kept per held-out relation, a seeded "
                                        "random choice (0: all)")
    seed: int = field(doc="seed of the per-relation cut")

    def __post_init__(self) -> None:
        if not self.settings:
            raise ValueError("evaluate_own.settings is empty; list e.g. [2w1s, 5w5s]")
        for s in self.settings:
            Setting.parse(s)
