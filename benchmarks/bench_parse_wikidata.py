"""Benchmark the Wikidata parse: scaling over Dask workers against the decompression limit.

For each dump it prints wall seconds, compressed MB/s and entities/s of

1. the parse in one process (``--workers 0``) and as Dask tasks on a local cluster of 1 and
   2 worker processes (the same byte ranges each time);
2. decompression alone over the same ranges, as Dask tasks on 1 and 2 workers: the limit
   for any parser that decodes bzip2 on those cores (stdlib ``bz2`` on one core too);
3. plain single-threaded ``bz2`` + ``json``, extracting the same item-valued statements;

then projects the full Wikidata dump on N workers from the measured rates, with every
assumption printed.

Usage::

    python benchmarks/bench_parse_wikidata.py                   # the mirror's opentapioca dumps
    python benchmarks/bench_parse_wikidata.py --synthetic-mb 50 # plus a ~50 MB generated dump
    python benchmarks/bench_parse_wikidata.py DUMP.json.bz2 ...

The synthetic dump repeats the mirror's real entities with shifted item ids, written as
concatenated bzip2 streams compressed in parallel; it is kept at ``--synthetic-path`` and
reused. Timings on a shared machine vary with other people's load: the load average is
printed before and after.
"""

from __future__ import annotations

import argparse
import bz2
import json
import logging
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.config import data_mirror  # noqa: E402
from pipeline.wikidata import ranges as wr  # noqa: E402
from pipeline.wikidata.collect import FileStats, ParseResult, work_dir_for  # noqa: E402
from pipeline.wikidata.engine import parse_inputs  # noqa: E402
from pipeline.wikidata.formats import InputFormat, detect_format, usable_cores  # noqa: E402
from pipeline.wikidata.tables import first_occurrences, write_triples  # noqa: E402

#: Item-id shift between repetitions of the seed entities in the synthetic dump; the
#: seed ids are below 1e8, so 42 repetitions stay under the uint32 id ceiling.
ID_SHIFT = 10**8
MAX_DISTINCT_REPEATS = 42


def mirror_dumps() -> list[Path]:
    mirror = data_mirror() or (ROOT.parent / "shared" / "data")
    dumps = sorted((mirror / "wikidata" / "dumps").glob("*.json.bz2"))
    if not dumps:
        sys.exit(f"no dumps under {mirror}/wikidata/dumps; set REGRAB_DATA_MIRROR or pass files")
    return dumps


def seed_entities(dumps: list[Path]) -> list[dict]:
    entities = []
    for path in dumps:
        with bz2.open(path) as fh:
            for line in fh:
                line = line.strip().rstrip(b",")
                if line and line not in (b"[", b"]"):
                    entities.append(orjson.loads(line))
    return entities


def _compress_repeat(args: tuple[list[dict], int]) -> bytes:
    entities, repeat = args
    shift = (repeat % MAX_DISTINCT_REPEATS) * ID_SHIFT
    lines = []
    for entity in entities:
        entity = dict(entity, id=f"Q{int(entity['id'][1:]) + shift}")
        lines.append(orjson.dumps(entity) + b",\n")
    head = b"[\n" if repeat == 0 else b""
    return bz2.compress(head + b"".join(lines), 9)


def make_synthetic(path: Path, target_mb: float, dumps: list[Path], workers: int) -> Path:
    """Write (or reuse) a dump of about ``target_mb`` compressed MB in the official layout."""
    if path.exists() and abs(path.stat().st_size / 1e6 - target_mb) < 0.1 * target_mb:
        print(f"reusing {path} ({path.stat().st_size / 1e6:.1f} MB)")
        return path
    entities = seed_entities(dumps)
    first = _compress_repeat((entities, 0))
    repeats = max(1, round(target_mb * 1e6 / len(first)))
    started = time.perf_counter()
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as out, multiprocessing.get_context("forkserver").Pool(workers) as pool:
        out.write(first)
        for block in pool.imap(_compress_repeat, ((entities, k) for k in range(1, repeats))):
            out.write(block)
        out.write(bz2.compress(b"]\n"))
    tmp.replace(path)
    print(
        f"wrote {path}: {path.stat().st_size / 1e6:.1f} MB, {repeats} x {len(entities)} "
        f"entities, in {time.perf_counter() - started:.0f} s"
    )
    return path


#: The full dump the projection is for: latest-all.json.bz2, late 2026 (about 130 GB).
FULL_DUMP_GB = 130.0


def measure(function: Callable[[], tuple]) -> dict[str, float]:
    """Run ``function`` -> (entities, triples[, task CPU seconds]); wall and CPU seconds.

    CPU is the tasks' own thread time where the function reports it (Dask workers are
    other processes), else this process's and its children's.
    """
    cpu0, wall0 = os.times(), time.perf_counter()
    entities, triples, *task_cpu = function()
    wall, cpu1 = time.perf_counter() - wall0, os.times()
    cpu = task_cpu[0] if task_cpu else sum(cpu1[:4]) - sum(cpu0[:4])
    return {"wall": wall, "cpu": cpu, "entities": entities, "triples": triples}


def ours(path: Path, workers: int, address: str | None, range_bytes: int) -> Callable:
    """The stage's parse (no output tables); ``address`` is a cluster already started, so
    its start-up time is not counted (it is printed separately)."""

    def run() -> tuple[int, int, float]:
        with tempfile.TemporaryDirectory() as tmp:
            parsed, store = parse_inputs(
                [path],
                work_dir_for(Path(tmp) / "t.parquet"),
                workers=workers,
                address=address,
                range_bytes=range_bytes,
                progress=False,
            )
            store.remove()
        stats = parsed.stats[0]
        return stats.entities, stats.triples, stats.cpu_seconds

    return run


def _decompress_range(work: wr.WorkRange) -> float:
    """Decompression alone of one range, the same reads and block decoding as the parse;
    returns the thread's CPU seconds."""
    started = time.thread_time()
    for _ in wr.owned_text(work, wr.RangeResult()):
        pass
    return time.thread_time() - started


def decompress_only(path: Path, client, range_bytes: int) -> Callable:
    def run() -> tuple[int, int, float]:
        work = wr.plan_ranges(path, 0, detect_format(path), range_bytes)
        return 0, 0, sum(client.gather(client.map(_decompress_range, work, pure=False)))

    return run


def plain_bz2_json(path: Path) -> tuple[int, int]:
    """The straightforward reader: stdlib bz2 lines, ``json.loads``, walk the claims."""
    entities = triples = 0
    with bz2.open(path) as fh:
        for line in fh:
            line = line.strip().rstrip(b",")
            if not line or line in (b"[", b"]"):
                continue
            entity = json.loads(line)
            entities += 1
            if entity.get("type") != "item":
                continue
            for statements in entity.get("claims", {}).values():
                for statement in statements:
                    snak = statement["mainsnak"]
                    if statement.get("rank") == "deprecated" or snak["snaktype"] != "value":
                        continue
                    value = snak["datavalue"]
                    if value["type"] == "wikibase-entityid" and (
                        value["value"].get("entity-type") == "item"
                    ):
                        triples += 1
    return entities, triples


def stdlib_decompress(path: Path) -> tuple[int, int]:
    with bz2.open(path) as stream:
        while stream.read(4 << 20):
            pass
    return 0, 0


def dedup_seconds_per_triple(n: int = 4_000_000) -> float:
    """Driver-side cost after the parse, per raw triple: exact deduplication and the triples
    write, on ``n`` random triples (a tenth of them repeats) from two files."""
    rng = np.random.default_rng(0)
    heads = rng.integers(1, 10**8, n, dtype=np.uint32)
    relations = rng.integers(1, 10**4, n, dtype=np.uint32)
    tails = rng.integers(1, 10**8, n, dtype=np.uint32)
    repeats = rng.integers(0, n, n // 10)
    heads[repeats[::2]], relations[repeats[::2]], tails[repeats[::2]] = (
        heads[repeats[1::2]],
        relations[repeats[1::2]],
        tails[repeats[1::2]],
    )
    fmt = InputFormat("dump", "bz2")
    parsed = ParseResult(
        heads=heads,
        relations=relations,
        tails=tails,
        file_index=(np.arange(n) >= n // 2).astype(np.uint16),
        labels={},
        stats=[FileStats(name, name, fmt, 0) for name in ("a", "b")],
    )
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        keep = first_occurrences(parsed)
        write_triples(parsed, keep, Path(tmp) / "t.parquet")
        return (time.perf_counter() - started) / n


def projection(
    walls: dict[int, float],
    cpu: dict[str, float],
    size_mb: float,
    triples_per_mb: float,
    dedup_s: float,
) -> None:
    """Print the full-dump projection and its assumptions.

    Args:
        walls: Wall seconds of the parse on 1 and 2 Dask workers.
        cpu: Task CPU seconds of the parse and of decompression alone (per dump).
        size_mb: Compressed MB of the dump measured.
    """
    per_core = size_mb / cpu["parse"]  # MB/s of one busy core
    limit = size_mb / cpu["decompress only"]
    efficiency = walls[1] / (2 * walls[2])
    full_mb = FULL_DUMP_GB * 1000
    triples = triples_per_mb * full_mb
    dedup = dedup_s * triples
    print("\nprojection for the full dump, assumptions:")
    print(
        f"  - latest-all.json.bz2 is {FULL_DUMP_GB:.0f} GB and its entities are like these "
        f"({triples_per_mb:,.0f} item-valued statements per compressed MB -> "
        f"{triples / 1e9:.1f} billion raw triples)"
    )
    print(
        f"  - a worker is one core like these: {per_core:.2f} MB/s parsing, "
        f"{limit:.2f} MB/s decompressing alone (task CPU time, the slower of the 1- and "
        "2-worker runs, so other load here counts little)"
    )
    print(
        f"  - workers scale linearly: ranges share nothing and a 64 MiB range is "
        f"{64 * 1.048576 / per_core / 60:.0f} min of work, so the scheduler's cost per task "
        f"is negligible ({full_mb / 64 / 1.048576:,.0f} tasks); measured here, 2 workers on "
        f"2 shared cores ran at {efficiency:.0%} of twice 1 worker"
    )
    print("  - workers read the dump from shared storage faster than they parse it")
    print(
        f"  - then the driver deduplicates and writes the triples on one core: "
        f"{dedup_s * 1e9 / 3600:.2f} h per billion triples here, about 40 bytes of memory "
        f"per triple ({40 * triples / 1e9:.0f} GB)"
    )
    print(f"  {'workers':>8} | {'parse h':>8} | {'+ dedup h':>9} | {'decompress limit h':>18}")
    for n in (1, 2, 16, 90, 256):
        parse_h = full_mb / (n * per_core) / 3600
        print(
            f"  {n:8d} | {parse_h:8.1f} | {parse_h + dedup / 3600:9.1f} | "
            f"{full_mb / (n * limit) / 3600:18.1f}"
        )


def main(argv: list[str] | None = None) -> None:
    cores = usable_cores()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dumps", nargs="*", type=Path, help="bz2 dumps (default: the mirror's)")
    parser.add_argument(
        "--synthetic-mb",
        type=float,
        default=0.0,
        help="also benchmark a generated dump of about this many MB (0: none)",
    )
    parser.add_argument(
        "--synthetic-path",
        type=Path,
        default=None,
        help="where to keep the generated dump (default: /tmp)",
    )
    parser.add_argument("--range-mb", type=float, default=1.0, help="compressed MiB per work unit")
    parser.add_argument("--plain", action="store_true", help="also time plain bz2 + json")
    args = parser.parse_args(argv)
    from distributed import Client, LocalCluster

    seeds = mirror_dumps()
    dumps = list(args.dumps) or seeds
    if args.synthetic_mb > 0:
        path = args.synthetic_path or Path(
            f"/tmp/regrab_bench_wikidata_{args.synthetic_mb:g}mb.json.bz2"
        )
        dumps.append(make_synthetic(path, args.synthetic_mb, seeds, cores))
    range_bytes = int(args.range_mb * 2**20)

    import distributed

    print(
        f"machine: {platform.machine()}, {cores} usable cores, Python {platform.python_version()}, "
        f"orjson {orjson.__version__}, distributed {distributed.__version__}; "
        f"ranges of {args.range_mb:g} MiB"
    )
    print(f"load average before: {os.getloadavg()}")
    clusters = {}
    for n in (1, 2):
        started = time.perf_counter()
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        )
        clusters[n] = (cluster, Client(cluster))
        print(f"local cluster of {n} worker(s) started in {time.perf_counter() - started:.1f} s")
    walls: dict[int, float] = {}
    cpu: dict[str, float] = {}
    triples_per_mb = 0.0
    try:
        for path in dumps:
            size_mb = path.stat().st_size / 1e6
            address = {n: clusters[n][0].scheduler_address for n in clusters}
            cases = [
                ("parse, 1 process (--workers 0)", ours(path, 0, None, range_bytes)),
                ("parse, Dask 1 worker", ours(path, 1, address[1], range_bytes)),
                ("parse, Dask 2 workers", ours(path, 2, address[2], range_bytes)),
                ("decompress only, stdlib bz2, 1 core", lambda path=path: stdlib_decompress(path)),
                (
                    "decompress only, Dask 1 worker",
                    decompress_only(path, clusters[1][1], range_bytes),
                ),
                (
                    "decompress only, Dask 2 workers",
                    decompress_only(path, clusters[2][1], range_bytes),
                ),
            ]
            if args.plain:
                cases.append(("plain bz2 + json, 1 thread", lambda path=path: plain_bz2_json(path)))
            for name, function in cases:
                result = measure(function)
                speed = size_mb / result["wall"]
                if path == dumps[-1]:
                    # Per-core rates from the slower of the 1- and 2-worker runs.
                    kind = name.split(",")[0]
                    if name.startswith(("parse, Dask", "decompress only, Dask")):
                        cpu[kind] = max(cpu.get(kind, 0.0), result["cpu"])
                    if name.startswith("parse, Dask"):
                        walls[int(name.split()[2])] = result["wall"]
                        triples_per_mb = result["triples"] / size_mb
                entities_per_s = result["entities"] / result["wall"] if result["entities"] else 0
                print(
                    f"{path.name} ({size_mb:.1f} MB) | {name:36s} | {result['wall']:7.2f} s wall"
                    f" | {result['cpu']:7.2f} s CPU | {speed:6.2f} MB/s | "
                    f"{size_mb / result['cpu']:6.2f} MB/CPU-s | "
                    + (f"{entities_per_s:7,.0f} entities/s" if entities_per_s else "-")
                    + (f" | {result['triples']:,} triples" if result["triples"] else ""),
                    flush=True,
                )
    finally:
        for cluster, client in clusters.values():
            client.close()
            cluster.close()
    print(f"load average after: {os.getloadavg()}")
    dedup_s = dedup_seconds_per_triple()
    projection(walls, cpu, dumps[-1].stat().st_size / 1e6, triples_per_mb, dedup_s)


if __name__ == "__main__":
    main()
