"""One-line errors for bad input, and the wrapper that prints them."""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Callable


class PipelineError(Exception):
    """Bad input or environment: the message names the problem and the fix.

    Stage entry points catch it and print one line instead of a traceback.
    """


#: errno of a write that found no room: disk full, a file-size limit (``ulimit -f``), a quota.
NO_ROOM = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
#: The same failures from writers that raise no OSError: safetensors (Rust I/O errors carry
#: "os error N") and torch's zip writer (a short write shows as "unexpected pos").
_NO_ROOM_TEXT = re.compile(
    rf"os error ({'|'.join(map(str, sorted(NO_ROOM)))})\b"
    r"|PytorchStreamWriter failed|unexpected pos \d+ vs \d+"
)
#: Exit status of a command stopped by Ctrl-C, as a shell reports it (128 + SIGINT).
INTERRUPTED = 130


def no_room(exc: BaseException | None) -> str | None:
    """Why ``exc`` (or an exception it came from) is a write that found no room, else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError):
            if exc.errno in NO_ROOM:
                return os.strerror(exc.errno)
        elif _NO_ROOM_TEXT.search(str(exc)):
            found = re.search(r"os error (\d+)", str(exc))
            return os.strerror(int(found.group(1))) if found else "a short write"
        exc = exc.__cause__ or exc.__context__
    return None


def run_cli(main: Callable[[list[str] | None], object], argv: list[str] | None = None) -> None:
    """Run a stage ``main``; end a known failure with one ``error: ...`` line.

    A :class:`PipelineError` and a write that found no room (disk full, ``ulimit -f``, quota)
    exit 2; Ctrl-C exits 130. Outputs are written to temporaries and renamed into place, so
    none of these leaves half a file.
    """
    try:
        main(argv)
    except PipelineError as exc:
        _fail(str(exc), 2)
    except KeyboardInterrupt:
        _fail("interrupted (Ctrl-C); no output was left half-written, run the same command "
              "again to finish (finished parts are resumed)", INTERRUPTED)
    except Exception as exc:
        reason = no_room(exc)
        if reason is None:
            raise
        _fail(f"a write failed ({reason}): the disk is full or a file-size limit (ulimit -f) "
              "or quota was reached; free space or raise the limit, then run the same command "
              "again (no output was left half-written)", 2)


def _fail(message: str, code: int) -> None:
    # A progress bar the failure left open would hold the start of the error's line.
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()
    # One line whatever the message quotes: a path or a value holding a newline is escaped.
    message = message.replace("\r", "\\r").replace("\n", "\\n")
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)
