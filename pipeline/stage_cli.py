"""The preamble every stage and command shares: its parser, ``--params``, logging, threads.

A stage's ``main()`` builds its parser with :func:`parser` (described by its module docstring's
first line, or first paragraph as written), adds its own paths and :func:`add_params`, starts
the log with :func:`start_logging` when it logs progress, reads its section with
``pipeline.config.load_section`` and, when it runs torch, sets the threads and picks the device
with :func:`threads_and_device`. One place for each, so ``--help`` and the log read the same in
every stage.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from pipeline.config import select_device, set_threads

#: The params file a stage reads unless told otherwise.
PARAMS = Path("params.yaml")
#: The log lines of every stage and command: level, logger, message.
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def parser(doc: str | None, *, paragraph: bool = False, raw: bool = False,
           prog: str | None = None, epilog: str | None = None) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line (``paragraph``: its first paragraph; ``raw``:
    shown as written rather than refilled)."""
    text = doc or ""
    description = text.split("\n\n")[0] if paragraph else text.split("\n")[0]
    formatter = argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter
    return argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                   formatter_class=formatter)


def add_params(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--params``: the params file (default ``params.yaml``), a path."""
    parser.add_argument("--params", type=Path, default=PARAMS, help=help)


def start_logging() -> None:
    """INFO lines to stderr as ``LEVEL logger: message``."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


def threads_and_device(threads: int, device: str, what: str) -> str:
    """Set torch's threads, then pick the device ``device`` asks for (``what`` names the key
    in a refusal); the device."""
    set_threads(threads)
    return select_device(device, what)
