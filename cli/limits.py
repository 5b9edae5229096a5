"""Bounds on the commands' numeric options, taken from the machine and checked before the
work allocates anything.

Unchecked, ``--seed 2**70`` overflows torch's seed, ``--threads 100000`` runs out of memory
starting threads and ``--episodes 10**12`` asks numpy for terabytes: each a traceback after
the data and model were loaded. Here each is one ``error:`` line naming the bound.

The work a model does is bounded the same way (:func:`check_support_cost`,
:func:`check_chain_time`): its memory from the sizes of the support, its time from the
encoder and the posterior chain timed on this machine. A run past a week, or past half the
memory, is refused with what it would cost; one past :data:`LONG_S` prints its estimate first.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from model.predict.predictor import SEED_BOUND
from pipeline.budget import check_memory, check_time, duration, seconds_per_call
from pipeline.errors import PipelineError

#: An estimate past this many seconds is printed before the work starts.
LONG_S = 30.0
#: Sentences timed through the encoder to estimate the encoding of the rest.
TIMED_SENTENCES = 64


def check_seed(seed: int, flag: str = "--seed") -> int:
    """``seed`` when it is in ``[0, 2**63)`` (what torch's and numpy's generators take)."""
    if not 0 <= seed < SEED_BOUND:
        raise PipelineError(f"{flag} {seed} is out of range; give a seed from 0 to "
                            f"{SEED_BOUND - 1}")
    return seed


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity outside Linux
        return os.cpu_count() or 1


def check_threads(threads: int, flag: str = "--threads") -> int:
    """``threads`` when it is 0 (torch's default) or at most the CPUs this process has."""
    if not 0 <= threads <= cpus():
        raise PipelineError(f"{flag} {threads}: give 0 (torch's default) or 1 to {cpus()}, "
                            f"the CPUs this process may use")
    return threads


def check_episodes(episodes: int, per_episode: int, flag: str = "--episodes") -> int:
    """``episodes`` when ``per_episode`` bytes each fit in half the machine's memory
    (:func:`pipeline.budget.check_memory`).

    Args:
        episodes: the count asked for.
        per_episode: an estimate of the bytes one episode holds while the command runs.
        flag: the option, for the message.
    """
    return check_memory(episodes, per_episode, flag)


def check_chain_time(model: Any, ways: int, shots: int, chains: int) -> float:
    """Stop when the posterior chains of ``model`` (a :class:`model.methods.base` model, as
    a checkpoint stored it) for ``chains`` episodes of ``ways`` x ``shots`` would run past
    :data:`pipeline.budget.MAX_RUN_S` on this machine (a checkpoint with
    ``langevin.steps: 1000000000``), naming what they would cost; else their seconds."""
    return _chains(model.config, model.encoder.out_dim, [(ways, shots, chains)],
                   "this checkpoint's")


def check_stored_chains(paths: Sequence[Any], settings: Sequence[Any], episodes: int) -> float:
    """:func:`check_chain_time` for the checkpoint files ``paths`` before any is loaded:
    ``episodes`` chains per setting (``ways`` and ``shots`` each), timed here at the default
    encoding size (what matters is a chain of 10^9 steps, which no size makes short). When
    they pass :data:`LONG_S` in all, print the estimate. Returns their seconds."""
    from model.files.checkpoint import read_checkpoint
    from model.posterior.cost import DIM

    total = sum(_chains(read_checkpoint(path).config, DIM,
                        [(s.ways, s.shots, episodes) for s in settings], f"{path}'s")
                for path in paths)
    if total > LONG_S:
        print(f"estimate: about {duration(total)} on this machine for the posterior chains "
              f"({episodes:,} episodes x {len(settings)} setting(s) x {len(paths)} "
              "checkpoint(s), one chain each; measured here), besides the encoding; Ctrl-C "
              "stops it", file=sys.stderr)
    return total


def _chains(config: Any, dim: int, runs: Sequence[tuple[int, int, int]], whose: str) -> float:
    """Seconds of the posterior chains ``runs`` (``(ways, shots, chains)`` each) of a model of
    ``config``; refused past the week's bound."""
    from model.methods import registry
    from model.posterior.cost import chain_seconds

    cfg = config.langevin
    if registry.get(config.method).stepwise:
        cfg = dataclasses.replace(cfg, likelihood="softmax")
    seconds = [chain_seconds(cfg, ways, max(shots, 1), dim) for ways, shots, _ in runs]
    chains = sum(n for _, _, n in runs)
    each = sum(s * n for s, (_, _, n) in zip(seconds, runs, strict=True)) / max(chains, 1)
    check_time(f"{whose} posterior ({cfg.steps:,} Langevin steps per chain)", chains,
               each, "chain", "use a checkpoint trained with fewer model.langevin.steps")
    return chains * each


def encode_seconds(predictor: Any, sentences: Sequence[Any]) -> float:
    """Seconds the encoder of ``predictor`` takes per sentence here, timed on one batch of
    ``sentences`` spread over them (at most :data:`TIMED_SENTENCES`, as the encoder batches
    them); 0 for a few batches' worth, which take seconds."""
    size = min(predictor.batch_size, TIMED_SENTENCES)
    if len(sentences) <= 4 * size:
        return 0.0
    sample = list(sentences[:: len(sentences) // size])[:size]
    return seconds_per_call(lambda: predictor.encode(sample), repeat=1) / len(sample)


def support_bytes(ways: int, dim: int) -> int:
    """The memory one sentence of the padded support holds while it is encoded and checked.

    Every relation is padded to the largest one's sentences: the episode in float32 and the
    suspicion check's float64 copies (about 32 bytes per dimension), and each sentence's
    margin to every relation (8 bytes per relation).
    """
    return 32 * dim + 8 * ways


def check_support_cost(predictor: Any, support: Mapping[str, Sequence[Any]], calls: int,
                       chunk: int, source: str) -> bool:
    """Stop, naming the cost and the fix, when ``support`` (``{relation: [sentence, ...]}``)
    would not fit in memory or its encoding and ``calls`` posterior chains would run past
    :data:`pipeline.budget.MAX_RUN_S`, all measured on this machine before any of it runs;
    when the estimate passes :data:`LONG_S`, print it. Returns whether it did (a long run,
    which shows progress bars).

    Memory grows with ways x the largest relation's sentences x the encoding size (the padded
    support) and with ``chunk`` queries x ways x posterior samples (their logits); the
    encoding's time with the sentences; the chains' with ways x shots.
    """
    model = predictor.model
    ways, shots = len(support), max(map(len, support.values()))
    dim = model.encoder.out_dim
    check_memory(ways * max(shots, 1), support_bytes(ways, dim), source,
                 "padded sentence", subject=(
                     f"{source}: {ways:,} relations, each padded to the largest one's "
                     f"{shots:,} sentences,"),
                 fix="give at most {most:,} relations x sentences of the largest relation "
                     "(fewer relations, or fewer sentences in the largest)")
    cfg = model.config.langevin
    samples = max(cfg.samples, cfg.eval_samples, 1)
    check_memory(chunk, 32 * ways * samples, "--chunk", "query", subject=(
        f"--chunk {chunk} (queries scored at once against {ways:,} relations x {samples} "
        "posterior samples)"), fix="give --chunk {most} or less")
    sentences = [s for way in support.values() for s in way]
    return check_run_time(predictor, sentences, ways if model.prior is not None else 0,
                          f"{source}'s", calls, ways, shots,
                          "give fewer support sentences") > LONG_S


def check_run_time(predictor: Any, sentences: Sequence[Any], names: int, source: str,
                   chains: int, ways: int, shots: int, fix: str) -> float:
    """Stop, naming the cost and ``fix``, when encoding ``sentences`` (and ``names`` relation
    names, which the prior reads) and ``chains`` posterior chains of ``ways`` x ``shots``
    would run past :data:`pipeline.budget.MAX_RUN_S`, both timed on this machine; when the
    estimate passes :data:`LONG_S`, print it. Returns the estimated seconds."""
    each = encode_seconds(predictor, sentences)
    texts = len(sentences) + names
    check_time(f"encoding {source} {len(sentences):,} sentences"
               + (f" and {names:,} relation names" if names else ""), texts, each, "text", fix)
    chain_s = check_chain_time(predictor.model, ways, shots, chains)
    total = texts * each + chain_s
    if total > LONG_S:
        print(f"estimate: about {duration(total)} on this machine (encoding {len(sentences):,} "
              f"sentences {duration(texts * each)}, {chains:,} posterior chains of {ways:,} ways "
              f"x {shots:,} shots {duration(chain_s)}; measured here); Ctrl-C stops it",
              file=sys.stderr)
    return total


def check_episodes_time(predictor: Any, episodes: Sequence[Any]) -> float:
    """:func:`check_run_time` for test episodes (``support``, ``query``, ``relations``, ``ways``
    and ``shots`` each): their distinct sentences, the relation ids the prior reads, and one
    posterior chain per episode (a chain of 10^9 steps per episode must not start)."""
    sentences = list(dict.fromkeys(s for ep in episodes
                                   for s in (*(s for way in ep.support for s in way), ep.query)))
    ids = {r for ep in episodes for r in ep.relations or ()}
    return check_run_time(predictor, sentences,
                          len(ids) if predictor.model.prior is not None else 0,
                          "--input's distinct", len(episodes), max(ep.ways for ep in episodes),
                          max(ep.shots for ep in episodes), "give fewer episodes (split --input)")

def add_run_options(parser: argparse.ArgumentParser, seed_help: str, chunk_help: str) -> None:
    """The options every command that runs a model shares: seed, device, batch, chunk and
    threads (checked by :func:`check_run_options`)."""
    parser.add_argument("--seed", type=int, default=0, help=f"{seed_help}, 0 to 2**63 - 1")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="sentences per encoder batch")
    parser.add_argument("--chunk", type=int, default=2048, help=chunk_help)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads, at most the CPUs (0: torch default)")


def check_run_options(args: argparse.Namespace) -> None:
    """One ``error:`` line for a bad value of :func:`add_run_options`' options."""
    if args.batch_size < 1 or args.chunk < 1:
        raise PipelineError("--batch-size and --chunk must be >= 1")
    check_seed(args.seed)
    check_threads(args.threads)
