"""What an engine process's log says went wrong, in one line for an error message.

The engine's stdout and stderr go to one log file. When the process dies, its last lines are often
not the cause: a harmless warning printed while loading weights, or the interpreter's shutdown
noise, can follow the traceback. :func:`error_excerpt` quotes the exception that ended the last
Python traceback, else the last lines that name an error, and only else the last lines, saying so.

Two kinds of lines are never quoted as a cause:

* lines logged before the engine reported itself ready (:func:`log_error_excerpt`'s ``start``, the
  log's size when the client received the engine's start-up reply): the engine started after
  them, so they did not stop it. An engine killed later by a signal (``SIGKILL``, the OOM killer)
  leaves no line of its own, and its start-up's ``ERROR`` lines are not its death;
* :data:`BENIGN_LINES`, upstream lines logged at ``ERROR`` level for conditions the library
  recovers from (docs/engine.md, "When the engine dies").
"""

from __future__ import annotations

import re
from pathlib import Path

#: Bytes read from the end of the log.
TAIL_BYTES = 16384

#: Upstream log lines at ERROR level that are not failures (matched with ``re.search``):
#: vLLM 0.32's ``repo_utils`` tries to read a ``config.json`` in the tokenizer directory (FastRL's
#: tiny models keep their tokenizer in a ``tokenizer/`` subdirectory without one), logs the failed
#: parse at ERROR twice, then loads the tokenizer without it.
BENIGN_LINES = (
    re.compile(r"\[repo_utils\.py:\d+\] Error parsing config for "),
)

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
        after its header: the exception, not what was logged after it), else ``"error lines: <the
        last 3 lines naming an error>"``, else ``"last lines (none names an error): <the last 6
        lines>"``, or ``"<empty log>"``; :data:`BENIGN_LINES` are left out of all of these.
    """
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not any(b.search(ln) for b in BENIGN_LINES)]
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


def log_error_excerpt(path: Path, chars: int = 600, start: int = 0) -> str:
    """:func:`error_excerpt` of the last :data:`TAIL_BYTES` of the log at ``path`` after byte
    ``start`` (the log's size when the engine reported ready: what it logged while starting is
    not the cause of a later death; module docstring); ``"<no log at PATH>"`` when it cannot be
    read, ``"<nothing logged since start-up>"`` when there is nothing after ``start``."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(fh.tell() - TAIL_BYTES, start, 0))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return f"<no log at {path}>"
    if start > 0 and not text.strip():
        return "<nothing logged since start-up>"
    return error_excerpt(text, chars)
