"""Request bodies of ``regrab-serve``: their schemas (the OpenAPI docs at ``/docs``), their
limits, and how they are read into what the predictor takes.

Support rows and queries are the records of ``regrab-predict``'s files, as JSON
(:mod:`model.predict.records`): a support row ``{"relation": "P40", "text": "[E1]..[/E1] ..
[E2]..[/E2] ."}`` (or a FewRel record, or split columns; ``name`` and ``description``
optional), a query marked text or such a record with an optional ``id`` and gold
``relation``. Every refusal is a :class:`BadRequest`: the HTTP status, the field at fault
(``queries[3]``) and one line saying what is wrong and how to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from model.predict.records import RelationTexts, query_from_record, support_from_records
from model.predict.sentences import SURROGATE_RE, Sentence
from pipeline.errors import PipelineError

SENTENCE_FORMS = ("marked text \"[E1]Barack Obama[/E1] was born in [E2]Hawaii[/E2] .\", or a "
                  "record with 'text', or 'tokens' with FewRel 'h'/'t' or "
                  "head_start/head_end/tail_start/tail_end")


class BadRequest(Exception):
    """A request refused: ``status``, the ``field`` at fault and the one-line ``message``."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (``regrab-serve --help`` says how they were chosen)."""

    body_bytes: int
    queries: int
    support_sentences: int
    relations: int


class SupportBody(BaseModel):
    """A support set: labelled sentences, and relations predicted from their prior alone."""

    model_config = ConfigDict(extra="forbid")
    support: list[dict[str, Any]] = Field(
        default_factory=list, description="support rows {relation, <sentence>, name?, "
        "description?}, the lines of regrab-predict's --support file")
    zero_shot: list[str] = Field(default_factory=list, description="relation ids predicted "
                                 "from their prior alone (regrab-predict --zero-shot)")
    names: dict[str, str] = Field(default_factory=dict, description="names of relations "
                                  "outside the model's graph, {relation: name} (--name)")


class PredictBody(SupportBody):
    """Queries, against a registered support set (``support_set_id``) or one given inline."""

    support_set_id: str | None = Field(default=None, description="an id from POST "
                                       "/v1/support-sets (then give no support here)")
    queries: list[str | dict[str, Any]] = Field(description="sentences to label: "
                                                + SENTENCE_FORMS)


class LoadBody(BaseModel):
    """A model to load beside the serving one and switch to."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, description="registry reference: regrab (the "
                              "promoted version), regrab@v0.3.0, regrab#prod[:member]")
    checkpoint: str | None = Field(default=None, description="a checkpoint path on the "
                                   "server (model.safetensors or an exported folder)")


def _text_field(value: str, field: str) -> str:
    if SURROGATE_RE.search(value):
        raise BadRequest(422, field, f"{field} holds a lone surrogate (half of a UTF-16 pair, "
                                     "a \\ud800-\\udfff escape), which is not text; fix it")
    return value


def read_support(body: SupportBody, limits: Limits
                 ) -> tuple[dict[str, list[Sentence]], dict[str, str], dict[str, str]]:
    """``(support, names, descriptions)`` of a body, for ``Predictor.set_support``.

    Raises:
        BadRequest: 413 past the limits, 422 for a row that is not a support row.
    """
    rows = body.support
    if len(rows) > limits.support_sentences:
        raise BadRequest(413, "support", f"support has {len(rows):,} rows, more than the "
                         f"{limits.support_sentences:,} this service takes; give fewer "
                         "sentences per relation")
    for i, r in enumerate(body.zero_shot):
        _text_field(r, f"zero_shot[{i}]")
    for rel, name in body.names.items():
        _text_field(rel, "names"), _text_field(name, f"names[{rel!r}]")
    for i, row in enumerate(rows):
        for key in ("relation", "name", "description", "id"):
            if isinstance(row.get(key), str):
                _text_field(row[key], f"support[{i}].{key}")
    try:
        support = support_from_records(
            ((f"support[{i}]", row) for i, row in enumerate(rows)), body.zero_shot,
            source="support", zero_shot_source="zero_shot")
        texts = RelationTexts(dict(body.names))
        texts.put_records((f"support[{i}]", row) for i, row in enumerate(rows))
    except PipelineError as exc:
        message = str(exc)
        field = message.split(":", 1)[0] if message.startswith("support[") else "support"
        raise BadRequest(422, field, message) from None
    if len(support) > limits.relations:
        raise BadRequest(413, "support", f"{len(support):,} candidate relations, more than "
                         f"the {limits.relations:,} this service takes; give fewer relations")
    names, descriptions = texts.result()
    return support, names, descriptions


def read_queries(queries: list[Any], limits: Limits) -> list[dict[str, Any]]:
    """``{"sentence", "id", "gold"}`` per query.

    Raises:
        BadRequest: 413 for more queries than the limit, 422 naming the first bad query.
    """
    if not queries:
        raise BadRequest(422, "queries", "queries is empty; give at least one sentence: "
                         + SENTENCE_FORMS)
    if len(queries) > limits.queries:
        raise BadRequest(413, "queries", f"{len(queries):,} queries, more than the "
                         f"{limits.queries:,} one request takes; split them into requests of "
                         f"at most {limits.queries:,}")
    read = []
    for i, rec in enumerate(queries):
        try:
            if isinstance(rec, dict) and isinstance(rec.get("id"), str):
                _text_field(rec["id"], f"queries[{i}].id")
            read.append(query_from_record(rec))
        except PipelineError as exc:
            raise BadRequest(422, f"queries[{i}]", f"queries[{i}]: {exc}") from None
    return read


def validation_error(errors: list[dict[str, Any]]) -> BadRequest:
    """The first of pydantic's errors (FastAPI's ``RequestValidationError``) as one line."""
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid", "type": ""}
    loc = [p for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return BadRequest(400, "body", "the body is not JSON ("
                          f"{first.get('ctx', {}).get('error', first.get('msg'))}); send one "
                          "JSON object, with Content-Type: application/json")
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    field = field or "body"
    kind = first.get("type", "")
    if kind == "missing":
        fix = f"add '{field}'" + (f" ({SENTENCE_FORMS})" if field == "queries" else "")
    elif kind == "extra_forbidden":
        fix = f"remove '{field}' (unknown field); see the schema at /docs"
    elif field == "body" or kind in ("model_attributes_type", "dict_type"):
        fix = "send a JSON object; its fields are at /docs"
    else:
        fix = {"queries": "give a list of sentences: " + SENTENCE_FORMS,
               "support": "give a list of rows {\"relation\": \"P40\", \"text\": ...}",
               "zero_shot": "give a list of relation ids such as [\"P19\"]",
               "names": "give an object {relation: name}"}.get(
                   field.split("[")[0].split(".")[0], "see the schema at /docs")
    return BadRequest(422, field, f"{field}: {first.get('msg', 'invalid')}; {fix}")
