"""Text as users hand it to the commands and as the commands print it back.

* :func:`printable`: control characters (ESC, BEL, NUL, a carriage return, ...) and lone
  surrogates written as escapes (``\\x1b``, ``\\ud800``), so a relation name or a sentence
  cannot move the cursor, recolour or clear the user's terminal, and a string that UTF-8
  cannot encode cannot crash the print.
* :class:`EscapingStream`: a text stream that writes everything through :func:`printable`;
  :func:`cli.guard.run_command` puts one in front of stdout and stderr for a command's run.
* :func:`shown`: a user's path or name inside a printed line: :func:`printable`, and a newline
  or tab escaped too, so a file name cannot start a line of its own (a fake ``error:`` line).
* :func:`lone_surrogate`: where a JSON value holds half a UTF-16 pair (JSON's ``"\\ud800"``
  escape, or an undecodable byte of a command-line argument), which no file format can
  store.
"""

from __future__ import annotations

import json
import re
from typing import Any, TextIO

#: C0 controls but newline and tab (which lay out what the commands print), DEL, C1
#: controls, and the surrogate code points.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: :data:`_UNPRINTABLE` and the newline and tab it lets through.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with control characters and lone surrogates written as escapes."""
    return _UNPRINTABLE.sub(_escape, text)


def shown(value: object) -> str:
    """``value`` as text for one printed line: every control character (newline and tab
    too) and lone surrogate written as an escape."""
    return _CONTROL.sub(_escape, str(value))


class EscapingStream:
    """A text stream that writes through :func:`printable`; every other attribute (flush,
    isatty, fileno, encoding) is the wrapped stream's.

    Args:
        stream: the stream to write to (``sys.stdout``, ``sys.stderr``).
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        # A progress bar redraws its line by starting each write with a carriage return.
        lead = "\r" if text.startswith("\r") else ""
        out = lead + printable(text[len(lead):])
        try:
            self.stream.write(out)
        except UnicodeEncodeError:  # PYTHONIOENCODING=ascii, a C locale: escape, not crash
            encoding = getattr(self.stream, "encoding", None) or "ascii"
            self.stream.write(out.encode(encoding, "backslashreplace").decode(encoding))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def lone_surrogate(value: Any) -> bool:
    """Whether a string or JSON value (keys included) holds a lone surrogate, which UTF-8
    cannot encode.

    A pair written as two escapes (``"\\ud83d\\ude00"``) is one character after decoding and
    passes.
    """
    if isinstance(value, str):
        return bool(_SURROGATE.search(value))
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except (TypeError, ValueError, RecursionError):  # not plain JSON: no text of ours to write
        pass
    return False
