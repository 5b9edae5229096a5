"""``regrab-serve`` throughput and latency against its peers, in one run.

Requests of one query each on a registered 10-way 5-shot support set, from 1, 8 and 32
concurrent clients, to (a) the service (a subprocess on loopback), (b) a ``regrab-predict``
process per call (a few calls at one client: each pays the imports, the model load and the
support encoding), (c) the Python API in this process, the limit: ``Predictor.predict`` on as
many queries at once as there are clients.

The checkpoint is ``--checkpoint`` when given, else an untrained one on the packaged encoder
(speed does not depend on the weights): REGRAB with the relation graph when ``data/graph``
holds it (:func:`benchmarks.bench_predict.untrained_checkpoint`), else ``proto``, which needs
no graph. Sentences come from FewRel's ``val_wiki.json`` in ``$REGRAB_DATA_MIRROR/fewrel``.

Usage:
    python benchmarks/bench_serve.py [--checkpoint PATH] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import torch
import yaml

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


def stats(latencies: list[float], wall: float) -> str:
    ms = np.array(latencies) * 1000
    return (f"{len(ms) / wall:7.1f} q/s  p50 {np.percentile(ms, 50):7.1f} ms  "
            f"p99 {np.percentile(ms, 99):7.1f} ms")


async def hammer(url: str, sid: str, queries: list[str], clients: int, total: int) -> str:
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

    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return stats(latencies, time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=300, help="per level, service")
    parser.add_argument("--process-calls", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    support, queries = fewrel_sentences()
    tmp = Path(tempfile.mkdtemp())
    ckpt = checkpoint(tmp, args.checkpoint)
    print(f"checkpoint: {ckpt if args.checkpoint else 'untrained'}; 10-way 5-shot support, "
          f"1 query per request; threads={args.threads}; CPUs {os.cpu_count()}")

    # (c) the Python API in one process: the limit.
    predictor = Predictor.from_checkpoint(ckpt, "cpu")
    grouped: dict[str, list] = {}
    for row in support:
        grouped.setdefault(row["relation"], []).append(row)
    predictor.set_support(grouped)
    predictor.predict(queries[:8])  # warm
    for clients in LEVELS:
        latencies, t0 = [], time.perf_counter()
        for s in range(0, max(64, 4 * clients), clients):
            t1 = time.perf_counter()
            predictor.predict(queries[s : s + clients])
            latencies += [time.perf_counter() - t1] * clients
        print(f"(c) Python API, {clients:2d} queries a call:     "
              f"{stats(latencies, time.perf_counter() - t0)}")

    # (b) a regrab-predict process per call.
    (tmp / "support.jsonl").write_text("\n".join(json.dumps(r) for r in support) + "\n")
    latencies = []
    for i in range(args.process_calls):
        (tmp / "q.jsonl").write_text(json.dumps({"text": queries[i]}) + "\n")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "from cli.entry import predict; predict()",
                        "--checkpoint", str(ckpt), "--support", str(tmp / "support.jsonl"),
                        "--queries", str(tmp / "q.jsonl"), "--out", str(tmp / f"o{i}.jsonl"),
                        "--device", "cpu", "--threads", str(args.threads)],
                       cwd=ROOT, check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
        latencies.append(time.perf_counter() - t0)
    print(f"(b) regrab-predict per call, 1 client:    {stats(latencies, sum(latencies))}")

    # (a) the service.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "serve.main", "--checkpoint", str(ckpt),
                             "--port", str(port), "--device", "cpu", "--threads",
                             str(args.threads)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        sid = httpx.post(f"{url}/v1/support-sets", json={"support": support},
                         timeout=300).json()["support_set_id"]
        for clients in LEVELS:
            total = args.requests // 3 if clients == 1 else args.requests
            line = asyncio.run(hammer(url, sid, queries, clients, total))
            print(f"(a) regrab-serve, {clients:2d} clients:             {line}")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
