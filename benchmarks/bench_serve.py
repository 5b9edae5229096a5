"""``regrab-serve`` throughput and latency against its peers, in one run.

Requests of one query each on one registered 10-way 5-shot support set, from 1, 8 and 32
concurrent clients, to (a) the service (a subprocess on loopback); beside it (c) the limit:
the Python API in this process with the same support set encoded once (as the service caches
it) and the same queries predicted 1, 8 and 32 a call (``Predictor.predict``), on the same
checkpoint and the same number of torch threads; and (b) a ``regrab-predict`` process per
call (``--process-calls``; each pays the imports, the model load and the support encoding).

The service and the limit take turns ``--repeats`` times (the machine may be shared, so each
figure is the median of the repeats, and the load average is printed). After each level the
service's ``/metrics`` say how many queries each forward pass held and how much of the wall
time the model's worker spent in passes: a worker busy nearly all the time is at the model's
limit, one often idle waits on the HTTP side.

The checkpoint is ``--checkpoint`` when given, else an untrained one on the packaged encoder
(speed does not depend on the weights): REGRAB with the relation graph when ``data/graph``
holds it (:func:`benchmarks.bench_predict.untrained_checkpoint`), else ``proto``, which needs
no graph. Sentences come from FewRel's ``val_wiki.json`` in ``$REGRAB_DATA_MIRROR/fewrel``.

Usage:
    python benchmarks/bench_serve.py [--checkpoint PATH] [--threads 1] [--repeats 3]
        [--serve-args "--max-wait-ms 0"] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import torch
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.bench_predict import untrained_checkpoint
from model.files.checkpoint import Checkpoint, save_checkpoint
from model.methods.registry import build_model, config_for_method
from model.predict.predictor import Predictor
from model.predict.sentences import parse_sentence

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (1, 8, 32)


def checkpoint(folder: Path, given: Path | None) -> Path:
    if given is not None:
        return given
    if (ROOT / "data" / "graph" / "graph.parquet").is_file():
        return untrained_checkpoint(folder, ROOT / "data")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    model = build_model(config_for_method(params["model"], "proto"), None)
    path = folder / "model.safetensors"
    save_checkpoint(path, Checkpoint.of(model, step=0))
    return path


def fewrel_sentences(ways: int = 10, shots: int = 5) -> tuple[list[dict], list[str]]:
    """Support rows of the first ``ways`` relations of FewRel val, and the other sentences
    of those relations as marked-text queries."""
    mirror = Path(os.environ.get("REGRAB_DATA_MIRROR", "/work/shared/data"))
    data = json.loads((mirror / "fewrel" / "val_wiki.json").read_text())
    support, queries = [], []
    for rel in sorted(data)[:ways]:
        for i, rec in enumerate(data[rel]):
            text = parse_sentence(rec).marked()
            (support.append({"relation": rel, "text": text}) if i < shots
             else queries.append(text))
    return support, queries


TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of process ``pid``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def cpu_split(pid: int, before: dict[int, float], after: dict[int, float]
              ) -> tuple[float, float]:
    """``(event loop, the rest)`` CPU seconds between two :func:`thread_cpu`: the loop is
    the main thread, the rest is the model's worker (and torch's threads)."""
    loop = after.get(pid, 0.0) - before.get(pid, 0.0)
    total = sum(after.values()) - sum(v for t, v in before.items() if t in after)
    return loop, total - loop


def summary(latencies: list[float], wall: float) -> dict[str, float]:
    ms = np.array(latencies) * 1000
    return {"qps": len(ms) / wall, "p50": float(np.percentile(ms, 50)),
            "p99": float(np.percentile(ms, 99))}


def in_process(predictor: Predictor, queries: list[str], per_call: int, total: int
               ) -> dict[str, float]:
    """The limit: ``total`` queries (in the service's order), ``per_call`` a call, on the
    support set ``predictor`` holds. A query's latency is its call's. Run in a worker thread,
    as the service runs its passes: on a loaded machine torch's threads behave differently in
    the main thread (docs/performance.md#regrab-serve)."""
    asked = [parse_sentence(queries[i % len(queries)]) for i in range(total)]
    latencies, t0, cpu = [], time.perf_counter(), time.process_time()  # torch's threads too
    for s in range(0, total, per_call):
        t1 = time.perf_counter()
        predictor.predict(asked[s : s + per_call])
        latencies += [time.perf_counter() - t1] * len(asked[s : s + per_call])
    figures = summary(latencies, time.perf_counter() - t0)
    figures["cpu_ms"] = (time.process_time() - cpu) * 1000 / total
    return figures


async def hammer(url: str, sid: str, queries: list[str], clients: int, total: int
                 ) -> dict[str, float]:
    latencies: list[float] = []
    counter = [0]

    async def client(http: httpx.AsyncClient) -> None:
        while counter[0] < total:
            i = counter[0]
            counter[0] += 1
            t0 = time.perf_counter()
            r = await http.post("/v1/predict", json={"support_set_id": sid,
                                                     "queries": [queries[i % len(queries)]]})
            r.raise_for_status()
            latencies.append(time.perf_counter() - t0)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return summary(latencies, time.perf_counter() - t0)


def passes(url: str) -> dict[str, float]:
    """The service's forward passes so far: count, queries, seconds, and the count per size
    bucket (cumulative, as Prometheus keeps them)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name == "regrab_serve_batch_queries_count":
                out["passes"] = s.value
            elif s.name == "regrab_serve_batch_queries_sum":
                out["queries"] = s.value
            elif s.name == "regrab_serve_pass_seconds_sum":
                out["seconds"] = s.value
            elif s.name == "regrab_serve_batch_queries_bucket":
                out[f"le{s.labels['le']}"] = s.value
    return out


def histogram(before: dict[str, float], after: dict[str, float]) -> str:
    """Passes by queries held between two :func:`passes`, as ``size:count``."""
    parts, below = [], 0.0
    for key in sorted((k for k in after if k.startswith("le") and k != "le+Inf"),
                      key=lambda k: float(k[2:])):
        upto = after[key] - before.get(key, 0.0)
        if upto > below:
            parts.append(f"<={float(key[2:]):g}:{upto - below:g}")
        below = upto
    return " ".join(parts)


def start_service(ckpt: Path, threads: int, extra: list[str], root: Path = ROOT
                  ) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "serve.main", "--checkpoint", str(ckpt),
                             "--port", str(port), "--device", "cpu", "--threads", str(threads),
                             *extra], cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(root)})
    url = f"http://127.0.0.1:{port}"
    for _ in range(3000):
        try:
            if httpx.get(f"{url}/ready").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the service exited with {proc.returncode}")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the service was not ready after 300 s")


def process_per_call(ckpt: Path, support: list[dict], queries: list[str], calls: int,
                     threads: int, tmp: Path) -> dict[str, float]:
    (tmp / "support.jsonl").write_text("\n".join(json.dumps(r) for r in support) + "\n")
    latencies = []
    for i in range(calls):
        (tmp / "q.jsonl").write_text(json.dumps({"text": queries[i]}) + "\n")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "from cli.entry import predict; predict()",
                        "--checkpoint", str(ckpt), "--support", str(tmp / "support.jsonl"),
                        "--queries", str(tmp / "q.jsonl"), "--out", str(tmp / f"o{i}.jsonl"),
                        "--device", "cpu", "--threads", str(threads)],
                       cwd=ROOT, check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
        latencies.append(time.perf_counter() - t0)
    return summary(latencies, sum(latencies))


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


def line(name: str, figures: dict[str, float], extra: str = "") -> str:
    return (f"{name:<34} {figures['qps']:7.1f} q/s  p50 {figures['p50']:8.1f} ms  "
            f"p99 {figures['p99']:8.1f} ms{extra}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both peers")
    parser.add_argument("--requests", type=int, default=192, help="queries per level and run")
    parser.add_argument("--batch-size", type=int, default=16,
                        help="sentences per encoder batch, both peers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--process-calls", type=int, default=0)
    parser.add_argument("--serve-args", default="", help="more regrab-serve options")
    parser.add_argument("--serve-root", type=Path, default=ROOT,
                        help="run the service of another checkout (to compare versions)")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    support, queries = fewrel_sentences()
    tmp = Path(tempfile.mkdtemp())
    ckpt = checkpoint(tmp, args.checkpoint)
    print(f"checkpoint: {ckpt if args.checkpoint else 'untrained'}; 10-way 5-shot support, "
          f"1 query per request; threads={args.threads}; batch size {args.batch_size}; "
          f"CPUs {os.cpu_count()}; "
          f"serve args: {args.serve_args or '(defaults)'}; load {os.getloadavg()[0]:.1f}")

    predictor = Predictor.from_checkpoint(ckpt, "cpu", batch_size=args.batch_size)
    grouped: dict[str, list] = {}
    for row in support:
        grouped.setdefault(row["relation"], []).append(row)
    worker = ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(args.threads,))
    worker.submit(predictor.set_support, grouped).result()  # once, as the service caches it
    worker.submit(predictor.predict, queries[:8]).result()  # warm
    proc, url = start_service(ckpt, args.threads, ["--batch-size", str(args.batch_size),
                                                   *shlex.split(args.serve_args)],
                              args.serve_root)
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        sid = httpx.post(f"{url}/v1/support-sets", json={"support": support},
                         timeout=300).json()["support_set_id"]
        asyncio.run(hammer(url, sid, queries, 8, 16))  # warm
        for _ in range(args.repeats):
            for level in LEVELS:
                runs.setdefault(f"c{level}", []).append(worker.submit(
                    in_process, predictor, queries, level, args.requests).result())
                before, cpu, client = passes(url), thread_cpu(proc.pid), time.process_time()
                figures = asyncio.run(hammer(url, sid, queries, level, args.requests))
                loop, work = cpu_split(proc.pid, cpu, thread_cpu(proc.pid))
                figures["client_ms"] = (time.process_time() - client) * 1000 / args.requests
                after = passes(url)
                figures["loop_ms"] = loop * 1000 / args.requests
                figures["worker_ms"] = work * 1000 / args.requests
                wall = args.requests / figures["qps"]
                figures["per_pass"] = (after["queries"] - before["queries"]) / max(
                    1.0, after["passes"] - before["passes"])
                figures["busy"] = (after.get("seconds", 0) - before.get("seconds", 0)) / wall
                figures["load"] = os.getloadavg()[0]
                limit = runs[f"c{level}"][-1]
                print(f"  run: (c) {level:2d}/call {limit['qps']:6.1f} q/s, "
                      f"{limit['cpu_ms']:.1f} CPU ms/q; (a) {level:2d} clients "
                      f"{figures['qps']:6.1f} q/s, CPU ms/q: loop {figures['loop_ms']:.1f}, "
                      f"worker {figures['worker_ms']:.1f}, client {figures['client_ms']:.1f}; "
                      f"{figures['per_pass']:.1f} queries/pass [{histogram(before, after)}], "
                      f"worker busy {figures['busy']:.0%}, load {figures['load']:.1f}",
                      flush=True)
                runs.setdefault(f"a{level}", []).append(figures)
    finally:
        proc.terminate()
        proc.wait()
        worker.shutdown()
    if args.process_calls:
        runs["b1"] = [process_per_call(ckpt, support, queries, args.process_calls,
                                       args.threads, tmp)]
    print(f"medians of {args.repeats} runs (load {os.getloadavg()[0]:.1f} at the end):")
    for level in LEVELS:
        m = median(runs[f"c{level}"])
        print(line(f"(c) Python API, {level} a call", m, f"  CPU {m['cpu_ms']:.1f} ms/q"))
    if "b1" in runs:
        print(line("(b) regrab-predict per call", runs["b1"][0]))
    for level in LEVELS:
        m = median(runs[f"a{level}"])
        print(line(f"(a) regrab-serve, {level} clients", m,
                   f"  {m['per_pass']:.1f} q/pass, busy {m['busy']:.0%}, CPU ms/q: loop "
                   f"{m['loop_ms']:.1f}, worker {m['worker_ms']:.1f}, client "
                   f"{m['client_ms']:.1f}"))
    a1, a32, c32 = (median(runs[k])["qps"] for k in ("a1", "a32", "c32"))
    print(f"service at 32 clients / at 1 client: {a32 / a1:.2f}x; service at 32 / limit at "
          f"32 a call: {a32 / c32:.2f}; limit 32 a call / 1 a call: "
          f"{c32 / median(runs['c1'])['qps']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
