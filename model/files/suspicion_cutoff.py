"""What a checkpoint keeps to flag mislabelled support sentences: a cutoff on the suspicion
score, chosen on its validation relations.

:class:`SuspicionCutoff` is the record (measured at the end of training,
:mod:`model.training.val_noise`), checked down to every number when a file is read (a file
may come from anybody). The checkpoint record (:mod:`model.files.checkpoint`) stores one.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SuspicionCutoff:
    """The suspicion score above which ``regrab-predict`` flags a support sentence as
    possibly mislabelled (:mod:`model.evaluation.support_noise`), chosen on validation
    episodes with one planted mislabelled sentence each (never test relations).

    Attributes:
        ways: N of the validation episodes (5, capped by the validation relations).
        shots: their K.
        episodes: validation episodes scored.
        cutoff: flag a sentence whose suspicion is above it.
        auroc: AUROC (%) of the suspicion for the planted sentences among all support
            sentences of those episodes.
        flagged_wrong: share (%) of the planted sentences above the cutoff.
        flagged_clean: share (%) of the other sentences above it.
        reason: how the cutoff was chosen, in words.
    """

    ways: int
    shots: int
    episodes: int
    cutoff: float
    auroc: float
    flagged_wrong: float
    flagged_clean: float
    reason: str

    @classmethod
    def parse(cls, tree: Any) -> SuspicionCutoff:
        """A stored record; raises ValueError naming what is malformed."""
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(tree, dict) or set(tree) != set(names):
            raise ValueError(f"it is not a record of {', '.join(names)}")
        counts = {k: tree[k] for k in ("ways", "shots", "episodes")}
        for key, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10**9:
                raise ValueError(f"{key} {str(value)[:20]} is not a count")
        numbers = {}
        for key in ("cutoff", "auroc", "flagged_wrong", "flagged_clean"):
            value = tree[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not \
                    math.isfinite(value):
                raise ValueError(f"{key} {str(value)[:20]} is not a finite number")
            if key != "cutoff" and not 0 <= value <= 100:
                raise ValueError(f"{key} {value} is not a percentage")
            numbers[key] = float(value)
        if not isinstance(tree["reason"], str) or len(tree["reason"]) > 1000:
            raise ValueError("reason is not a short text")
        return cls(**counts, **numbers, reason=tree["reason"])

    def to_tree(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
