"""One-line errors for bad input, and the wrapper that prints them."""

from __future__ import annotations

import sys
from collections.abc import Callable


class PipelineError(Exception):
    """Bad input or environment: the message names the problem and the fix.

    Stage entry points catch it and print one line instead of a traceback.
    """


def run_cli(main: Callable[[list[str] | None], object], argv: list[str] | None = None) -> None:
    """Run a stage ``main`` and turn a :class:`PipelineError` into ``error: ...`` + exit 2."""
    try:
        main(argv)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
