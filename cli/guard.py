"""What every ``regrab-*`` command does around its work, so none of them loses a file.

* :func:`refuse_same`: an output path that is one of the command's inputs (or another of its
  outputs), by name, symlink or hard link, stops the command before any work.
* :func:`refuse_inside`: the same for an output folder, which must neither be an input nor
  hold one (``--force`` would replace a file in it that the command reads).
* :func:`guard_process`: from a console script's first instruction to its last, SIGTERM
  ends the process with the same line and 143 (while the command's modules load, and after
  its work, when nothing is being written), and a SIGINT inherited ignored (a command
  started with ``&`` in a script) is taken back, so Ctrl-C ends it with 130.
* :func:`run_command`: :func:`pipeline.errors.run_cli`, plus SIGTERM (``kill``, a job
  scheduler's stop) unwinding like Ctrl-C, so the temporaries of an unfinished write are
  removed; it ends with one ``error:`` line and exit status 143. Everything the command
  prints meanwhile goes through :func:`cli.text.printable` (:func:`escaped_output`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from cli.text import EscapingStream
from pipeline.errors import PipelineError, run_cli

#: Exit status of a command stopped by SIGTERM, as a shell reports it (128 + 15).
TERMINATED = 128 + signal.SIGTERM


class Terminated(BaseException):
    """SIGTERM arrived. Not an ``Exception``, so no ``except Exception`` swallows it, and
    every ``finally`` and ``except BaseException`` (the atomic writers') runs on the way out."""


def resolved(path: Path, what: str) -> Path:
    """:func:`pipeline.io.resolved`, imported when first needed: this module is loaded before
    the command's heavy imports (numpy, pyarrow), so that SIGTERM is handled meanwhile."""
    from pipeline.io import resolved as follow

    return follow(path, what)


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same inode, or the same resolved path.

    Raises:
        PipelineError: one of them is a symbolic link that loops (:func:`resolved`).
    """
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): compare where they would be
        return resolved(a, "path") == resolved(b, "path")


def refuse_same(out: Path, what: str, others: dict[str, Path | None]) -> None:
    """Stop when the output ``out`` is one of ``others`` (``{"--queries": path, ...}``).

    Raises:
        PipelineError: naming both options, before anything is read or written.
    """
    resolved(out, what)  # a looping link: one line naming the option
    for name, other in others.items():
        if other is None:
            continue
        resolved(other, name)
        if same_file(Path(out), Path(other)):
            raise PipelineError(f"{what} {out} is also {name} {other} (the same file); "
                                f"writing {what} would overwrite it, give another {what}")


def refuse_inside(out: Path, what: str, others: dict[str, Path | None]) -> None:
    """Stop when the output folder ``out`` is, or holds, one of ``others`` (by resolved path
    or, for an entry of ``out``, by inode): replacing ``out`` or its entries would lose the
    input. ``others`` that do not exist are ignored.

    Raises:
        PipelineError: naming the output and the input, before anything is read or written.
    """
    out = Path(out)
    where = resolved(out, what)
    entries = list(out.iterdir()) if out.is_dir() else []
    for name, other in others.items():
        if other is None or not Path(other).exists():
            continue
        other = Path(other)
        there = resolved(other, name)
        inside = there == where or where in there.parents
        if inside or any(same_file(entry, other) for entry in entries if entry.is_file()):
            raise PipelineError(
                f"{what} {out} is or holds {name} {other}; writing {what} there would replace the "
                f"file being read (--force or not), give another {what} outside it")


#: The line SIGTERM ends a command with (after ``error: ``).
TERMINATED_LINE = ("terminated (SIGTERM); no output was left half-written, run the same "
                   "command again to write it")


def flush_output() -> None:
    """Flush stdout and stderr before an ``os._exit``, so what the command printed is not lost."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _exit_terminated(signum: int, frame: object) -> None:
    flush_output()
    with contextlib.suppress(Exception):
        os.write(2, f"error: {TERMINATED_LINE}\n".encode())
    os._exit(TERMINATED)


def take_interrupt() -> None:
    """Let Ctrl-C (SIGINT) raise KeyboardInterrupt even when the process inherited SIGINT
    ignored, as a command started in the background of a script (``regrab-predict ... &``)
    does: Python keeps an inherited ignore, so ``kill -INT`` and Ctrl-C did nothing until
    SIGKILL, while SIGTERM ended it. Main thread only (signals are set there)."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) == signal.SIG_IGN):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def guard_process() -> None:
    """Until the process ends, SIGTERM outside :func:`run_command` (loading the command's
    modules, or after its work) exits 143 with one ``error:`` line, and SIGINT is not left
    ignored (:func:`take_interrupt`). Call it first, before the heavy imports; nothing is
    written then, so there is nothing to unwind."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_terminated)
        take_interrupt()


def _terminate(owner: int) -> None:
    if os.getpid() != owner:  # a forked child: die as SIGTERM's default would
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    # A second SIGTERM must not cut short the removal of the temporaries.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """stdout and stderr escape control characters and lone surrogates until the end.

    Relation names, sentences and paths come from the user: printed raw, an ESC could
    recolour or clear the terminal, and a lone surrogate would crash the print itself.
    """
    if isinstance(sys.stdout, EscapingStream):  # a command run inside another's run
        yield
        return
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingStream(sys.stdout), EscapingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def run_command(main: Callable[[list[str] | None], object],
                argv: list[str] | None = None) -> None:
    """Run a command's ``main`` as :func:`pipeline.errors.run_cli` does; SIGTERM exits 143.

    Bad input exits 2, Ctrl-C 130, SIGTERM 143, each with one ``error:`` line and no output
    left half-written; what it prints is escaped (:func:`escaped_output`).
    """
    with escaped_output():
        _run(main, argv)


def _run(main: Callable[[list[str] | None], object], argv: list[str] | None) -> None:
    if threading.current_thread() is not threading.main_thread():
        run_cli(main, argv)  # signal handlers can only be set from the main thread
        return
    owner = os.getpid()
    take_interrupt()  # also run as ``python -m cli.<command>``, without the entry point
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: _terminate(owner))
    try:
        run_cli(main, argv)
    except Terminated:
        tqdm = sys.modules.get("tqdm")  # a bar left open would hold the start of the line
        for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
            bar.close()
        print(f"error: {TERMINATED_LINE}", file=sys.stderr)
        sys.exit(TERMINATED)
    finally:
        signal.signal(signal.SIGTERM, previous)
