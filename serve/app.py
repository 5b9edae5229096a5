"""The HTTP endpoints of ``regrab-serve`` (FastAPI; the schema and a console at ``/docs``).

    POST /v1/support-sets   register a support set; its id (a digest of its content)
    POST /v1/predict        queries against a support_set_id or an inline support set
    POST /admin/load        load {"model": REF} or {"checkpoint": PATH} beside, then switch
    GET  /health            the process answers
    GET  /ready             a model answers (503 while the first loads, or after it failed)
    GET  /metrics           Prometheus metrics

Every answer of a prediction names the ``version`` that computed it. Every refusal is JSON
``{"error": "<what is wrong and how to fix it>", "field": "<the field at fault>"}`` with a 4xx
status. With a token, every endpoint but ``/health``, ``/ready`` and the docs wants
``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from pipeline.errors import PipelineError
from serve.bodies import (
    BadRequest,
    Limits,
    LoadBody,
    PredictBody,
    SupportBody,
    read_queries,
    read_support,
    validation_error,
)
from serve.service import Service
from serve.versions import ModelSpec

log = logging.getLogger("regrab.serve")
ENDPOINTS = ("/v1/support-sets", "/v1/predict", "/admin/load", "/health", "/ready",
             "/metrics")


def _json(body: dict[str, Any], status: int = 200) -> Response:
    """``body`` as JSON by orjson: the answers' floats and rows written without FastAPI's
    per-value encoder, which cost more than the request's parsing."""
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error(status: int, field: str | None, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status)


class Guard:
    """Pure ASGI middleware: metrics of every request, and the body size limit (413 before
    the body is read whole, whether it has a Content-Length or comes in chunks)."""

    def __init__(self, app: Any, service: Service, limits: Limits) -> None:
        self.app, self.service, self.limits = app, service, limits
        self.accepted = self.answered = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else "other"
        metrics, started, status = self.service.metrics, time.perf_counter(), [500]
        limit, seen = self.limits.body_bytes, [0]
        length = dict(scope.get("headers") or {}).get(b"content-length", b"")
        self.accepted += 1
        metrics.in_flight.inc()

        async def counted_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        async def limited_receive() -> dict:
            message = await receive()
            seen[0] += len(message.get("body", b""))
            if seen[0] > limit:
                raise _TooLarge
            return message

        try:
            if length.isdigit() and int(length) > limit:
                raise _TooLarge
            await self.app(scope, limited_receive, counted_send)
        except _TooLarge:
            status[0] = 413
            await _error(413, "body", f"the body is over {limit:,} bytes, the most this "
                         "service reads; send fewer queries or support rows per request")(
                scope, receive, send)
        finally:
            metrics.in_flight.dec()
            self.answered += 1
            metrics.requests.labels(endpoint, str(status[0])).inc()
            if status[0] >= 400:
                metrics.errors.labels(endpoint, str(status[0])).inc()
            metrics.latency.labels(endpoint).observe(time.perf_counter() - started)


class _TooLarge(Exception):
    pass


def create_app(service: Service, limits: Limits, first: ModelSpec | None = None,
               token: str | None = None, watch_s: float | None = None) -> FastAPI:
    """The application: it loads ``first`` when it starts (``/ready`` says 503 until then)
    and, with ``watch_s``, polls the registry for a new version of ``first``."""
    tasks: list[asyncio.Task] = []

    async def load_first() -> None:
        with contextlib.suppress(PipelineError):  # the log and /ready say why
            await service.load(first)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if first is not None:
            tasks.append(asyncio.create_task(load_first()))
            if watch_s:
                tasks.append(asyncio.create_task(service.watch(first, watch_s)))
        yield
        for task in tasks:
            task.cancel()
        service.close()
        log.info("stopped: %d requests accepted, %d answered", guard.accepted, guard.answered)

    app = FastAPI(title="regrab-serve", lifespan=lifespan,
                  description="Few-shot relation extraction with uncertainty: a trained "
                              "REGRAB model kept loaded (docs/using-models.md).")
    guard: Guard

    def build_guard(inner: Any) -> Guard:
        nonlocal guard
        guard = Guard(inner, service, limits)
        return guard

    app.add_middleware(build_guard)  # type: ignore[arg-type]

    def authorised(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not (given.startswith("Bearer ")
                and secrets.compare_digest(given[7:].encode(), token.encode())):
            raise BadRequest(401, "Authorization", "this service wants a token: send the "
                             "header 'Authorization: Bearer <token>' with the token it was "
                             "started with (--token or REGRAB_SERVE_TOKEN)")

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return _error(exc.status, exc.field, exc.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        bad = validation_error(list(exc.errors()))
        return _error(bad.status, bad.field, bad.message)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        fix = {404: "the endpoints are listed at /docs", 405: "see /docs for the methods",
               400: "send one JSON object, with Content-Type: application/json"}
        return _error(exc.status_code, "body" if exc.status_code == 400 else None,
                      f"{exc.detail}; {fix.get(exc.status_code, 'see /docs')}")

    @app.exception_handler(PipelineError)
    async def model_error(request: Request, exc: PipelineError) -> JSONResponse:
        log.error("%s %s: %s", request.method, request.url.path, exc)
        return _error(500, None, str(exc))

    guarded = [Depends(authorised)]

    @app.post("/v1/support-sets", status_code=201, dependencies=guarded)
    async def register(body: SupportBody) -> Response:
        """Register a support set: encoded once per model version, cached by its id."""
        support, names, descriptions = read_support(body, limits)
        loaded = service.acquire()
        try:
            entry, state = await service.register(loaded, support, names, descriptions)
        finally:
            loaded.release()
        summary = state.summary
        return _json({"support_set_id": entry.id, "version": loaded.version,
                      "relations": summary.relations, "shots": summary.shots,
                      "priors": summary.priors, "handling": summary.handling,
                      "notes": summary.notes, "support_flagged": state.check.count,
                      "summary": [*summary.lines(), state.check.line()]}, 201)

    @app.post("/v1/predict", dependencies=guarded)
    async def predict(body: PredictBody) -> Response:
        """Label queries; the rows are regrab-predict's, plus the version that answered."""
        queries = read_queries(body.queries, limits)
        inline = bool(body.support or body.zero_shot or body.names)
        if body.support_set_id is not None and inline:
            raise BadRequest(422, "support", "give support_set_id or an inline support set "
                             "(support, zero_shot, names), not both")
        if body.support_set_id is None and not inline:
            raise BadRequest(422, "support_set_id", "no support set: give support_set_id "
                             "(from POST /v1/support-sets) or an inline 'support' list")
        entry = None if body.support_set_id is None else service.lookup(body.support_set_id)
        texts = None if entry is not None else read_support(body, limits)
        loaded = service.acquire()
        try:
            if entry is None:
                assert texts is not None
                entry, _ = await service.register(loaded, *texts)
            relations, rows = await service.predict(loaded, entry, queries)
        finally:
            loaded.release()
        return _json({"version": loaded.version, "support_set_id": entry.id,
                      "relations": relations, "predictions": rows})

    @app.post("/admin/load", dependencies=guarded)
    async def admin_load(body: LoadBody) -> dict[str, Any]:
        """Load a version beside the answering one and switch to it when it is loaded;
        requests already running finish on the old one."""
        if (body.model is None) == (body.checkpoint is None):
            raise BadRequest(422, "model", "give one of 'model' (a registry reference such "
                             "as regrab@v0.3.0) or 'checkpoint' (a path on the server)")
        try:
            spec = ModelSpec(checkpoint=None if body.checkpoint is None else
                             Path(body.checkpoint), ref=body.model)
        except PipelineError as exc:
            raise BadRequest(422, "model", str(exc)) from None
        try:
            loaded = await service.load(spec)
        except PipelineError as exc:
            still = service.current.version if service.current else "no model"
            raise BadRequest(422, "model" if body.model else "checkpoint",
                             f"{exc}; still answering with {still}") from None
        return {"version": loaded.version}

    @app.get("/health")
    async def health() -> dict[str, str]:
        """The process answers (a model may still be loading: see /ready)."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """200 with the version when a model answers; 503 with the reason when none does."""
        ok, body = service.status()
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", dependencies=guarded)
    async def metrics() -> Response:
        """Prometheus metrics."""
        return Response(generate_latest(service.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    return app
