"""Bounds on the commands' numeric options, taken from the machine and checked before the
work allocates anything.

Unchecked, ``--seed 2**70`` overflows torch's seed, ``--threads 100000`` runs out of memory
starting threads and ``--episodes 10**12`` asks numpy for terabytes: each a traceback after
the data and model were loaded. Here each is one ``error:`` line naming the bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from model.predict.predictor import SEED_BOUND
from pipeline.budget import check_memory, check_time
from pipeline.errors import PipelineError


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


def check_chain_time(model: Any, ways: int, shots: int, chains: int) -> None:
    """Stop when the posterior chains of ``model`` (a :class:`model.methods.base` model, as
    a checkpoint stored it) for ``chains`` episodes of ``ways`` x ``shots`` would run past
    :data:`pipeline.budget.MAX_RUN_S` on this machine (a checkpoint with
    ``langevin.steps: 1000000000``), naming what they would cost."""
    from model.methods import registry
    from model.posterior.cost import chain_seconds

    cfg = model.config.langevin
    if registry.get(model.config.method).stepwise:
        cfg = dataclasses.replace(cfg, likelihood="softmax")
    check_time(f"this checkpoint's posterior ({cfg.steps:,} Langevin steps per chain)", chains,
               chain_seconds(cfg, ways, max(shots, 1), model.encoder.out_dim), "chain",
               "use a checkpoint trained with fewer model.langevin.steps")


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
