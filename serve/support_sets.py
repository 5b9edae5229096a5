"""Registered support sets: their sentences, and their encodings per model version, in an
LRU cache bounded in count and in bytes.

A set's id is a digest of its content (relations in order, sentences, names, descriptions),
so registering the same set twice gives the same id and an evicted set comes back under its
old id. Its encodings and posterior inputs (:class:`~model.predict.predictor.SupportState`)
are computed once per model version, when a request first needs them: after a version swap
the cached sets are encoded again lazily, on the new version, and the old version's states
are dropped.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field

from model.predict.predictor import SupportState
from model.predict.sentences import Sentence

#: Characters of the sha256 hex digest in a support set's id.
ID_DIGITS = 24


def support_id(support: dict[str, list[Sentence]], names: dict[str, str],
               descriptions: dict[str, str]) -> str:
    """The content digest a support set is known by."""
    payload = json.dumps({"support": [[r, [[list(s.tokens), s.head, s.tail] for s in sents]]
                                      for r, sents in support.items()],
                          "names": sorted(names.items()),
                          "descriptions": sorted(descriptions.items())},
                         ensure_ascii=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:ID_DIGITS]


@dataclass
class SupportSet:
    """One support set: what the predictor's ``set_support`` takes, and its states."""

    id: str
    support: dict[str, list[Sentence]]
    names: dict[str, str]
    descriptions: dict[str, str]
    states: dict[str, SupportState] = field(default_factory=dict)

    @property
    def sentences(self) -> int:
        return sum(map(len, self.support.values()))

    @property
    def nbytes(self) -> int:
        """Bytes held: the encodings of every version, and the tokens (about 64 bytes each)."""
        tokens = sum(len(s.tokens) for sents in self.support.values() for s in sents)
        return sum(s.nbytes for s in self.states.values()) + 64 * tokens


class SupportCache:
    """Support sets by id, least recently used evicted first.

    Args:
        max_sets: the most sets kept.
        max_bytes: the most bytes their encodings and tokens hold (one set larger than this
            is kept alone until the next one comes).
    """

    def __init__(self, max_sets: int, max_bytes: int) -> None:
        self.max_sets, self.max_bytes = max_sets, max_bytes
        self._sets: OrderedDict[str, SupportSet] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._sets)

    def __contains__(self, set_id: str) -> bool:
        return set_id in self._sets

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._sets.values())

    def get(self, set_id: str) -> SupportSet | None:
        """The set (now the most recently used), or None when it is not cached."""
        found = self._sets.get(set_id)
        if found is not None:
            self._sets.move_to_end(set_id)
        return found

    def put(self, entry: SupportSet) -> SupportSet:
        """Keep ``entry`` (or the cached set of the same id, which it is) as the most recently
        used; :meth:`shrink` evicts past the bounds. Returns the cached set."""
        kept = self._sets.setdefault(entry.id, entry)
        self._sets.move_to_end(entry.id)
        return kept

    def shrink(self) -> list[str]:
        """Evict least recently used sets until the bounds hold (the newest always stays);
        returns their ids. Called again when a set's encodings grow."""
        gone = []
        while len(self._sets) > 1 and (len(self._sets) > self.max_sets
                                       or self.nbytes > self.max_bytes):
            set_id, _ = self._sets.popitem(last=False)
            gone.append(set_id)
        self.evicted += len(gone)
        return gone

    def keep_version(self, version: str) -> None:
        """Drop every state that is not of ``version`` (after a swap to it)."""
        for entry in self._sets.values():
            entry.states = {v: s for v, s in entry.states.items() if v == version}
