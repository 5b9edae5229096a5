"""Bad input to run_cli, devices and the Wikidata parse: one ``error:`` line, nothing left."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import distributed
import pytest

from pipeline import cluster
from pipeline.config import select_device
from pipeline.errors import PipelineError, run_cli
from stages import parse_wikidata as pw

ROOT = Path(__file__).resolve().parents[2]
INTERRUPTED = 130  # as a shell reports a command stopped by Ctrl-C (128 + SIGINT)


def run(args: list[str], cwd: Path = ROOT, **kwargs) -> subprocess.CompletedProcess:
    """``python ARGS`` with no Prefect server configured."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, **kwargs)


def one_error_line(done: subprocess.CompletedProcess, code: int = 2) -> str:
    assert done.returncode == code, done.stderr[-3000:]
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines[-10:]
    return lines[0]


# ------------------------------------------------------------------ run_cli (1, 4)


def test_run_cli_names_a_full_disk_and_ctrl_c(capsys):
    from pipeline.errors import no_room

    def disk_full(argv):
        raise OSError(errno.ENOSPC, "No space left on device")

    def interrupted(argv):
        raise KeyboardInterrupt

    for main, code, start in ((disk_full, 2, "error: a write failed (No space left"),
                              (interrupted, INTERRUPTED, "error: interrupted (Ctrl-C)")):
        with pytest.raises(SystemExit) as exc:
            run_cli(main, [])
        assert exc.value.code == code
        err = capsys.readouterr().err
        assert err.startswith(start) and err.count("\n") == 1
    # Writers that raise no OSError: safetensors' Rust I/O, torch's zip writer.
    rust = RuntimeError("Error while serializing: I/O error: File too large (os error 27)")
    assert no_room(rust) == os.strerror(errno.EFBIG)
    assert no_room(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos "
                                "576 vs 534"))
    assert no_room(FileNotFoundError(errno.ENOENT, "missing")) is None
    with pytest.raises(ZeroDivisionError):  # a bug stays a traceback
        run_cli(lambda argv: 1 / 0, [])


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "", "CPU"])
def test_device_must_be_one_the_project_uses(device):
    with pytest.raises(PipelineError, match=f"params.yaml train.device '{device}' is not a "
                       "device; use auto, cpu, cuda or cuda:N"):
        select_device(device, "params.yaml train.device")


# ---------------------------------------------------------------- the parse (4, 10)


def triples_file(path: Path, rows: int) -> Path:
    with path.open("w") as fh:
        for start in range(0, rows, 100_000):
            fh.write("".join(f"Q{i}\tP{i % 97}\tQ{i * 7 % 10_007}\n"
                             for i in range(start, min(rows, start + 100_000))))
    return path


@pytest.mark.slow  # the parse in a child process with two workers, stopped mid-way
def test_ctrl_c_on_the_parse_is_one_line_and_resumes(tmp_path):
    tsv = triples_file(tmp_path / "t.tsv", 1_500_000)
    out = tmp_path / "out" / "triples.parquet"
    args = [sys.executable, "-m", "stages.parse_wikidata", "--out", str(out), "--workers", "2",
            "--range-mb", "0.5", "--no-progress", str(tsv)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    parts = out.parent / f".{out.name}.parts"
    deadline = time.monotonic() + 120
    while not list(parts.glob("*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the workers have finished a range
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == INTERRUPTED, stderr[-3000:]
    assert stdout == "" and stderr.count("\n") == 1, stderr[-3000:]
    assert stderr.startswith("error: interrupted (Ctrl-C)")
    assert not out.exists() and list(parts.glob("*.parquet"))  # finished ranges kept
    done = subprocess.run(args[:-1] + ["--workers", "0", str(tsv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.exists() and not parts.exists()


def test_wrong_cluster_address_is_one_line_and_leaves_nothing(tmp_path):
    tsv = triples_file(tmp_path / "t.tsv", 10)
    out = tmp_path / "triples.parquet"
    line = one_error_line(run(["-m", "stages.parse_wikidata", "--out", str(out), "--cluster",
                               "tcp://127.0.0.1:9", str(tsv)]))  # and its progress bar on
    assert line.startswith("error: cannot reach Dask scheduler at tcp://127.0.0.1:9")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.tsv"]


def test_a_refused_port_is_probed_within_its_bound_and_never_handshaken(monkeypatch):
    """The address check's one TCP probe carries PROBE_TIMEOUT_S, and a refused port ends
    there: Dask's handshake (its own wait) is never tried."""
    probes, handshakes = [], []

    def refused(address, timeout):
        probes.append((address, timeout))
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    monkeypatch.setattr(cluster.socket, "create_connection", refused)
    monkeypatch.setattr(cluster, "check_handshake", lambda *args: handshakes.append(args))
    with pytest.raises(PipelineError, match="cannot reach Dask scheduler at tcp://127.0.0.1:9"):
        cluster.check_cluster("127.0.0.1:9")
    assert probes == [(("127.0.0.1", 9), cluster.PROBE_TIMEOUT_S)] and handshakes == []


def test_report_under_a_cluster_has_no_local_worker_count(tmp_path):
    tsv = triples_file(tmp_path / "t.tsv", 100)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster:
        report = pw.main(["--out", str(tmp_path / "t.parquet"), "--no-progress", "--cluster",
                          cluster.scheduler_address, str(tsv)])
    assert report["settings"]["workers"] is None
    assert report["settings"]["cluster"] == cluster.scheduler_address
    local = pw.main(["--out", str(tmp_path / "l.parquet"), "--no-progress", "--workers", "0",
                     str(tsv)])
    assert local["settings"]["workers"] == 0
