"""Response format checks shared by the built-in rewards (spec section 5).

The format reward is earned by the response alone: the functions here never see the prompt, so a
``\\boxed{}`` shown in a prompt or system prompt cannot earn it.
"""

from __future__ import annotations

import re

FORMAT_SCORE = 0.5
"""Format reward of a well-formed response (spec section 5)."""

_SPACES_AROUND_TAG_CHARS = re.compile(r"\s*(<|>|/)\s*")
_THINKING_FORMAT = re.compile(r"<thinking>.*</thinking>.*\\boxed\{.*\}.*", re.DOTALL)
_BOXED = "\\boxed{"


def has_thinking_format(response: str) -> bool:
    """True when ``response`` is ``<thinking>...</thinking>...\\boxed{...}...``.

    Spec section 5: whitespace around ``<``, ``>`` and ``/`` is removed first, then the whole
    response must match (dot matches newline). ``<think>`` tags do not count.
    """
    compact = _SPACES_AROUND_TAG_CHARS.sub(r"\1", response)
    return _THINKING_FORMAT.fullmatch(compact) is not None


def format_score(response: str) -> float:
    """``FORMAT_SCORE`` (0.5) when :func:`has_thinking_format` holds, else 0.0."""
    return FORMAT_SCORE if has_thinking_format(response) else 0.0


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text``, brace-balanced and stripped.

    ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. Returns ``None`` when there is no
    ``\\boxed{`` or the last one is never closed. (Same search as
    ``mathruler.grader.extract_boxed_content``, which returns the string ``"None"`` instead.)
    """
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth = 0
    begin = start + len(_BOXED)
    for i in range(begin, len(text)):
        char = text[i]
        if char == "{":
            depth += 1
        elif char == "}":
            if depth == 0:
                return text[begin:i].strip()
            depth -= 1
    return None
