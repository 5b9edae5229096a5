"""``regrab-serve``'s torch threads: one core left to the event loop on a CPU, and the
count set in the model's worker thread, where every pass runs."""

from __future__ import annotations

import torch

from serve import main
from serve.versions import Loaded, ModelSpec


def test_threads_leave_a_core_to_the_event_loop_on_a_cpu(monkeypatch):
    monkeypatch.setattr(main.os, "sched_getaffinity", lambda _: {0, 1, 2, 3})
    assert main.worker_threads(0, "cpu") == 3
    assert main.worker_threads(2, "cpu") == 2  # asked for: kept
    assert main.worker_threads(0, "cuda") == 0  # torch's default beside a GPU
    monkeypatch.setattr(main.os, "sched_getaffinity", lambda _: {0})
    assert main.worker_threads(0, "cpu") == 1


def test_the_worker_thread_runs_with_the_threads_it_was_given(tmp_path):
    before = torch.get_num_threads()
    loaded = Loaded("v", None, ModelSpec(checkpoint=tmp_path), threads=1)  # type: ignore[arg-type]
    try:
        assert loaded.executor.submit(torch.get_num_threads).result() == 1
    finally:
        loaded.retire()
        torch.set_num_threads(before)
