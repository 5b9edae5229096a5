"""The one job runner: in this process or forked workers, results in plan order, failures."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from pipeline.errors import PipelineError, run_cli
from pipeline.workers import RemoteTraceback, run_jobs, usable_workers

log = logging.getLogger("test_workers")


def _run(fn, jobs, workers, **kw):
    return run_jobs(fn, jobs, workers=workers, threads=1, describe=lambda job: f"job {job}",
                    log=log, **kw)


def test_usable_workers():
    assert usable_workers(4, "cpu") == 4
    assert usable_workers(4, "cpu", 2) == 2
    assert usable_workers(4, "cuda") == usable_workers(4, "cuda:0", 3) == 1
    assert usable_workers(4, "cpu", 0) == 1


def _wait_for(path, seconds: float = 60.0) -> None:
    """Until another worker has made ``path`` (the machine may be busy: no fixed sleep)."""
    end = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.01)


@pytest.mark.parametrize("workers", [1, 2])
def test_results_come_back_in_plan_order(workers, tmp_path, caplog):
    """On two workers job 0 finishes last, yet its result is first; the state the jobs read
    reaches forked workers through the closure (a lock does not pickle)."""
    caplog.set_level("INFO", logger="test_workers")
    shared = {"lock": threading.Lock(), "scale": 10}

    def fn(job: int) -> tuple[int, int]:
        if job == 0 and workers == 2:
            _wait_for(tmp_path / "3")  # until this process has logged job 3 as done
        return job * shared["scale"], os.getpid()

    class Logged(logging.Handler):  # job 3's file only once its line is out, not before
        def emit(self, record: logging.LogRecord) -> None:
            if " done in " in (message := record.getMessage()):
                (tmp_path / message.split()[1]).touch()

    handler = Logged()
    log.addHandler(handler)
    try:
        results = _run(fn, [0, 1, 2, 3], workers)
    finally:
        log.removeHandler(handler)
    assert [value for value, _ in results] == [0, 10, 20, 30]
    pids = {pid for _, pid in results}
    if workers == 1:
        assert pids == {os.getpid()}
    else:
        assert len(pids) == 2 and os.getpid() not in pids
    lines = [r.getMessage() for r in caplog.records if "done in" in r.getMessage()]
    assert len(lines) == 4 and "(4 of 4, " in lines[-1]
    assert lines[-1].endswith("about 0 min left)")
    assert lines[-1].startswith("job 0" if workers == 2 else "job 3")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_job_fails_the_stage_with_one_line(workers, tmp_path, capsys):
    """The job's PipelineError ends the stage with one ``error:`` line naming the job; the
    jobs not yet started never start, one already running finishes."""

    def fn(job: int) -> int:
        if job == 1:
            (tmp_path / "failing").touch()
            raise PipelineError("its split has no test.parquet; run the split stage")
        if job == 0 and workers == 2:
            _wait_for(tmp_path / "failing")
            time.sleep(1.0)  # still running when the failure comes back
        (tmp_path / str(job)).touch()
        return job

    def main(argv: list[str] | None = None) -> None:
        _run(fn, [0, 1, 2, 3], workers)

    with pytest.raises(SystemExit) as exit_:
        run_cli(main, [])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "error: job 1: its split has no test.parquet; run the split stage\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "failing"]


def test_another_failure_in_a_worker_keeps_its_type_and_traceback():
    def fn(job: int) -> int:
        if job == 1:
            raise ValueError("bad value")
        return job

    with pytest.raises(ValueError, match="bad value") as raised:
        _run(fn, [0, 1], 2)
    cause = raised.value.__cause__
    assert isinstance(cause, RemoteTraceback) and "job 1 failed in a worker" in str(cause)
    assert 'raise ValueError("bad value")' in str(cause)


def test_a_worker_that_dies_fails_the_stage():
    def fn(job: int) -> int:
        if job == 1:
            os._exit(3)  # as the out-of-memory killer would end it
        return job

    with pytest.raises(PipelineError, match="job 1: its worker process died \\(exit code 3\\)"):
        _run(fn, [0, 1, 2], 2)


def test_cost_weighs_the_minutes_left(caplog, monkeypatch):
    """Jobs of cost 1, 3 and 2: the first takes 2 min, so the 5 units left take about
    10 min more (one worker; the clock is this process's)."""
    import pipeline.workers

    caplog.set_level("INFO", logger="test_workers")
    clock = [0.0]
    monkeypatch.setattr(pipeline.workers.time, "perf_counter", lambda: clock[0])

    def fn(job: str) -> None:
        clock[0] += 120.0 if job == "a" else 0.0

    cost = {"a": 1, "b": 3, "c": 2}
    run_jobs(fn, ["a", "b", "c"], workers=1, threads=1, describe=str, log=log,
             cost=cost.get)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "a done in 120 s (1 of 3, 120 s so far, about 10 min left)"
    assert lines[-1].endswith("(3 of 3, 120 s so far, about 0 min left)")
