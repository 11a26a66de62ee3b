"""What an engine process's log says went wrong, in one line for an error message.

The engine's stdout and stderr go to one log file. When the process dies, its last lines are often
not the cause: a harmless warning printed while loading weights, or the interpreter's shutdown
noise, can follow the traceback. :func:`error_excerpt` quotes the exception that ended the last
Python traceback, else the last lines that name an error, and only else the last lines, saying so.
"""

from __future__ import annotations

import re
from pathlib import Path

#: Bytes read from the end of the log.
TAIL_BYTES = 16384

_TRACEBACK = "Traceback (most recent call last):"
_ERROR_WORDS = re.compile(
    r"\b(?:\w*Error|\w*Exception|error|fatal|killed|out of memory|segmentation fault|core dumped|abort(?:ed)?)\b",
    re.IGNORECASE,
)


def error_excerpt(text: str, chars: int = 600) -> str:
    """One line: the cause of an engine's death as its log text tells it.

    Args:
        text: the end of the log (any number of lines).
        chars: the most characters returned (the end of the excerpt is kept).

    Returns:
        ``"error: <exception line>"`` for the last Python traceback (the first unindented line
        after its header: the exception, not what was logged after it), else ``"error lines: <the last 3 lines naming an
        error>"``, else ``"last lines (none names an error): <the last 6 lines>"``, or
        ``"<empty log>"``.
    """
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return "<empty log>"
    start = max((i for i, ln in enumerate(lines) if ln.startswith(_TRACEBACK)), default=None)
    if start is not None:
        ends = [ln for ln in lines[start + 1:] if not ln.startswith((" ", "\t"))]
        if ends:
            return ("error: " + ends[0])[-chars:]
    errors = [ln for ln in lines if _ERROR_WORDS.search(ln)]
    if errors:
        return ("error lines: " + " | ".join(errors[-3:]))[-chars:]
    return ("last lines (none names an error): " + " | ".join(lines[-6:]))[-chars:]


def log_error_excerpt(path: Path, chars: int = 600) -> str:
    """:func:`error_excerpt` of the last :data:`TAIL_BYTES` of the log at ``path``;
    ``"<no log at PATH>"`` when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(fh.tell() - TAIL_BYTES, 0))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return f"<no log at {path}>"
    return error_excerpt(text, chars)
