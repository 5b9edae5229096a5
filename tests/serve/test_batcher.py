"""The batcher gathers concurrent requests on one key into one pass, never mixes keys, keeps
each request's answers in order, bounds the batch, and hands a failed pass's error to every
request in it; the support-set cache evicts the least recently used past its bounds."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from serve.batcher import Batcher
from serve.support_sets import SupportCache, SupportSet


def run_batcher(requests, max_wait_s=0.05, max_batch=100, fail=None):
    """Submit ``requests`` ((key, items) each) at once; returns the answers and the passes."""
    passes = []

    def run(context, items):
        passes.append((context, list(items)))
        if fail is not None and fail in items:
            raise ValueError("bad item")
        return [f"{context}:{x}" for x in items]

    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(run, pool, max_wait_s, max_batch)
            return await asyncio.gather(*(batcher.submit(k, k, items) for k, items in requests),
                                        return_exceptions=True)

    return asyncio.run(main()), passes


def test_concurrent_requests_on_one_key_share_one_pass_in_order():
    answers, passes = run_batcher([("a", [1, 2]), ("a", [3]), ("b", [4]), ("a", [5, 6])])
    assert answers == [["a:1", "a:2"], ["a:3"], ["b:4"], ["a:5", "a:6"]]
    assert sorted(passes) == [("a", [1, 2, 3, 5, 6]), ("b", [4])]


def test_a_batch_holds_at_most_max_batch_items_and_a_large_request_runs_alone():
    answers, passes = run_batcher([("a", [1, 2]), ("a", [3, 4]), ("a", [5, 6, 7, 8, 9])],
                                  max_batch=4)
    assert [items for _, items in passes] == [[1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert answers[2] == [f"a:{x}" for x in (5, 6, 7, 8, 9)]


def test_a_lone_request_waits_at_most_max_wait(monkeypatch):
    """Each wait for company is bounded by what is left of ``max_wait_s`` (checked on the
    waits' timeouts, not on a clock)."""
    waits, wait_for = [], asyncio.wait_for

    def bounded(awaitable, timeout):
        waits.append(timeout)
        return wait_for(awaitable, timeout)

    monkeypatch.setattr(asyncio, "wait_for", bounded)

    async def main():
        with ThreadPoolExecutor(1) as pool:
            return await Batcher(lambda c, items: items, pool, 0.02, 100).submit("a", None, [1])

    assert asyncio.run(main()) == [1]
    assert waits and all(0 < w <= 0.02 for w in waits), waits


def test_without_a_wait_the_requests_that_came_during_a_pass_share_the_next():
    passes, release = [], threading.Event()

    def run(context, items):
        passes.append(list(items))
        release.wait(5)
        return items

    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(run, pool, 0.0, 100)
            first = asyncio.ensure_future(batcher.submit("a", None, [1]))
            while not passes:
                await asyncio.sleep(0.01)
            rest = [asyncio.ensure_future(batcher.submit("a", None, [x])) for x in (2, 3, 4)]
            await asyncio.sleep(0.05)
            release.set()
            return await asyncio.gather(first, *rest)

    assert asyncio.run(main()) == [[1], [2], [3], [4]]
    assert passes == [[1], [2, 3, 4]]


def test_a_failed_pass_fails_its_requests_only():
    answers, passes = run_batcher([("a", [1]), ("a", [2]), ("b", [3])], fail=2)
    assert isinstance(answers[0], ValueError) and isinstance(answers[1], ValueError)
    assert answers[2] == ["b:3"]


def _entry(name, floats=0):
    entry = SupportSet(name, {}, {}, {})
    if floats:
        class State:
            nbytes = floats * 4
        entry.states["v1"] = State()  # type: ignore[assignment]
    return entry


def test_cache_evicts_the_least_recently_used_past_its_count():
    cache = SupportCache(max_sets=2, max_bytes=10**9)
    for name in "abc":
        cache.put(_entry(name))
        if name == "b":
            assert cache.get("a") is not None  # a is now the most recent
        cache.shrink()
    assert "a" in cache and "c" in cache and "b" not in cache and cache.evicted == 1


def test_cache_evicts_past_its_bytes_and_keeps_the_newest_alone():
    cache = SupportCache(max_sets=10, max_bytes=1000)
    cache.put(_entry("a", floats=100))
    cache.put(_entry("b", floats=100))
    assert cache.shrink() == [] and cache.nbytes == 800
    cache.put(_entry("c", floats=100))
    assert cache.shrink() == ["a"]
    cache.put(_entry("huge", floats=10_000))
    assert cache.shrink() == ["b", "c"] and len(cache) == 1  # the newest stays, alone
    cache.keep_version("v2")
    assert cache.nbytes == 0


@pytest.mark.parametrize("shape", [(3, 4)])
def test_support_state_counts_its_tensors(shape):
    from model.predict.predictor import SupportState

    t = torch.zeros(*shape)
    state = SupportState(None, (t, None, t), None, t)  # type: ignore[arg-type]
    assert state.nbytes == 3 * t.numel() * 4
