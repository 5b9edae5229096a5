"""The console scripts' entry points: SIGTERM is handled from their first instruction.

A command's module imports torch and transformers, seconds on a busy machine; a SIGTERM
then, with Python's default action, killed the process with no line. Each entry point here
installs :func:`cli.guard.guard_process` first and only then imports its command.

When the command is done, the process ends at once (:func:`_finish`): Python's own shutdown
puts SIGTERM's default action back before it frees torch's modules, so a SIGTERM in those
last moments, after the output was written, ended the process with no line.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from cli.guard import flush_output, guard_process


def _finish(code: object) -> None:
    """Flush what was printed and logged, then exit with ``code`` (as ``sys.exit`` reads it)
    without the interpreter's shutdown, during which SIGTERM would find no handler."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    flush_output()
    os._exit(code or 0)


def _run(command: str) -> None:
    guard_process()
    try:
        importlib.import_module(f"cli.{command}").main()
    except SystemExit as done:
        _finish(done.code)
    _finish(0)


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
    _run("fewrel_submission")


def adapt() -> None:
    """``regrab-adapt``."""
    _run("adapt")
