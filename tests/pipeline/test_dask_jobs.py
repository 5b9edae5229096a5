"""The runner on a Dask cluster (in this process: threads, fast to start): results in plan
order, files carried, CUDA jobs routed to the worker with the GPU resource, failures."""

from __future__ import annotations

import logging

import pytest
import torch

from pipeline.errors import PipelineError
from pipeline.workers import JobFiles, RemoteTraceback, run_jobs

distributed = pytest.importorskip("distributed")
log = logging.getLogger("test_dask_jobs")


@pytest.fixture(scope="module")
def cluster():
    """A CPU worker and a worker with one GPU (an abstract resource: no CUDA needed)."""
    spec = {name: {"cls": distributed.Worker,
                   "options": {"nthreads": 1, "resources": resources, "host": "127.0.0.1"}}
            for name, resources in (("cpu", {}), ("gpu", {"GPU": 1}))}
    scheduler = {"cls": distributed.Scheduler,
                 "options": {"dashboard_address": ":0", "host": "127.0.0.1"}}
    with distributed.SpecCluster(workers=spec, scheduler=scheduler) as local:
        yield local.scheduler_address


def _run(fn, jobs, cluster, **kw):
    return run_jobs(fn, jobs, workers=1, threads=torch.get_num_threads(), log=log,
                    describe=lambda job: f"job {job}", cluster=cluster, **kw)


def _worker() -> str:
    return str(distributed.get_worker().name)


def test_results_in_plan_order_and_a_line_per_job_with_its_worker(cluster, caplog):
    caplog.set_level("INFO", logger="test_dask_jobs")
    results = _run(lambda job: (job * 10, _worker()), [0, 1, 2, 3], cluster)
    assert [value for value, _ in results] == [0, 10, 20, 30]
    lines = [r.getMessage() for r in caplog.records if "done in" in r.getMessage()]
    assert len(lines) == 4 and lines[-1].endswith("(4 of 4, " + lines[-1].split(", ", 1)[1])
    assert all(f" on {worker} (" in line for (_, worker), line in
               zip(results, sorted(lines, key=lambda s: s.split()[1]), strict=True))


def test_cuda_jobs_go_to_the_worker_with_the_gpu(cluster):
    assert {w for w in _run(lambda job: _worker(), list(range(4)), cluster, gpu=True)} == {
        "gpu"}


def test_no_gpu_worker_is_one_line(tmp_path):
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=":0",
                                  host="127.0.0.1", protocol="tcp://") as c:
        with pytest.raises(PipelineError, match="has no worker with the GPU resource.*"
                                                "--resources GPU=1"):
            _run(lambda job: job, [0], c.scheduler_address, gpu=True)


def test_a_job_reads_its_files_and_its_writes_land_here(cluster, tmp_path):
    (tmp_path / "in").mkdir()
    for i in range(3):
        (tmp_path / "in" / f"{i}.txt").write_text(f"sentence {i}")
    out = tmp_path / "out"

    def fn(i: int) -> str:
        # Both paths were moved into the worker's scratch folder: not the stage's files.
        source, target = tmp_path / "in" / f"{i}.txt", out / str(i)
        assert "regrab-job-" in str(source)
        target.mkdir(parents=True)
        (target / "upper.txt").write_text(source.read_text().upper())
        return source.read_text()

    files = JobFiles(reads=lambda i: [tmp_path / "in" / f"{i}.txt"],
                     writes=lambda i: [out / str(i)])
    assert _run(fn, [0, 1, 2], cluster, files=files) == [f"sentence {i}" for i in range(3)]
    assert [(out / str(i) / "upper.txt").read_text() for i in range(3)] == [
        f"SENTENCE {i}" for i in range(3)]


def test_failures_keep_their_one_line_or_their_traceback(cluster):
    def fn(job: int) -> int:
        if job == 1:
            raise PipelineError("its split has no test.parquet; run the split stage")
        if job == 2:
            raise ValueError("bad value")
        return job

    with pytest.raises(PipelineError, match="^job 1: its split has no test.parquet"):
        _run(fn, [0, 1], cluster)
    with pytest.raises(ValueError, match="bad value") as raised:
        _run(fn, [2], cluster)
    assert isinstance(raised.value.__cause__, RemoteTraceback)
    assert "job 2 failed in a worker" in str(raised.value.__cause__)


def test_a_wrong_address_is_one_line():
    with pytest.raises(PipelineError, match="cannot reach Dask scheduler at tcp://127.0.0.1:9"):
        _run(lambda job: job, [0], "127.0.0.1:9")


def test_a_stage_s_cluster_argument_is_checked_before_anything_runs(monkeypatch, tmp_path):
    """From ``--cluster`` or ``$REGRAB_DASK_ADDRESS``: a malformed or silent address is one
    line as the arguments are read; none is None."""
    import argparse

    from pipeline.cluster import ADDRESS_ENV, add_cluster_argument

    def parsed(*argv: str) -> str | None:
        parser = argparse.ArgumentParser()
        add_cluster_argument(parser)
        return parser.parse_args(list(argv)).cluster

    monkeypatch.delenv(ADDRESS_ENV, raising=False)
    assert parsed() is None
    with pytest.raises(PipelineError, match="is not a Dask scheduler address"):
        parsed("--cluster", "nohost")
    monkeypatch.setenv(ADDRESS_ENV, "127.0.0.1:9")
    with pytest.raises(PipelineError, match="cannot reach Dask scheduler at tcp://127.0.0.1:9"):
        parsed()
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0",
                                  host="127.0.0.1", protocol="tcp://") as c:
        monkeypatch.setenv(ADDRESS_ENV, c.scheduler_address.removeprefix("tcp://"))
        assert parsed() == c.scheduler_address
