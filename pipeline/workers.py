"""The one job runner of the ``train``, ``evaluate``, ``transfer`` and ``active_labelling`` stages.

A stage plans its work as a list of independent jobs and hands the runner that list and a
function that runs one job. The runner

1. decides how many processes may run at once (:func:`usable_workers`: ``workers`` on the
   CPU, one on CUDA, never more than there are jobs);
2. runs the jobs in plan order, in this process or in that many forked workers, or, when
   the stage names a Dask scheduler (``--cluster`` / ``$REGRAB_DASK_ADDRESS``), on the
   cluster's workers (:mod:`pipeline.dask_jobs`), with the files each job reads and writes
   carried to and from them;
3. logs each finished job with the minutes left (from the seconds per unit of ``cost`` so
   far), and on a cluster the worker that ran it;
4. returns the results in plan order, whichever worker finished first.

Workers are forked, so ``fn`` and whatever it closes over (graph, tokens, caches) reach
them without pickling: bind the stage's read-only state into ``fn`` (a closure or a
``functools.partial``) before calling :func:`run_jobs`; nothing is kept at module level.
Only a job's index goes to a worker and only its result (or its failure) comes back. Each
worker sets its own torch thread count and, on Linux, ends when the stage's process does.

A failing job fails the stage: the jobs not yet started are dropped, one still running on
another worker finishes first (a trained model is then reused by the next run), and the
failure is raised here; a :class:`~pipeline.errors.PipelineError` keeps its one line,
prefixed with the job's name.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.config import set_threads
from pipeline.errors import PipelineError
from pipeline.shipping import JobFiles


def usable_workers(workers: int, device: Any, jobs: int | None = None) -> int:
    """Processes that may run jobs at once: ``workers`` on the CPU, one on CUDA (CUDA does
    not survive a fork, and one process keeps a GPU busy), at most ``jobs`` and at least 1
    when the number of jobs is given."""
    count = workers if str(device) == "cpu" else 1
    return count if jobs is None else max(1, min(count, jobs))


def run_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], *, workers: int, threads: int,
             describe: Callable[[Any], str], log: logging.Logger,
             cost: Callable[[Any], float] | None = None, cluster: str | None = None,
             files: JobFiles | None = None, gpu: bool = False) -> list[Any]:
    """``[fn(job) for job in jobs]``, run by up to ``workers`` processes or on a cluster.

    Args:
        fn: runs one job; with several workers it runs in a forked process, so its result
            must be picklable (``fn`` itself need not be); on a cluster ``fn`` is pickled
            with cloudpickle (closures and lambdas too) and sent once to each worker.
        jobs: the plan, in the order the results are returned.
        workers: processes at once (:func:`usable_workers`); 1 runs every job here.
        threads: torch threads of each forked worker.
        describe: a job's name in the progress and error lines.
        log: the stage's logger, for one progress line per finished job.
        cost: a job's share of the work, for the minutes left (default: 1 each).
        cluster: a Dask scheduler's address: run the jobs there (``workers`` is then the
            cluster's); None runs them on this machine.
        files: what a job reads and writes on this machine, carried to and from a cluster's
            workers (none: the workers must see the same files at the same paths).
        gpu: the jobs run on CUDA: on a cluster, each asks a worker for one ``GPU``.

    Returns:
        The results in plan order.
    """
    workers = max(1, min(workers, len(jobs)))
    progress = _Progress(jobs, describe, cost or (lambda job: 1.0), workers, log,
                         time.perf_counter())
    if cluster and jobs:
        from pipeline.dask_jobs import run_on_cluster

        def able(count: int) -> None:
            progress.workers = max(1, min(count, len(jobs)))

        return run_on_cluster(fn, jobs, address=cluster, threads=threads,
                              files=files or JobFiles(reads=lambda job: ()), gpu=gpu,
                              describe=describe, done=progress.done, workers=able,
                              raised=_raised)
    if workers == 1:
        results = []
        for job in jobs:
            start = time.perf_counter()
            try:
                results.append(fn(job))
            except PipelineError as exc:
                raise PipelineError(f"{describe(job)}: {exc}") from exc
            progress.done(job, time.perf_counter() - start)
        return results
    return _run_forked(fn, jobs, workers, threads, describe, progress)


@dataclass
class _Progress:
    """Counts finished jobs and estimates the minutes left."""

    jobs: Sequence[Any]
    describe: Callable[[Any], str]
    cost: Callable[[Any], float]
    workers: int
    log: logging.Logger
    start: float  # when the stage started its jobs
    finished: int = 0
    seconds: float = 0.0  # spent by the finished jobs
    spent: float = 0.0  # their cost

    def done(self, job: Any, took: float, worker: str | None = None) -> None:
        """Log a finished job (and, on a cluster, the worker that ran it)."""
        self.finished += 1
        self.seconds += took
        self.spent += self.cost(job)
        left = sum(self.cost(j) for j in self.jobs) - self.spent
        per_unit = self.seconds / self.spent if self.spent else 0.0
        where = "" if worker is None else f" on {worker}"
        self.log.info("%s done in %.0f s%s (%d of %d, %.0f s so far, about %.0f min left)",
                      self.describe(job), took, where, self.finished, len(self.jobs),
                      time.perf_counter() - self.start,
                      max(left, 0.0) * per_unit / self.workers / 60)


class RemoteTraceback(Exception):
    """The traceback of a failure in a worker process (the cause of the error raised here)."""


@dataclass
class _Worker:
    process: Any  # multiprocessing.Process
    conn: Any  # this end of its pipe
    job: int | None = None  # index of the job it runs now


def _run_forked(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int, threads: int,
                describe: Callable[[Any], str], progress: _Progress) -> list[Any]:
    """The jobs in ``workers`` forked processes, each handed the next job when it is free."""
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("fork")
    pool = []
    for _ in range(workers):
        here, there = ctx.Pipe()
        process = ctx.Process(target=_serve, args=(fn, jobs, threads, there))
        process.start()
        there.close()
        pool.append(_Worker(process, here))
    results: list[Any] = [None] * len(jobs)
    following = iter(range(len(jobs)))
    failure: BaseException | None = None
    try:
        while True:
            for worker in pool:
                if failure is None and worker.job is None:
                    worker.job = next(following, None)
                    if worker.job is not None:
                        worker.conn.send(worker.job)
            busy = [w for w in pool if w.job is not None]
            if not busy:
                break
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
            for worker in busy:
                if worker.conn not in ready and worker.process.sentinel not in ready:
                    continue
                i, worker.job = worker.job, None
                try:
                    ok, value, took = worker.conn.recv()
                except EOFError:  # killed (out of memory?) before it could answer
                    worker.process.join()
                    pool.remove(worker)
                    ok, value, took = False, (PipelineError(
                        f"its worker process died (exit code {worker.process.exitcode})"),
                        ""), 0.0
                if ok:
                    results[i] = value
                    progress.done(jobs[i], took)
                elif failure is None:
                    failure = _raised(value, describe(jobs[i]))
        if failure is not None:
            raise failure
        return results
    except BaseException:
        # Interrupted (Ctrl-C) or failed: no worker may outlive the stage's call.
        for worker in pool:
            if worker.job is not None:
                worker.process.terminate()
        raise
    finally:
        for worker in pool:
            if worker.process.is_alive() and worker.job is None:
                try:
                    worker.conn.send(None)
                except OSError:  # its end is gone: it is ending anyway
                    pass
            worker.process.join()
            worker.conn.close()


def _raised(sent: tuple[BaseException, str], name: str) -> BaseException:
    """The exception to raise here for a job's failure sent back by its worker."""
    exc, text = sent
    if isinstance(exc, PipelineError):
        return PipelineError(f"{name}: {exc}")
    exc.__cause__ = RemoteTraceback(f"{name} failed in a worker:\n{text}")
    return exc


def _serve(fn: Callable[[Any], Any], jobs: Sequence[Any], threads: int, conn: Any) -> None:
    """A worker: runs the job of every index it is sent until it is sent None."""
    set_threads(threads)
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere a killed stage may leave a worker to finish its job
    while (i := conn.recv()) is not None:
        start = time.perf_counter()
        try:
            answer = (True, fn(jobs[i]), time.perf_counter() - start)
        except BaseException as exc:  # sent back (Ctrl-C too): the stage raises it
            answer = (False, (exc, traceback.format_exc()), 0.0)
        try:
            conn.send(answer)
        except Exception as exc:  # a result or exception that does not pickle
            conn.send((False, (RuntimeError(f"{type(exc).__name__}: {exc}"),
                               traceback.format_exc()), 0.0))
