"""The console scripts' entry points: SIGTERM is handled from their first instruction.

A command's module imports torch and transformers, seconds on a busy machine; a SIGTERM
then, with Python's default action, killed the process with no line. Each entry point here
installs :func:`cli.guard.guard_process` first and only then imports its command.
"""

from __future__ import annotations

import importlib

from cli.guard import guard_process


def _run(command: str) -> None:
    guard_process()
    importlib.import_module(f"cli.{command}").main()


def predict() -> None:
    """``regrab-predict``."""
    _run("predict")


def suggest() -> None:
    """``regrab-suggest``."""
    _run("suggest")


def score() -> None:
    """``regrab-score``."""
    _run("score")


def models() -> None:
    """``regrab-models``."""
    _run("models")


def fewrel_test() -> None:
    """``regrab-fewrel-test``."""
    _run("fewrel_test")
