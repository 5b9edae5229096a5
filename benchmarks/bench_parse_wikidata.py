"""Benchmark the Wikidata parsing stage on bzip2 dumps.

For each dump it prints compressed MB/s and entities/s of

1. ``stages.parse_wikidata`` (all cores, and one process with one decompression thread),
2. plain single-threaded ``bz2`` + ``json``, extracting the same item-valued statements,
3. decompression alone (stdlib ``bz2`` and ``indexed_bzip2``): the ceiling for any parser.

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
import multiprocessing
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.config import data_mirror  # noqa: E402
from stages import parse_wikidata as pw  # noqa: E402

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


def measure(function: Callable[[], tuple[int, int]]) -> dict[str, float]:
    """Run ``function`` -> (entities, triples); wall and CPU seconds (children included)."""
    cpu0, wall0 = os.times(), time.perf_counter()
    entities, triples = function()
    wall, cpu1 = time.perf_counter() - wall0, os.times()
    cpu = sum(cpu1[:4]) - sum(cpu0[:4])
    return {"wall": wall, "cpu": cpu, "entities": entities, "triples": triples}


def ours(path: Path, workers: int, threads: int) -> Callable[[], tuple[int, int]]:
    def run() -> tuple[int, int]:
        parsed = pw.parse_inputs([path], workers=workers, threads=threads, progress=False)
        return parsed.stats[0].entities, parsed.stats[0].triples

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


def decompress_only(path: Path, how: str, threads: int) -> Callable[[], tuple[int, int]]:
    def run() -> tuple[int, int]:
        if how == "stdlib":
            stream = bz2.open(path)
        else:
            import indexed_bzip2

            stream = indexed_bzip2.open(str(path), parallelization=threads)
        with stream:
            while stream.read(4 << 20):
                pass
        return 0, 0

    return run


def main(argv: list[str] | None = None) -> None:
    cores = pw.usable_cores()
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
    parser.add_argument("--workers", type=int, default=cores, help="parse processes (ours)")
    parser.add_argument("--threads", type=int, default=cores, help="decompression threads")
    args = parser.parse_args(argv)

    seeds = mirror_dumps()
    dumps = list(args.dumps) or seeds
    if args.synthetic_mb > 0:
        path = args.synthetic_path or Path(
            f"/tmp/regrab_bench_wikidata_{args.synthetic_mb:g}mb.json.bz2"
        )
        dumps.append(make_synthetic(path, args.synthetic_mb, seeds, args.workers))

    import indexed_bzip2

    print(
        f"machine: {platform.machine()}, {cores} usable cores, Python {platform.python_version()}, "
        f"orjson {orjson.__version__}, indexed_bzip2 {getattr(indexed_bzip2, '__version__', '?')}"
    )
    print(f"load average before: {os.getloadavg()}")
    rows = []
    for path in dumps:
        size_mb = path.stat().st_size / 1e6
        cases = [
            (
                f"ours: {args.workers} workers, {args.threads} threads",
                ours(path, args.workers, args.threads),
            ),
            ("ours: 1 process, 1 thread", ours(path, 1, 1)),
            ("plain bz2 + json, 1 thread", lambda path=path: plain_bz2_json(path)),
            ("decompress only: stdlib bz2", decompress_only(path, "stdlib", 1)),
            ("decompress only: indexed_bzip2 p=1", decompress_only(path, "parallel", 1)),
            (
                f"decompress only: indexed_bzip2 p={args.threads}",
                decompress_only(path, "parallel", args.threads),
            ),
        ]
        for name, function in cases:
            result = measure(function)
            rows.append((path.name, size_mb, name, result))
            entities_per_s = result["entities"] / result["wall"] if result["entities"] else None
            print(
                f"{path.name} ({size_mb:.1f} MB) | {name:38s} | {result['wall']:7.2f} s wall "
                f"| {result['cpu']:7.2f} s CPU | {size_mb / result['wall']:6.2f} MB/s | "
                + (f"{entities_per_s:9,.0f} entities/s" if entities_per_s else "-")
                + (f" | {result['triples']:,} triples" if result["triples"] else ""),
                flush=True,
            )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
