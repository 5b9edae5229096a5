"""Independent jobs in forked worker processes (or in this one), results handed back here.

The ``train`` and ``evaluate`` stages run their models this way (``workers`` in their
params sections). Workers are forked, so they inherit what the stage prepared (graph, tokens,
caches) without pickling it; each sets its own torch thread count and, on Linux, ends when
the stage's process does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pipeline.config import set_threads


def _worker_start(threads: int) -> None:
    """A worker: its own torch thread count; it ends with the stage (Linux)."""
    set_threads(threads)
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere a killed stage may leave a worker to finish its job


def run_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int, threads: int,
             done: Callable[[int, Any], None]) -> None:
    """Call ``fn(job)`` for every job, and ``done(i, result)`` here as job ``i`` finishes.

    With one worker the jobs run in order in this process; with more, in that many forked
    processes (CPU only: CUDA does not survive a fork), in the order they finish. ``fn``
    must be picklable (a module-level function, or a ``functools.partial`` of one). On a
    failure the jobs not yet started are dropped; one still running on another worker
    finishes first, then the failure is raised.
    """
    if workers <= 1:
        for i, job in enumerate(jobs):
            done(i, fn(job))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=_worker_start, initargs=(threads,))
    try:
        futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
        for future in as_completed(futures):
            done(futures[future], future.result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
