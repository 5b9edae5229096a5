"""The serving state: the model that answers, the support sets, loading and swapping versions.

Every method here runs on the event loop, except what it hands to a thread: a model's load
(seconds, in a thread of its own) and every forward pass (the model's worker thread, see
:mod:`serve.versions`). A swap loads the new version beside the old one and then replaces
:attr:`Service.current` in one assignment: a request holds the version it started on until it
has answered, and the old version's worker stops after its last request. A load that fails
leaves the old version answering; :meth:`Service.status` (``/ready``) and the log say why.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.predict.predictor import SupportState
from model.predict.sentences import Sentence
from pipeline.errors import PipelineError
from serve.batcher import Batcher
from serve.bodies import BadRequest
from serve.metrics import Metrics
from serve.support_sets import SupportCache, SupportSet, support_id
from serve.versions import Loaded, ModelSpec, registry_version

log = logging.getLogger("regrab.serve")

#: Polls before a version whose load failed is tried again (the wait doubles each time).
RETRY_POLLS = 10
#: The longest wait before a failed version is tried again.
RETRY_MAX_S = 1800.0


@dataclass(frozen=True)
class Settings:
    """How the service runs (``regrab-serve``'s options)."""

    root: Path
    device: str
    predictor: dict[str, Any]
    max_wait_s: float
    max_batch: int
    cache_sets: int
    cache_bytes: int
    threads: int = 0


class Service:
    """The model answering, the ones loading, and the cached support sets."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.cache = SupportCache(settings.cache_sets, settings.cache_bytes)
        self.current: Loaded | None = None
        self.loading: str | None = None
        self.last_error: str | None = None
        self._load_lock = asyncio.Lock()
        self._encoding: dict[tuple[str, str], asyncio.Future] = {}
        self._evictions_counted = 0

    # --- versions ------------------------------------------------------------------------

    async def load(self, spec: ModelSpec) -> Loaded:
        """Load ``spec`` beside the answering version, then switch to it.

        Raises:
            PipelineError: the load failed; the version answering before goes on answering.
        """
        async with self._load_lock:  # one load at a time: two would double the memory
            self.loading = str(spec)
            log.info("loading %s%s", spec, "" if self.current is None
                     else f" beside {self.current.version}")
            try:
                loaded = await asyncio.to_thread(
                    Loaded.load, spec, self.settings.root, self.settings.device,
                    self.settings.threads, **self.settings.predictor)
            except Exception as exc:
                detail = str(exc) if isinstance(exc, PipelineError) \
                    else f"{type(exc).__name__}: {exc}"
                self.last_error = f"loading {spec} failed: {detail}"
                self.metrics.loads.labels("failed").inc()
                log.error("%s; %s", self.last_error, "still answering with "
                          f"{self.current.version}" if self.current else "no model answers")
                raise PipelineError(self.last_error) from None
            finally:
                self.loading = None
            loaded.batcher = Batcher(self._run, loaded.executor, self.settings.max_wait_s,
                                     self.settings.max_batch, self.metrics.batch)
            old, self.current = self.current, loaded  # the switch: one assignment
            self.last_error = None
            self.cache.keep_version(loaded.version)
            self.metrics.loads.labels("ok").inc()
            self.metrics.ready.set(1)
            self.metrics.model.info({"version": loaded.version})
            if old is not None:
                old.retire()
            log.info("answering with %s%s", loaded.version,
                     "" if old is None else f" (was {old.version})")
            return loaded

    async def watch(self, spec: ModelSpec, every_s: float) -> None:
        """Every ``every_s`` seconds, load the version ``spec`` resolves to when it is not
        the one answering (a promotion). A version whose load failed (its bytes not pushed
        yet, say) is tried again after :data:`RETRY_POLLS` polls, then twice as many, and
        so on up to every :data:`RETRY_MAX_S` seconds, unless the reference moves on."""
        loop = asyncio.get_running_loop()
        failed: str | None = None
        retry_at, backoff = 0.0, 0.0
        while True:
            await asyncio.sleep(every_s)
            try:
                tag = await asyncio.to_thread(registry_version, spec, self.settings.root)
            except PipelineError as exc:
                log.warning("registry poll: %s", exc)
                continue
            answering = self.current.tag if self.current else None
            if tag is None or tag == answering or self._load_lock.locked():
                continue
            if tag == failed and loop.time() < retry_at:
                continue
            log.info("registry: %s now resolves to %s%s", spec, tag,
                     " (trying again)" if tag == failed else "")
            try:
                await self.load(spec)
                failed = None
            except PipelineError:
                backoff = min(2 * backoff if tag == failed else RETRY_POLLS * every_s,
                              RETRY_MAX_S)
                failed, retry_at = tag, loop.time() + backoff

    def status(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, body)`` of ``/ready``."""
        body = {"ready": self.current is not None,
                "version": self.current.version if self.current else None,
                "loading": self.loading, "last_error": self.last_error,
                "support_sets": len(self.cache)}
        if self.current is None:
            body["reason"] = (f"loading {self.loading}" if self.loading
                              else self.last_error or "no model loaded")
        return self.current is not None, body

    def acquire(self) -> Loaded:
        """The answering version, held until :meth:`Loaded.release`."""
        if self.current is None:
            raise BadRequest(503, "model", "no model is loaded yet ("
                             + (self.status()[1]["reason"]) + "); retry when GET /ready "
                             "says ready")
        return self.current.acquire()

    # --- support sets and predictions ----------------------------------------------------

    async def register(self, loaded: Loaded, support: dict[str, list[Sentence]],
                       names: dict[str, str], descriptions: dict[str, str]
                       ) -> tuple[SupportSet, SupportState]:
        """Cache a support set by its content id (or find it cached), encoded on ``loaded``;
        a set the model refuses (a zero-shot relation it cannot predict) is not kept."""
        entry = SupportSet(support_id(support, names, descriptions), support, names,
                           descriptions)
        entry = self.cache.get(entry.id) or entry
        state = await self.state(loaded, entry)
        self.cache.put(entry)
        for gone in self.cache.shrink():
            log.info("evicted support set %s", gone)
        self._cache_metrics()
        return entry, state

    def lookup(self, set_id: str) -> SupportSet:
        found = self.cache.get(set_id)
        if found is None:
            raise BadRequest(404, "support_set_id", (
                f"support set {set_id!r} is not cached here (evicted to make room, never "
                "registered, or registered before a restart); register it again with POST "
                "/v1/support-sets (the same body gives the same id), or send it inline as "
                "'support'"))
        return found

    async def state(self, loaded: Loaded, entry: SupportSet) -> SupportState:
        """``entry`` encoded on ``loaded`` (once per version; concurrent first uses share
        one encoding)."""
        if (found := entry.states.get(loaded.version)) is not None:
            return found
        key = (entry.id, loaded.version)
        pending = self._encoding.get(key)
        if pending is None:
            loop = asyncio.get_running_loop()
            pending = loop.run_in_executor(loaded.executor, self._encode, loaded, entry)
            self._encoding[key] = pending
            pending.add_done_callback(lambda _: self._encoding.pop(key, None))
        try:
            state = await asyncio.shield(pending)
        except PipelineError as exc:
            raise BadRequest(422, "support", f"support: {exc}") from None
        if loaded is self.current:  # an old version's states are not worth the memory
            entry.states[loaded.version] = state
        return state

    def _encode(self, loaded: Loaded, entry: SupportSet) -> SupportState:
        """In the model's worker thread: encode the support and keep its state."""
        predictor = loaded.predictor
        predictor.set_support(entry.support, names=entry.names,
                              descriptions=entry.descriptions)
        self.metrics.support_encoded.inc()
        return predictor.support_state()

    @staticmethod
    def _run(context: tuple[Loaded, SupportState], sentences: list[Sentence]
             ) -> list[dict[str, Any]]:
        """In the model's worker thread: one forward pass over a batch's queries."""
        loaded, state = context
        loaded.predictor.use_support(state)
        return loaded.predictor.predict(sentences).records()

    async def predict(self, loaded: Loaded, entry: SupportSet,
                      queries: Sequence[dict[str, Any]]
                      ) -> tuple[list[str], list[dict[str, Any]]]:
        """The candidate relations and the rows of ``queries`` (from
        :func:`serve.bodies.read_queries`) on ``loaded``."""
        state = await self.state(loaded, entry)
        if entry.id not in self.cache:  # evicted meanwhile: kept again, it is in use
            self.cache.put(entry)
            self._cache_metrics()
        records = await loaded.batcher.submit(entry.id, (loaded, state),
                                              [q["sentence"] for q in queries])
        return state.summary.relations, [
            {"index": i, "id": q["id"], "text": q["sentence"].marked(), **rec, "gold": q["gold"]}
            for i, (q, rec) in enumerate(zip(queries, records, strict=True))]

    def _cache_metrics(self) -> None:
        self.metrics.support_sets.set(len(self.cache))
        self.metrics.support_bytes.set(self.cache.nbytes)
        self.metrics.evicted.inc(self.cache.evicted - self._evictions_counted)
        self._evictions_counted = self.cache.evicted

    def close(self) -> None:
        """Stop every worker (at shutdown, after the last request)."""
        if self.current is not None:
            self.current.retire()
