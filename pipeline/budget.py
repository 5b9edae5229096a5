"""What a run would cost on this machine, and the bounds that follow from it.

A value far past what the machine can do (Langevin ``steps=10**9``,
``evaluate.episodes=10**12``, ``regrab-score --episodes 10**7``) used to run for years, or
die out of memory after hours, with no word. Each bound here comes from the machine: memory is
its physical memory, time a speed measured on it times the work counted. A refusal says what
the value would cost and the largest value that fits.

* :func:`check_memory`: at most :data:`MEMORY_SHARE` of the machine's memory.
* :func:`check_time`: at most :data:`MAX_RUN_S` (a week) of this machine's time, measured
  with :func:`seconds_per_call`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping

from pipeline.errors import PipelineError

#: The share of the machine's memory that one run's tables may take.
MEMORY_SHARE = 0.5
#: The longest run a value may ask for: past a week of this machine's time a value is a typo
#: far more often than a plan (the message says what it would cost; split the work to go on).
MAX_RUN_S = 7 * 86_400


def memory() -> int:
    """The machine's physical memory in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def duration(seconds: float) -> str:
    """``seconds`` in the unit a reader takes in at once: ``40 s``, ``3.2 hours``, ``95 years``."""
    for unit, size in (("years", 365 * 86_400), ("days", 86_400), ("hours", 3600),
                       ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.1f} s"


def check_memory(count: int, per_item: int, flag: str, unit: str = "episode",
                 fix: str = "give at most {most}", subject: str | None = None) -> int:
    """``count`` when ``count`` items of ``per_item`` bytes fit in :data:`MEMORY_SHARE` of
    the machine's memory.

    Args:
        fix: what to do, for the message; ``{most}`` is replaced by the most that fits.
        subject: what ``count`` counts, for the message (default: ``flag`` and ``count``).

    Raises:
        PipelineError: naming what ``count`` would need and the most that fits.
    """
    budget = int(memory() * MEMORY_SHARE)
    most = max(budget // max(per_item, 1), 1)
    if count > most:
        raise PipelineError(
            f"{subject or f'{flag} {count}'} would need about "
            f"{count * per_item / 2**30:,.0f} GiB ({per_item:,} bytes per {unit}), more than "
            f"half of this machine's {memory() / 2**30:.0f} GiB; {fix.format(most=most)}")
    return count


def seconds_per_call(call: Callable[[], object], repeat: int = 3) -> float:
    """The fastest of ``repeat`` timed calls of ``call`` (after one warm-up call)."""
    call()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def check_time(what: str, count: int, per_item_s: float, unit: str, fix: str) -> None:
    """Stop when ``count`` items of ``per_item_s`` seconds each take over :data:`MAX_RUN_S`.

    Args:
        what: the work, for the message (``training's Langevin chains``).
        count: how many items.
        per_item_s: seconds one item takes on this machine, measured.
        unit: what one item is (``chain``, ``episode``).
        fix: what to lower, for the message.

    Raises:
        PipelineError: naming the estimate, the speed measured and the fix.
    """
    total = count * per_item_s
    if total > MAX_RUN_S:
        raise PipelineError(
            f"{what} would take about {duration(total)} on this machine ({count:,} {unit}s of "
            f"{duration(per_item_s)} each, measured here), more than {duration(MAX_RUN_S)}; "
            f"{fix}")


def episode_bytes(shapes: Iterable[tuple[int, int]], queries: int, methods: int) -> int:
    """Bytes that one episode of each ``(ways, shots)`` holds while it is scored: its episode
    table (int64 rows of ``ways * (shots + queries)`` sentences) and every method's
    probabilities (``ways * queries`` rows of ``ways`` float64)."""
    return sum(ways * (shots + queries) * 8 + methods * ways * queries * ways * 8
               for ways, shots in shapes)


def check_chains(chains: Mapping[str, int], per_chain_s: Mapping[str, float], what: str,
                 fix: str) -> None:
    """Stop when the chains of every method (``chains[m]`` of ``per_chain_s[m]`` seconds
    each) take over :data:`MAX_RUN_S`, as :func:`check_time` says for their mean."""
    total = sum(n * per_chain_s[m] for m, n in chains.items())
    count = sum(chains.values())
    check_time(what, count, total / max(count, 1), "chain", fix)
