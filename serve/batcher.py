"""Dynamic batching: concurrent requests on one key answered by one forward pass.

Requests wait in one queue per key (a support set on one model version). A single consumer
takes the key whose oldest request has waited longest and runs ``run(context, items)`` once
in the model's worker thread on the requests queued there (up to ``max_batch`` items); each
request gets its own slice of the answer back. While a pass runs, new requests queue up, so
under load each pass takes what arrived meanwhile: no wait is needed to fill it (the default
``max_wait_s`` is 0), and a lone request on an idle service runs at once. With ``max_wait_s``
above 0, a batch also waits for more until it holds ``max_batch`` items or its oldest request
has waited that long. A request is never split: one larger than ``max_batch`` runs alone.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Waiting:
    items: Sequence[Any]
    context: Any
    future: asyncio.Future
    arrived: float = field(default=0.0)


class Batcher:
    """Gathers :meth:`submit` calls on one key into calls of ``run``.

    Args:
        run: ``run(context, items) -> answers``, one answer per item, in order; called in
            ``executor`` with the context of the batch's first request (every request of a key
            carries the same context).
        executor: where ``run`` runs (the model's single worker thread).
        max_wait_s: how long the first request of a batch waits for others.
        max_batch: the most items one call of ``run`` takes (a larger request runs alone).
        observe: called with ``(requests, items, seconds)`` after each pass (metrics; the
            seconds ``run`` took in the worker).
    """

    def __init__(self, run: Callable[[Any, list[Any]], Sequence[Any]], executor: Executor,
                 max_wait_s: float, max_batch: int,
                 observe: Callable[[int, int, float], None] | None = None) -> None:
        self.run, self.executor = run, executor
        self.max_wait_s, self.max_batch = max_wait_s, max_batch
        self.observe = observe
        self._queues: OrderedDict[Hashable, deque[_Waiting]] = OrderedDict()
        self._arrived: asyncio.Event | None = None
        self._consumer: asyncio.Task | None = None

    @property
    def waiting(self) -> int:
        """Requests queued and not yet in a pass."""
        return sum(len(q) for q in self._queues.values())

    async def submit(self, key: Hashable, context: Any, items: Sequence[Any]) -> list[Any]:
        """The answers to ``items`` (in order), computed in a batch with other requests on
        ``key``; the exception of ``run`` when its pass failed."""
        loop = asyncio.get_running_loop()
        if self._arrived is None:
            self._arrived = asyncio.Event()
        waiting = _Waiting(list(items), context, loop.create_future(), loop.time())
        self._queues.setdefault(key, deque()).append(waiting)
        self._arrived.set()
        if self._consumer is None or self._consumer.done():
            self._consumer = loop.create_task(self._consume())
        return await waiting.future

    def _size(self, queue: deque[_Waiting]) -> int:
        return sum(len(w.items) for w in queue)

    async def _gather(self, key: Hashable) -> None:
        """Wait for more requests on ``key`` while the batch is short and young."""
        loop = asyncio.get_running_loop()
        queue = self._queues[key]
        deadline = queue[0].arrived + self.max_wait_s
        assert self._arrived is not None
        while self._size(queue) < self.max_batch and (left := deadline - loop.time()) > 0:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                break

    def _take(self, key: Hashable) -> list[_Waiting]:
        """The oldest requests on ``key`` that fit in one batch (at least one)."""
        queue = self._queues[key]
        batch, size = [], 0
        while queue and (not batch or size + len(queue[0].items) <= self.max_batch):
            waiting = queue.popleft()
            if waiting.future.cancelled():  # its client went away before the pass
                continue
            batch.append(waiting)
            size += len(waiting.items)
        if not queue:
            del self._queues[key]
        return batch

    def _timed(self, context: Any, items: list[Any]) -> tuple[Sequence[Any], float]:
        started = time.perf_counter()
        answers = self.run(context, items)
        return answers, time.perf_counter() - started

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queues:
            key = min(self._queues, key=lambda k: self._queues[k][0].arrived)
            await self._gather(key)
            batch = self._take(key)
            if not batch:
                continue
            items = [item for w in batch for item in w.items]
            try:
                answers, seconds = await loop.run_in_executor(
                    self.executor, self._timed, batch[0].context, items)
            except Exception as exc:  # every request of the pass gets the error
                for w in batch:
                    if not w.future.done():
                        w.future.set_exception(exc)
                continue
            if self.observe is not None:
                self.observe(len(batch), len(items), seconds)
            start = 0
            for w in batch:
                if not w.future.done():
                    w.future.set_result(list(answers[start : start + len(w.items)]))
                start += len(w.items)
