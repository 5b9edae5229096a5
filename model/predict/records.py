"""Support and query records as users give them, read into what :class:`Predictor` takes.

A support record is ``{"relation": "P40", <sentence>}`` (a relation with no sentence is
predicted from its prior alone), optionally with the relation's ``name`` and ``description``;
a query record is a sentence (:func:`~model.predict.sentences.parse_sentence`), optionally with
an ``id`` and a gold ``relation``. ``regrab-predict`` reads them from files, ``regrab-serve``
from request bodies; both name a bad record by ``where`` it came from (a file's line, a
body's field) in one :class:`~pipeline.errors.PipelineError` line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from model.predict.sentences import Sentence, has_sentence, parse_sentence
from pipeline.errors import PipelineError


def support_from_records(records: Iterable[tuple[str, Any]], zero_shot: Iterable[str] = (),
                         source: str = "the support", zero_shot_source: str = "zero-shot"
                         ) -> dict[str, list[Sentence]]:
    """``{relation: [sentence, ...]}`` in order of first appearance (an empty list: zero-shot).

    Args:
        records: ``(where, record)`` pairs; a record that is a :class:`PipelineError` (a file
            line that is not JSON) stops with it.
        zero_shot: relations predicted from their prior alone.
        source, zero_shot_source: how messages name the records and the zero-shot ids.

    Raises:
        PipelineError: ``where: what is wrong``, or a relation that is both.
    """
    support: dict[str, list[Sentence]] = {}
    for where, rec in records:
        if isinstance(rec, PipelineError):
            raise PipelineError(f"{where}: {rec}")
        if not isinstance(rec, dict) or not isinstance(rec.get("relation"), str):
            raise PipelineError(f"{where}: needs a string 'relation' (a Wikidata id such "
                                "as P19) and optionally a sentence")
        sentences = support.setdefault(rec["relation"], [])
        if has_sentence(rec):
            try:
                sentences.append(parse_sentence(rec))
            except PipelineError as exc:
                raise PipelineError(f"{where}: {exc}") from None
    for r in zero_shot:
        if support.get(r):
            raise PipelineError(f"relation {r} has support sentences in {source} and is also "
                                f"in {zero_shot_source}; drop one of the two")
        support.setdefault(r, [])
    if not support:
        raise PipelineError(f"no candidate relations: give {source} rows and/or "
                            f"{zero_shot_source} ids")
    return support


def shown_text(text: Any, width: int = 60) -> str:
    """A relation's text (a tuple of name and description, or anything), cut for one line."""
    shown = " / ".join(t for t in text if t) if isinstance(text, tuple) else repr(text)
    return repr(shown if len(shown) <= width else shown[:width] + "...")


class RelationTexts:
    """Names and descriptions of relations, gathered from several sources; two sources that
    give one relation different text are refused (a JSON reader would keep one silently).

    Args:
        overrides: names that win over every source (``--name REL=NAME``).
    """

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self.names: dict[str, str] = {}
        self.descriptions: dict[str, str] = {}
        self._sources: dict[tuple[str, str], str] = {}

    def put(self, kind: str, relation: str, text: str, source: str) -> None:
        """Record ``text`` as ``relation``'s ``kind`` (``name`` or ``description``)."""
        into = self.names if kind == "name" else self.descriptions
        text = " ".join(text.split())
        if not text or (kind == "name" and relation in self.overrides):
            return
        if relation in into and into[relation] != text:
            raise PipelineError(
                f"relation {relation!r} is given two different {kind}s, "
                f"{shown_text((into[relation],))} in {self._sources[kind, relation]} and "
                f"{shown_text((text,))} in {source}; keep one"
                + (" (--name REL=NAME overrides both)" if kind == "name" else ""))
        into[relation] = text
        self._sources.setdefault((kind, relation), source)

    def put_records(self, records: Iterable[tuple[str, Any]]) -> None:
        """The ``name`` and ``description`` fields of support records (``(where, record)``
        pairs; records that are not objects are skipped: the support reader refuses them).

        Raises:
            PipelineError: a ``name`` or ``description`` that is not text.
        """
        for where, rec in records:
            if not isinstance(rec, dict):
                continue
            for kind in ("name", "description"):
                value = rec.get(kind)
                if value is None:
                    continue
                if not isinstance(value, str):
                    raise PipelineError(f"{where}: '{kind}' is {type(value).__name__}, not "
                                        f"text; write the relation's {kind} as a string")
                self.put(kind, str(rec.get("relation")), value, where)

    def result(self) -> tuple[dict[str, str], dict[str, str]]:
        """``(names, descriptions)``, the overrides winning for the names."""
        return self.names | self.overrides, dict(self.descriptions)


def query_from_record(rec: Any) -> dict[str, Any]:
    """``{"sentence", "id", "gold"}`` of a query record (marked text or a sentence record with
    an optional ``id`` and gold ``relation``).

    Raises:
        PipelineError: the record holds no readable sentence.
    """
    if isinstance(rec, PipelineError):
        raise rec
    sentence = parse_sentence(rec)
    extra = rec if isinstance(rec, dict) else {}
    gold = extra.get("relation")
    return {"sentence": sentence, "id": None if extra.get("id") is None else str(extra["id"]),
            "gold": None if gold is None else str(gold)}
