"""Run the ranges of all inputs: in this process, on a local Dask cluster, or on an existing one.

Why Dask distributed: the work is a bag of independent, CPU-bound Python tasks whose results
(uint32 arrays) come back to one place to be merged in order; ``Client.map`` plus
``as_completed`` is exactly that, a ``LocalCluster`` sized to the machine needs no setup, and
the same code reaches a cluster of many machines by its scheduler address (``dask
scheduler`` / ``dask worker``, or dask-jobqueue / dask-kubernetes). It is pure Python on
PyPI, and Prefect runs it through prefect-dask.

The result does not depend on the engine or the number of workers: ranges are cut at fixed
offsets, each range's result is a function of its bytes alone, and the merge reads them in
range order. Finished ranges are kept on disk (:mod:`pipeline.wikidata.collect`), so a
killed run resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from pipeline.cluster import ADDRESS_ENV, connect  # noqa: F401 - the stage reads it here
from pipeline.errors import PipelineError
from pipeline.wikidata.collect import FileStats, ParseResult, PartStore, manifest, merge
from pipeline.wikidata.formats import detect_format
from pipeline.wikidata.ranges import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_RANGE_BYTES,
    RangeResult,
    WorkRange,
    parse_range,
    plan_ranges,
)


def _local_cluster(workers: int) -> Any:
    """A local cluster of ``workers`` processes that leave Ctrl-C to this process.

    The worker processes start with SIGINT ignored (a process inherits that), so a Ctrl-C to
    the process group stops this process alone, which closes the cluster, instead of every
    worker printing its own traceback. Threads that ``distributed`` started on import spawn
    the workers, so a signal mask would not reach them; the price is that a Ctrl-C during
    the second or two the workers take to start is dropped.
    """
    from distributed import LocalCluster

    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        # One single-threaded process per worker: parsing holds the GIL.
        return LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            # Not ERROR: on a busy machine a worker closed with the cluster (at the end, or
            # on Ctrl-C) logs a failed heartbeat; a range's own failure comes back as its
            # result or exception, so the workers' logs add nothing but noise.
            silence_logs=logging.CRITICAL,
        )
    finally:
        if main:
            signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def _held_ctrl_c() -> Iterator[Callable[[], None]]:
    """Hold a Ctrl-C until the caller checks, between results.

    Raised inside one of ``distributed``'s own waits, a KeyboardInterrupt can make its event
    loop log a traceback of its own; held, it ends the run with the one line of
    :func:`pipeline.errors.run_cli`. The check comes at least every 0.1 s.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    pressed: list[int] = []

    def check() -> None:
        if pressed:
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, old)


def _serial(ranges: list[WorkRange], batch_bytes: int) -> Iterator[tuple[WorkRange, RangeResult]]:
    for work in ranges:
        yield work, parse_range(work, batch_bytes)


def _gathered(future: Any, work: WorkRange) -> RangeResult:
    """A finished range's result; a worker that cannot open its input is one line."""
    try:
        return future.result()
    except OSError as err:
        raise PipelineError(
            f"a Dask worker cannot read {work.path} ({err.strerror or err}): on a cluster every "
            "worker opens the inputs by this path, so put them there on every worker's machine "
            "(a shared file system) or parse without --cluster / REGRAB_DASK_ADDRESS"
        ) from None


def _on_dask(
    ranges: list[WorkRange], batch_bytes: int, workers: int, client: Any = None
) -> Iterator[tuple[WorkRange, RangeResult]]:
    """Ranges as Dask tasks on ``client`` (default: a local cluster), in the order they finish."""
    from distributed import Client, as_completed

    cluster = None
    if client is None:
        cluster = _local_cluster(workers)
        client = Client(cluster)
    try:
        by_key = {}
        futures = []
        for work in ranges:
            future = client.submit(parse_range, work, batch_bytes, key=f"range-{work.name}")
            by_key[future.key] = work
            futures.append(future)
        pending = as_completed(futures)
        with _held_ctrl_c() as check:
            while not pending.is_empty():
                check()
                if not pending.has_ready():
                    time.sleep(0.1)
                    continue
                future = next(pending)
                result = _gathered(future, by_key[future.key])
                yield by_key[future.key], result
                future.release()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def parse_inputs(
    paths: list[Path],
    work_dir: Path,
    workers: int = 1,
    address: str | None = None,
    range_bytes: int = DEFAULT_RANGE_BYTES,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    progress: bool = True,
) -> tuple[ParseResult, PartStore]:
    """Parse every input; formats are checked for all of them before any long work starts.

    Args:
        paths: Dumps and triple files, in the order that decides ``source``.
        work_dir: Folder for finished ranges (resume); the caller removes it when done.
        workers: 0 parses in this process; otherwise the size of the local Dask cluster
            (started only when there is more than one range's worth of work to do).
        address: An existing Dask scheduler to use instead of a local cluster.
        range_bytes: Compressed bytes per work unit (fixes the cut, not the result).
        batch_bytes: Decompressed bytes parsed at once inside a range.
        progress: Show a tqdm bar: compressed bytes done, entities/s, ETA.

    Returns:
        The merged triples and counts, and the store of finished ranges.

    Raises:
        PipelineError: An input is missing, unreadable, of unknown format, or listed twice;
            the scheduler at ``address`` cannot be reached (checked before anything is
            written or drawn).
    """
    if len(paths) > np.iinfo(np.uint16).max:
        raise PipelineError(f"{len(paths)} inputs; at most 65535 fit the file index, merge some")
    formats = [detect_format(path) for path in paths]
    names = [path.name for path in paths]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise PipelineError(
            f"inputs share the file name(s) {repeated}; the source column needs unique "
            "names, so list each file once and rename clashing ones"
        )
    stats = [
        FileStats(name=path.name, path=str(path), format=fmt,
                  compressed_bytes=path.stat().st_size)
        for path, fmt in zip(paths, formats, strict=True)
    ]
    # Workers open a range by its path, so a worker in another folder needs it absolute.
    ranges = [
        work
        for index, (path, fmt) in enumerate(zip(paths, formats, strict=True))
        for work in plan_ranges(path.absolute(), index, fmt, range_bytes)
    ]
    # A wrong scheduler address is one line before the work folder or the bar appear.
    client = connect(address) if address else None
    store = PartStore(work_dir, manifest(paths, formats, range_bytes))
    todo = [work for work in ranges if not store.done(work)]
    bar = tqdm(
        total=sum(work.stop - work.start for work in ranges),
        initial=sum(work.stop - work.start for work in ranges if store.done(work)),
        unit="B",
        unit_scale=True,
        unit_divisor=1000,
        desc=f"parse ({len(ranges) - len(todo)} of {len(ranges)} ranges done before)",
        disable=not progress,
        mininterval=1.0,
        dynamic_ncols=True,
    )
    started, done = time.perf_counter(), {"entities": 0, "rows": 0}
    # Starting worker processes takes seconds: not worth it for a single range of work.
    small = sum(work.stop - work.start for work in todo) <= range_bytes
    if not address and (workers == 0 or small):
        results, engine = _serial(todo, batch_bytes), "in-process"
    elif address:
        results, engine = _on_dask(todo, batch_bytes, 0, client), f"Dask scheduler {address}"
    else:
        results = _on_dask(todo, batch_bytes, workers, None)
        engine = f"local Dask cluster, {workers} workers"
    try:
        for work, result in results:
            store.save(work, result)
            if work.format.kind == "dump":
                done["entities"] += result.entities
            else:
                done["rows"] += result.records
            bar.update(work.stop - work.start)
            elapsed = max(time.perf_counter() - started, 1e-9)
            rates = (f"{n / elapsed:,.0f} {unit}/s" for unit, n in done.items() if n)
            bar.set_postfix_str(", ".join(rates), refresh=False)
    finally:
        results.close()
        bar.close()
    parsed = merge(store, ranges, stats)
    parsed.engine = engine
    return parsed, store
