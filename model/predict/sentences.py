"""Sentences as users give them: marked text, FewRel records or split-file columns.

:func:`parse_sentence` reads text with inline markers (``[E1]Barack Obama[/E1] was born in
[E2]Hawaii[/E2] .``, whitespace tokens), a FewRel record (``tokens``, ``h``, ``t``) or the
columns of :data:`pipeline.schemas.FEWSHOT_SCHEMA` into a :class:`Sentence`; bad input (markers
missing or unbalanced, a span outside the sentence, positions that are not integers, tokens
that are not a list of strings, hold a lone surrogate or a literal entity marker) raises one
:class:`~pipeline.errors.PipelineError` line.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipeline.errors import PipelineError
from pipeline.fewrel import BadRecord, mention_positions, mention_span
from pipeline.schemas import FEWSHOT_SCHEMA

MARKER_RE = re.compile(r"\[(/?)E([12])\]", re.IGNORECASE)
#: Half of a UTF-16 pair (JSON's "\ud800"): no text, and UTF-8 (Arrow, the tokenizer, every
#: output file) cannot encode it.
SURROGATE_RE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Sentence:
    """A tokenised sentence with half-open head and tail token spans."""

    tokens: tuple[str, ...]
    head: tuple[int, int]
    tail: tuple[int, int]

    def __post_init__(self) -> None:
        for i, token in enumerate(self.tokens):
            if SURROGATE_RE.search(token):
                raise PipelineError(f"token {i} {token!r} holds a lone surrogate (half of a "
                                    "UTF-16 pair, e.g. a \\ud800 escape), which is not text; "
                                    "fix the text")
            marker = MARKER_RE.search(token)
            if marker:  # the encoder would take it for the entity's marker: wrong words
                raise PipelineError(
                    f"token {i} {token!r} holds the entity marker {marker.group(0)}, which "
                    "only the entity spans may place; remove it from the tokens (the spans "
                    "say where the entities are)")
        n = len(self.tokens)
        for name, (s, e) in (("head", self.head), ("tail", self.tail)):
            if not (0 <= s < e <= n):
                raise PipelineError(
                    f"{name} span [{s}, {e}) is outside the sentence's {n} tokens; "
                    "fix the span or the tokens"
                )

    def marked(self) -> str:
        """The sentence as text with inline markers (what :func:`parse_marked_text` reads)."""
        marks = [(self.head[0], 1, "[E1]"), (self.head[1], 0, "[/E1]"),
                 (self.tail[0], 1, "[E2]"), (self.tail[1], 0, "[/E2]")]
        words = list(self.tokens)
        for pos, _, mark in sorted(marks, key=lambda m: (m[0], m[1]), reverse=True):
            if mark.startswith("[/"):
                words[pos - 1] = words[pos - 1] + mark
            else:
                words[pos] = mark + words[pos]
        return " ".join(words)


def parse_marked_text(text: str) -> Sentence:
    """Whitespace-tokenise ``text`` and read the entity spans off its inline markers.

    Markers may touch words (``[E1]Obama[/E1]``) and are case-insensitive; each of ``[E1]``,
    ``[/E1]``, ``[E2]``, ``[/E2]`` must occur exactly once, opening before closing, around
    at least one word.
    """
    words = MARKER_RE.sub(lambda m: f" {m.group(0).upper()} ", text).split()
    if not any(MARKER_RE.fullmatch(w) for w in words):
        raise PipelineError("no entity markers; mark the head as [E1]...[/E1] and the tail as "
                            "[E2]...[/E2]")
    tokens: list[str] = []
    at: dict[str, int] = {}
    for w in words:
        if MARKER_RE.fullmatch(w):
            if w in at:
                raise PipelineError(f"marker {w} occurs twice; mark each entity once")
            at[w] = len(tokens)
        else:
            tokens.append(w)
    spans = {}
    for e in ("1", "2"):
        open_, close = f"[E{e}]", f"[/E{e}]"
        if open_ not in at or close not in at:
            missing = open_ if open_ not in at else close
            raise PipelineError(f"unbalanced markers: {missing} is missing; mark the head as "
                                "[E1]...[/E1] and the tail as [E2]...[/E2]")
        if at[close] <= at[open_]:
            raise PipelineError(f"{open_}...{close} encloses no word (or closes before it "
                                "opens); put the entity's words between the markers")
        spans[e] = (at[open_], at[close])
    return Sentence(tuple(tokens), spans["1"], spans["2"])


def _position(value: Any, what: str) -> int:
    """A token position as given: an integer, never a string, float or bool read as one."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise PipelineError(f"{what} position {value!r} is not an integer token index; write "
                            "positions as plain integers such as 0 or 3")
    return int(value)


def _fewrel_span(entity: Any, which: str) -> tuple[int, int]:
    """``[start, end)`` of the first mention of a FewRel ``h``/``t`` entry."""
    try:
        positions = mention_positions(entity)
    except BadRecord:
        raise PipelineError(
            f"'{which}' is not a FewRel entity [name, id, [[positions]]]; fix the record"
        ) from None
    if not positions:
        raise PipelineError(f"'{which}' has no token positions; fix the record")
    return mention_span([_position(p, f"'{which}'") for p in positions])


def has_sentence(record: Mapping[str, Any]) -> bool:
    """Whether a support/query record carries a sentence (else it names a relation only)."""
    return any(record.get(k) is not None for k in ("text", "tokens"))


def parse_sentence(record: str | Mapping[str, Any] | Sentence) -> Sentence:
    """A :class:`Sentence` from marked text, a FewRel record or FEWSHOT_SCHEMA columns.

    Raises:
        PipelineError: unbalanced or missing markers, a span outside the sentence, a record
            with neither ``text`` nor ``tokens``.
    """
    if isinstance(record, Sentence):
        return record
    if isinstance(record, str):
        return parse_marked_text(record)
    if not isinstance(record, Mapping):
        raise PipelineError(f"a sentence is text or a record, not {type(record).__name__}")
    if record.get("text") is not None:
        if not isinstance(record["text"], str):
            raise PipelineError("'text' must be a string with [E1]..[/E1] [E2]..[/E2] markers")
        return parse_marked_text(record["text"])
    tokens = record.get("tokens")
    if tokens is None:
        raise PipelineError("record has no sentence: give 'text' with entity markers, or "
                            "'tokens' with FewRel 'h'/'t' (or head_start/head_end/...)")
    if not isinstance(tokens, list | tuple):  # a string or mapping would iterate as tokens
        raise PipelineError(f"'tokens' must be a list of strings, not {type(tokens).__name__}")
    odd = [t for t in tokens if not isinstance(t, str)]
    if odd:
        raise PipelineError(f"'tokens' must be a list of strings; it holds {odd[0]!r}")
    if record.get("h") is not None and record.get("t") is not None:
        head, tail = _fewrel_span(record["h"], "h"), _fewrel_span(record["t"], "t")
    elif all(record.get(k) is not None for k in ("head_start", "head_end", "tail_start",
                                                 "tail_end")):
        head, tail = ((_position(record[f"{e}_start"], f"{e}_start"),
                       _position(record[f"{e}_end"], f"{e}_end")) for e in ("head", "tail"))
    else:
        raise PipelineError("record has 'tokens' but no entity spans; add FewRel 'h' and 't' "
                            "or head_start/head_end/tail_start/tail_end")
    return Sentence(tuple(tokens), head, tail)


def sentences_table(sentences: Sequence[Sentence]) -> pa.Table:
    """A FEWSHOT_SCHEMA table of ``sentences`` (what the encoder tokenises)."""
    n = len(sentences)
    return pa.table({
        "instance_id": [str(i) for i in range(n)],
        "relation": [""] * n,
        "relation_name": [""] * n,
        "tokens": [list(s.tokens) for s in sentences],
        "head_start": [s.head[0] for s in sentences],
        "head_end": [s.head[1] for s in sentences],
        "tail_start": [s.tail[0] for s in sentences],
        "tail_end": [s.tail[1] for s in sentences],
        "head_id": [None] * n,
        "tail_id": [None] * n,
    }, schema=FEWSHOT_SCHEMA)
