"""Which support sentences may be mislabelled: each one's suspicion, and the flagged ones.

:func:`check_support` scores every support sentence a :class:`~model.predict.predictor.Predictor`
uses (:func:`~model.evaluation.support_noise.support_suspicion`: REGRAB's leave-one-out
posterior predictive against the best other relation, a point method's leave-one-out
prototype) and flags those above the checkpoint's cutoff, chosen on its validation relations
(:class:`~model.files.suspicion_cutoff.SuspicionCutoff`). A checkpoint of an older version has
no cutoff: the scores are given, nothing is flagged, and :attr:`SupportCheck.rule` says why.

A relation's only sentence is not scored, by any method: with no sibling sentence, nothing
says what the relation's sentences look like but the prior, and the cutoff was chosen on
5-shot validation episodes, where every sentence has four (REGRAB's score against its prior
alone flagged correct lone sentences there). Its suspicion is None, it is never flagged, and
:meth:`SupportCheck.line` counts such sentences.

Shapes:
    N candidate relations, K shots (the most of any relation), D encoding size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from model.evaluation.support_noise import support_suspicion
from model.files.suspicion_cutoff import SuspicionCutoff
from model.posterior.shots import padded_support


@dataclass
class SupportCheck:
    """Suspicion of each relation's support sentences (None: not scored, a relation's only
    sentence) and which are flagged."""

    relations: list[str]
    scores: list[list[float | None]]  # per relation, per sentence used
    cutoff: float | None
    rule: str  # how the cutoff was chosen, or why nothing is flagged

    def flagged(self, relation: int, index: int) -> bool:
        score = self.scores[relation][index]
        return self.cutoff is not None and score is not None and score > self.cutoff

    def records(self) -> list[dict[str, Any]]:
        """One record per scored support sentence: relation, its place among the relation's
        sentences (0-based, in the order given), suspicion and whether it is flagged."""
        return [{"relation": r, "index": j, "suspicion": s, "flagged": self.flagged(i, j)}
                for i, r in enumerate(self.relations) for j, s in enumerate(self.scores[i])]

    @property
    def count(self) -> int:
        return sum(rec["flagged"] for rec in self.records())

    @property
    def lone(self) -> list[str]:
        """The relations whose only sentence is not checked (no sibling to judge it by)."""
        return [r for r, s in zip(self.relations, self.scores, strict=True) if len(s) == 1]

    def line(self) -> str:
        shown = [f"{rec['relation']} #{rec['index']} ({rec['suspicion']:.3g})"
                 for rec in self.records() if rec["flagged"]]
        lone = self.lone
        unchecked = (f"; {len(lone)} sentence{'s have' if len(lone) > 1 else ' has'} no "
                     f"siblings, not checked ({', '.join(lone[:5])}"
                     f"{' ...' if len(lone) > 5 else ''}: a relation's only sentence)"
                     if lone else "")
        return (f"support sentences flagged as possibly mislabelled: {self.count}"
                + (f" ({', '.join(shown)})" if shown else "") + unchecked + f"; {self.rule}")


@torch.no_grad()
def check_support(head: Any, enc: torch.Tensor, used: list[int], h: torch.Tensor | None,
                  relations: list[str], cutoff: SuspicionCutoff | None) -> SupportCheck:
    """The :class:`SupportCheck` of a support set, scored as one padded episode
    (:func:`~model.posterior.shots.padded_support`; the scores read each relation's own
    sentences only, by the counts).

    Args:
        head: the model's head.
        enc: the encodings of the sentences used, relation after relation.
        used: sentences used per relation.
        h: the prior means (None without a prior).
        relations: the candidate relations, in the order of ``used``.
        cutoff: the checkpoint's record (None: nothing is flagged).

    Shapes:
        enc: (sum used, D), h: (1, N, D) or None
    """
    padded, counts = padded_support(enc.double(), used)  # (1, N, K, D), (1, N)
    if not max(used):  # every relation zero-shot: one slot, masked out by the counts
        padded = padded.new_zeros(1, len(used), 1, enc.shape[-1])
    found = support_suspicion(head, padded, None if h is None else h.double(), counts)[0]
    # A relation's only sentence has no sibling to be judged by: not scored (module doc).
    scores = [[None if math.isnan(v) or u == 1 else float(f"{v:.6g}")
               for v in found[i, :u].tolist()] for i, u in enumerate(used)]
    if cutoff is None:
        rule = ("this checkpoint keeps no suspicion cutoff measured on validation relations "
                "(an older version trained it), so the scores are written and nothing is "
                "flagged; the train stage measures it for a finished model without "
                "retraining it")
        return SupportCheck(relations, scores, None, rule)
    rule = (f"flagged above suspicion {cutoff.cutoff:.4g}, chosen on the validation relations: "
            f"{cutoff.reason}")
    return SupportCheck(relations, scores, cutoff.cutoff, rule)
