"""Jobs per minute of the job runner: forked pool against 1 and 2 local Dask workers.

The same plan of stand-in jobs runs, one engine after the other in this one run, through
:func:`pipeline.workers.run_jobs`:

* ``this process`` / ``forked pool, 2``: today's default with ``workers`` 1 and 2 (jobs in the
  stage's own process, or in forked processes sharing this machine's files);
* ``Dask, N worker(s)``: a local Dask cluster (``LocalCluster``, N single-threaded
  processes on 127.0.0.1, started and their imports done before the clock runs) with
  every job's input file carried to the worker and its output files carried back
  (:mod:`pipeline.shipping`), as for workers on other machines; the workers' statistical
  profiler is off, as docs/pipeline.md starts them (``--profile`` keeps it on: on this
  2-core machine it cost the jobs' thread about 40% more CPU time);
* ``Dask, 1 worker, no files carried``: the same cluster reading this machine's files in
  place (``files`` not given), so that the difference with the row above is the cost of
  carrying the files, and the difference with ``this process`` that of Dask's own
  bookkeeping.

A stand-in job reads its split's input file (shared by ``--per-split`` jobs, as a split's
tables are shared by its models), does ``--work`` torch matrix products on one thread (a
fixed amount of CPU work), and writes ``--out-mb`` MB into its own folder (a model).

Usage:
    python benchmarks/bench_cluster.py [--jobs 12] [--work 300] [--in-mb 8] [--out-mb 4]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.shipping import JobFiles
from pipeline.workers import run_jobs

log = logging.getLogger("bench_cluster")


@dataclass(frozen=True)
class Job:
    index: int
    split: Path  # input file, shared by the split's jobs
    out: Path  # folder the job writes


def stand_in(job: Job, work: int, out_mb: float) -> int:
    """Read the split, a fixed amount of CPU work, write a model-sized file."""
    data = job.split.read_bytes()
    torch.manual_seed(job.index)
    a = torch.randn(192, 192)
    for _ in range(work):
        a = torch.tanh(a @ a.T / 192)
    job.out.mkdir(parents=True, exist_ok=True)
    payload = bytes(range(256)) * int(out_mb * 4096)
    (job.out / "model.safetensors").write_bytes(payload + a.numpy().tobytes())
    return len(data)


def _warm() -> None:
    """What a worker imports before its first job (paid once per worker and stage)."""
    import torch  # noqa: F401

    import pipeline.dask_jobs  # noqa: F401


def _rate(name: str, seconds: float, jobs: int, rows: list[tuple[str, float, float]]) -> None:
    rows.append((name, seconds, jobs / seconds * 60))
    print(f"{name:<40} {seconds:7.1f} s {jobs / seconds * 60:8.1f} jobs/min", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--per-split", type=int, default=4, help="jobs sharing an input file")
    parser.add_argument("--work", type=int, default=300, help="matrix products per job")
    parser.add_argument("--in-mb", type=float, default=8.0, help="size of a split's file")
    parser.add_argument("--out-mb", type=float, default=4.0, help="size of a job's output")
    parser.add_argument("--profile", action="store_true",
                        help="keep the Dask workers' statistical profiler on")
    args = parser.parse_args()
    from functools import partial

    import dask
    from distributed import Client, LocalCluster

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="bench_cluster-"))
    splits = []
    for s in range((args.jobs + args.per_split - 1) // args.per_split):
        path = root / "splits" / f"split_{s}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([s % 256]) * int(args.in_mb * 2**20))
        splits.append(path)
    fn = partial(stand_in, work=args.work, out_mb=args.out_mb)
    files = JobFiles(reads=lambda job: [job.split], writes=lambda job: [job.out])

    def plan(name: str) -> list[Job]:
        return [Job(i, splits[i // args.per_split], root / name / f"model_{i}")
                for i in range(args.jobs)]

    print(f"{args.jobs} jobs of {args.work} 192x192 products; {args.in_mb} MB read per split "
          f"({args.per_split} jobs each), {args.out_mb} MB written per job", flush=True)
    rows: list[tuple[str, float, float]] = []
    for workers in (1, 2):
        start = time.perf_counter()
        run_jobs(fn, plan(f"fork{workers}"), workers=workers, threads=1, log=log,
                 describe=lambda job: f"job {job.index}")
        _rate("this process (workers: 1)" if workers == 1 else f"forked pool, {workers}",
              time.perf_counter() - start, args.jobs, rows)
    for workers in (1, 2):
        with dask.config.set({"distributed.worker.profile.enabled": args.profile}), \
                LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                          host="127.0.0.1", dashboard_address=":0",
                          silence_logs=logging.ERROR) as cluster:
            start = time.perf_counter()
            with Client(cluster.scheduler_address) as client:
                client.run(_warm)
            print(f"  {workers} Dask worker(s) started; first imports took "
                  f"{time.perf_counter() - start:.1f} s (not counted below)", flush=True)
            runs = [("carried", files)] + ([("in place", None)] if workers == 1 else [])
            for how, carried in runs:
                start = time.perf_counter()
                run_jobs(fn, plan(f"dask{workers}{how}"), workers=1, threads=1, log=log,
                         describe=lambda job: f"job {job.index}",
                         cluster=cluster.scheduler_address, files=carried)
                name = f"Dask, {workers} worker(s)" + (
                    ", no files carried" if carried is None else "")
                _rate(name, time.perf_counter() - start, args.jobs, rows)
    by = {name: seconds for name, seconds, _ in rows}
    same = all((root / "fork1" / f"model_{i}" / "model.safetensors").read_bytes()
               == (root / "dask2carried" / f"model_{i}" / "model.safetensors").read_bytes()
               for i in range(args.jobs))
    print(f"outputs of the forked pool and of 2 Dask workers identical: {same}")
    carry = (by["Dask, 1 worker(s)"] - by["Dask, 1 worker(s), no files carried"]) / args.jobs
    dask = (by["Dask, 1 worker(s), no files carried"] - by["this process (workers: 1)"]) / args.jobs
    print(f"carrying inputs and outputs: {carry:+.2f} s per job; Dask's own overhead over "
          f"one process: {dask:+.2f} s per job (1 worker)")


if __name__ == "__main__":
    main()
