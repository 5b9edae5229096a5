"""Relation names and labels as the sentence encoder reads them (the prior's ``text`` term).

A relation's label becomes a template sentence (:func:`label_sentence`,
``[E1] subject [/E1] <label> [E2] object [/E2]`` once the encoder adds its markers), so
marker pooling reads the label between the two entities. :func:`relation_name` reads a
name from a relation key when a file has no labels. :class:`LabelText` keeps the tokenized
template sentences of a prior's labels and encodes them, with gradients in each training
step and into the prior's buffer at every validation. :data:`PRIOR_KINDS` names where a way's
prior mean came from.

Shapes:
    R relations in the graph, B episodes, N ways, D encoding size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import torch

from model.encoder.frozen_cache import LowerCache, encode_all, encode_rows
from model.encoder.sentence import SentenceEncoder
from model.encoder.tokens import TokenizedSet

#: Words around a relation label in its template sentence; the markers go round the two ends.
LABEL_TEMPLATE = ("subject", "object")
#: The most words of a relation's description that its label sentence reads.
DESCRIPTION_WORDS = 20
#: Where a description's first sentence or clause ends.
_CLAUSE_END = re.compile(r"(?<=[a-z)])\.\s|;")
#: Where a way's prior mean came from (counted in reports): the graph (with the relation's
#: label when the prior reads labels), the relation's name alone, or the shared fallback.
PRIOR_KINDS = ("graph", "label", "fallback")
#: What a way's prior read of the relation's text (counted in reports beside the prior kind).
TEXT_KINDS = ("name+description", "name", "no text")
#: A Wikidata property or item id, or a bare number: an identifier, not a name to read.
_PID = re.compile(r"^([PQ]?\d+)$")
#: SemEval-style argument order, ``Cause-Effect(e1,e2)``.
_ARG_ORDER = re.compile(r"\(\s*e[12]\s*,\s*e[12]\s*\)\s*$", re.I)


def relation_name(key: str) -> str | None:
    """A readable name from a relation key of a FewRel-format file, or None for an id.

    ``gene_found_in_organism`` -> ``gene found in organism``; ``Cause-Effect(e1,e2)`` ->
    ``cause effect`` (the argument order is not a word); ``P17`` or ``3`` -> None.
    """
    key = _ARG_ORDER.sub("", key.strip())
    if not key or _PID.match(key):
        return None
    words = re.sub(r"[_\-/.:]+", " ", key).split()
    return " ".join(words).lower() or None


def description_words(description: str | None) -> list[str]:
    """The words of a description the label sentence reads: its first sentence or clause
    (Wikidata descriptions go on with usage notes: "... Should not be used when ..."), at most
    :data:`DESCRIPTION_WORDS` words; none for a missing or empty description."""
    if not description:
        return []
    first = _CLAUSE_END.split(description.strip(), maxsplit=1)[0]
    return first.split()[:DESCRIPTION_WORDS]


def label_sentence(relation: str, label: str, description: str | None = None) -> dict:
    """A relation label as a FEWSHOT_SCHEMA row: ``subject <label words> object``, followed by
    ``: <description words>`` when a description is given.

    The encoder inserts its entity markers around ``subject`` (head) and ``object`` (tail)
    as in any sentence, so marker pooling reads the label between them, and the description
    after them (``subject performer object : actor, musician, band or other performer ...``).
    """
    extra = description_words(description)
    words = [LABEL_TEMPLATE[0], *label.split(), LABEL_TEMPLATE[1]]
    words += [":", *extra] if extra else []
    tail = len(label.split()) + 1
    return {"instance_id": f"label-{relation}", "relation": relation, "relation_name": label,
            "tokens": words, "head_start": 0, "head_end": 1, "tail_start": tail,
            "tail_end": tail + 1, "head_id": None, "tail_id": None}


class TextBuffer(Protocol):
    """Where :meth:`LabelText.refresh` stores the label encodings: the prior
    (:class:`~model.prior.gcn.GraphPrior`, which imports this module, so it is not named
    here)."""

    def set_text(self, rows: list[int], encodings: torch.Tensor) -> None:
        """Store the encodings of graph ``rows``: (len(rows), D)."""


@dataclass
class LabelText:
    """The relation labels of a prior with ``text: true``, as the encoder reads them.

    Made by :meth:`~model.prior.gcn.GraphPrior.read_labels`; the trainer calls :meth:`refresh`
    before each validation and :meth:`encodings` in each step.

    Attributes:
        prior: the prior whose labels these are.
        tokens: one tokenized template sentence per labelled relation.
        rows: the graph row of each sentence.
        sentence_of: per graph row, its sentence (-1: no label).
        cache: the frozen-layer cache of the encoder (None when every layer trains).
        batch_size: sentences per encoder batch.
    """

    prior: TextBuffer
    tokens: TokenizedSet
    rows: list[int]
    sentence_of: torch.Tensor  # (R,)
    cache: LowerCache | None
    batch_size: int

    def refresh(self, encoder: SentenceEncoder) -> None:
        """Re-encode every label with the encoder as it is now, into the prior's buffer."""
        self.prior.set_text(self.rows, encode_all(encoder, self.tokens, self.cache,
                                                  self.batch_size))

    def encodings(self, encoder: SentenceEncoder, rows: torch.Tensor) -> torch.Tensor | None:
        """The label encodings of graph ``rows`` with gradients, NaN where there is no label
        (None when no row has one).

        Shapes:
            rows: (B, N) -> (B, N, D)
        """
        idx = torch.where(rows >= 0, self.sentence_of[rows.clamp(min=0).cpu()].to(rows.device),
                          -1)
        present = idx >= 0
        if not bool(present.any()):
            return None
        enc = encode_rows(encoder, self.tokens, idx[present].cpu().numpy(), self.cache,
                          batch_size=max(int(present.sum()), 1))
        out = torch.full((*rows.shape, enc.shape[-1]), float("nan"), device=enc.device,
                         dtype=enc.dtype)
        return out.index_put((present,), enc)
