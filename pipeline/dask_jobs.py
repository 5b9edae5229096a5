"""The job runner's jobs on a Dask cluster: any machine with a worker can take one.

:func:`pipeline.workers.run_jobs` hands its jobs here when a stage names a scheduler
(``--cluster`` / ``$REGRAB_DASK_ADDRESS``, as the Wikidata parse does). Each job is one Dask
task:

- what it reads travels with it (:mod:`pipeline.shipping`): every distinct input file is
  one small task keyed by its SHA-256 (``blob-<digest>``), so a file that many jobs read
  reaches each worker once, and the function with what it closes over (graph, tokens,
  warm caches) is one such task too; the worker writes the files into a scratch folder
  of its own, so workers need no clone, no DVC cache and no shared file system (only the
  project installed, and the encoder where the stage's machine finds it);
- what it writes comes back as bytes and is renamed into place here, as the job finishes,
  so a stage that fails keeps the models its finished jobs trained, as on one machine;
- a job on CUDA asks for the abstract resource ``GPU`` (a worker started with
  ``--resources GPU=1`` takes it, one at a time), so a cluster of CPU and GPU machines
  routes it;
- a job whose worker dies (killed, out of memory, the machine gone) is run again on
  another worker by the scheduler (up to ``distributed.scheduler.allowed-failures``
  times, 3 by default) from the same inputs, so the stage ends with the same outputs. An
  exception the job raises is not retried: the same inputs raise it again, so it fails
  the stage with its one line at once, as on one machine.

The inputs of a task are held by the scheduler until the run ends, so a lost worker's
copies can be made again; they are released with the run's futures.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.cluster import connect
from pipeline.config import set_threads
from pipeline.errors import PipelineError
from pipeline.shipping import (
    Digests,
    JobFiles,
    Parcel,
    Written,
    apply,
    collect,
    dumps,
    loads,
    pack,
    returned,
    unpack,
)

#: The resource a CUDA job asks of a worker (``dask worker ... --resources GPU=1``).
GPU = "GPU"
#: glibc's ``M_MMAP_THRESHOLD`` and the most its dynamic threshold reaches on 64-bit.
M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX = -3, 32 << 20


@dataclass(frozen=True)
class Finished:
    """What a worker sends back for one job."""

    value: bytes  # the job's result, pickled by :func:`pipeline.shipping.dumps`
    written: Written
    worker: str  # its name (``dask worker --name``) or address
    scratch: str  # the folder it ran in there
    took: float  # seconds the job ran


def _held(data: bytes) -> bytes:
    """A task whose result is its argument: data the scheduler can hand out again."""
    return data


def run_job(fn_data: bytes, parcel: Parcel, blobs: dict[str, bytes], threads: int
            ) -> Finished:
    """One job on a worker, in a scratch folder that is removed when it ends."""
    from distributed import get_worker

    worker = get_worker()
    set_threads(threads)
    _heap_for_tensors()
    scratch = Path(tempfile.mkdtemp(prefix="regrab-job-", dir=worker.local_directory))
    try:
        job = unpack(parcel, blobs, scratch)
        fn = loads(fn_data, scratch, parcel.roots)
        start = time.perf_counter()
        value = fn(job)
        took = time.perf_counter() - start
        return Finished(dumps(value), collect(parcel, scratch),
                        str(worker.name if worker.name is not None else worker.address),
                        str(scratch), took)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _heap_for_tensors() -> None:
    """Serve tensor-sized allocations from the heap again in a Dask worker process.

    A Dask nanny starts its worker with ``MALLOC_TRIM_THRESHOLD_`` set, which turns off
    glibc's dynamic mmap threshold: every tensor above 128 KiB is then a fresh ``mmap``
    and its pages are faulted in anew, which made the matrix products of
    ``benchmarks/bench_cluster.py`` about twice as slow as in the stage's own process.
    Fixing the threshold at the value the dynamic one grows to restores that speed.
    """
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
    except (OSError, AttributeError):
        pass  # not glibc: its allocator was not changed either


def _workers_for(client: Any, address: str, gpu: bool) -> int:
    """Workers that can take the jobs now; an ``error:`` line when none can."""
    workers = client.scheduler_info()["workers"].values()
    able = [w for w in workers if not gpu or w.get("resources", {}).get(GPU, 0) >= 1]
    if not able:
        start = f"`dask worker {address}" + (f" --resources {GPU}=1`" if gpu else "`")
        raise PipelineError(
            f"the Dask scheduler at {address} has no worker"
            + (f" with the {GPU} resource for CUDA jobs" if gpu else "")
            + f"; start one ({start} on a machine with the project installed)")
    return len(able)


def _submit_data(client: Any, data: bytes, key: str, held: dict[str, Any]) -> Any:
    """The future of a ``_held`` task holding ``data`` under ``key``, made once per key."""
    if key not in held:
        with warnings.catch_warnings():  # the bytes are meant to be in the graph
            warnings.simplefilter("ignore")
            held[key] = client.submit(_held, data, key=key, pure=False)
    return held[key]


def run_on_cluster(fn: Callable[[Any], Any], jobs: Sequence[Any], *, address: str,
                   threads: int, files: JobFiles, gpu: bool, describe: Callable[[Any], str],
                   done: Callable[[Any, float, str], None], workers: Callable[[int], None],
                   raised: Callable[[tuple[BaseException, str], str], BaseException]
                   ) -> list[Any]:
    """``[fn(job) for job in jobs]`` on the cluster at ``address``, in plan order.

    Args:
        fn: runs one job; pickled with cloudpickle, so a closure or lambda will do.
        jobs: the plan.
        address: the scheduler.
        threads: torch threads of a job.
        files: what each job reads and writes on this machine.
        gpu: the jobs run on CUDA: each asks for one ``GPU``.
        describe: a job's name in the error lines.
        done: called with a job, its seconds and its worker's name as it finishes, after its
            files are in place.
        workers: told how many workers can take the jobs, before the first is sent.
        raised: the exception to raise for a job's failure (its exception and traceback
            text) and its name.
    """
    from distributed import as_completed

    client = connect(address)
    futures: list[Any] = []
    held: dict[str, Any] = {}
    try:
        workers(_workers_for(client, address, gpu))
        digests = Digests()
        fn_data = dumps(fn)
        fn_future = _submit_data(client, fn_data,
                                 f"fn-{hashlib.sha256(fn_data).hexdigest()}", held)
        run = uuid.uuid4().hex[:8]
        by_key = {}
        for i, job in enumerate(jobs):
            parcel, sources = pack(job, files, digests)
            blobs = {digest: _submit_data(client, path.read_bytes(), f"blob-{digest}", held)
                     for digest, path in sources.items()}
            future = client.submit(run_job, fn_future, parcel, blobs, threads,
                                   key=f"job-{run}-{i}", pure=False, priority=len(jobs) - i,
                                   resources={GPU: 1} if gpu else None)
            by_key[future.key] = i
            futures.append(future)
        results: list[Any] = [None] * len(jobs)
        for future in as_completed(futures):
            i = by_key[future.key]
            if future.status != "finished":
                raise raised(_failure(future), describe(jobs[i]))
            finished: Finished = future.result()
            apply(finished.written)
            results[i] = returned(finished.value, finished.scratch)
            done(jobs[i], finished.took, finished.worker)
            future.release()
        return results
    finally:
        client.cancel(futures + list(held.values()))
        client.close()


def _failure(future: Any) -> tuple[BaseException, str]:
    """A failed job's exception and the text of its traceback on the worker."""
    import traceback

    from distributed.scheduler import KilledWorker

    exc = future.exception()
    if isinstance(exc, KilledWorker):
        exc = PipelineError(f"every worker that ran it died ({exc}); look at the workers' "
                            "logs (out of memory?)")
    return exc, "".join(traceback.format_tb(future.traceback()))
