"""What a support set gave each candidate relation: shots, prior kind, text read, notes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from model.prior.labels import TEXT_KINDS, relation_name

if TYPE_CHECKING:
    from model.methods.base import FewShotModel


@dataclass
class SupportSummary:
    """What :meth:`~model.predict.predictor.Predictor.set_support` built, for the user to read."""

    relations: list[str]
    shots: list[int]
    used_shots: list[int]
    zero_shot: list[str]
    #: Where each relation's prior mean came from (``graph``, ``label``: its name alone,
    #: ``fallback``); empty for methods without a prior.
    priors: dict[str, str]
    handling: str
    notes: list[str] = field(default_factory=list)
    #: What each relation's prior read of its text (:data:`~model.prior.labels.TEXT_KINDS`:
    #: ``name+description``, ``name``, ``no text``); empty for methods without a prior.
    texts: dict[str, str] = field(default_factory=dict)

    @property
    def fallback_prior(self) -> list[str]:
        return [r for r, kind in self.priors.items() if kind == "fallback"]

    @property
    def text_counts(self) -> dict[str, int]:
        """How many relations' priors read each kind of text (every TEXT_KINDS key; empty
        for methods without a prior)."""
        if not self.texts:
            return {}
        return {k: sum(v == k for v in self.texts.values()) for k in TEXT_KINDS}

    def lines(self) -> list[str]:
        shots = ", ".join(f"{r} K={k}" for r, k in zip(self.relations, self.shots, strict=True))
        out = [f"support: {len(self.relations)} candidate relations ({shots})", self.handling]
        if self.zero_shot:
            out.append(f"zero-shot from the prior: {', '.join(self.zero_shot)}")
        if self.priors:
            out.append("prior: " + ", ".join(
                f"{r} {k}" + (f" ({self.texts[r]})" if r in self.texts else "")
                for r, k in self.priors.items())
                + " (graph: the relation graph and its label; label: the relation's name "
                "alone; fallback: neither, a shared learned vector; in parentheses what the "
                "prior read of the relation's text)")
        if self.texts:
            out.append("prior text: " + ", ".join(f"{k} {n}" for k, n in
                                                  self.text_counts.items())
                       + " (relations whose prior read a name and description, a name only, "
                       "no text)")
        return out + self.notes


def unread_descriptions(model: FewShotModel, relations: list[str], names: Mapping[str, str],
                        said: Mapping[str, str], texts: Mapping[str, str]) -> list[str]:
    """One note per reason a candidate's given description was not read."""
    prior = model.prior
    why: dict[str, list[str]] = {}
    for r in relations:
        if r not in said or texts.get(r) == "name+description":
            continue
        if prior is None:
            reason = (f"a {model.config.method} checkpoint has no prior to read "
                      "them")
        elif prior.prior_kind(r) == "graph":
            reason = "in the checkpoint's relation graph, whose own text the prior reads"
        elif not prior.config.text:
            reason = "the checkpoint's prior reads no text (model.prior.text: false)"
        elif not prior.config.descriptions:
            reason = ("the checkpoint's prior reads names only (model.prior.descriptions: "
                      "false)")
        elif not (names.get(r) or relation_name(r)):
            reason = "no name to read them after; give the relation a name"
        else:
            reason = "the prior read none of their words"
        why.setdefault(reason, []).append(r)
    return [f"descriptions not read: {', '.join(rs)} ({reason})"
            for reason, rs in why.items()]
