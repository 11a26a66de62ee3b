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
# Box commands whose content is the final answer: \boxed{..} and the variants models emit
# (\boxed {..}, \fbox{..}, \framebox[2cm]{..}, \bbox[border]{..}, \colorbox{c}{..}); a { ends the match.
_BOX_OPEN = re.compile(r"\\(boxed|fbox|framebox|bbox|colorbox\{[^{}]*\})\s*(?:\[[^\]]*\]\s*)*\{")
# \boxed 12: the brace-less form of the MATH solutions: what follows, up to a space or $ outside
# braces (\boxed 2\pi, \boxed \frac{1}{2}, \boxed \frac {1}{2}; read by _bare_box_content).
_BOX_BARE = re.compile(r"\\boxed[ \t]+(?=[^\s{}$])")
_COMMAND_AT_END = re.compile(r"\\[A-Za-z]+$")


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


def _bare_box_content(text: str, start: int) -> str | None:
    """The brace-less box's content from ``start``: up to a space or ``$`` outside braces, brace
    groups included, and a command's groups after spaces too (``\\frac {1}{2}``); None when a
    group is never closed."""
    i, depth = start, 0
    while i < len(text):
        char = text[i]
        if depth == 0 and (char.isspace() or char == "$"):
            j = i
            while j < len(text) and text[j] in " \t":
                j += 1
            if char != "$" and j < len(text) and text[j] == "{" and _COMMAND_AT_END.search(text, start, i):
                i = j
                continue
            break
        if char == "{":
            depth += 1
        elif char == "}":
            if depth == 0:
                break
            depth -= 1
        i += 1
    return None if depth else text[start:i].strip()


def last_boxed_content(text: str) -> str | None:
    """Content of the last box in ``text``, brace-balanced and stripped; ``None`` when there is none.

    A box is ``\\boxed{...}`` or a variant that models emit for their final answer: ``\\boxed {...}``,
    ``\\fbox{...}``, ``\\framebox[...]{...}``, ``\\bbox[...]{...}``, ``\\colorbox{c}{...}``, and the
    brace-less ``\\boxed 12`` of MATH solutions (up to a space or $ outside braces, brace groups
    included: ``\\boxed 2\\pi`` gives ``2\\pi``, ``\\boxed \\frac{1}{2}`` gives ``\\frac{1}{2}``). The last box by
    position wins; ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. A last box that is never closed
    gives ``None`` (an unfinished answer is no answer). The format reward of spec section 5 still
    requires ``\\boxed{`` itself (:func:`has_thinking_format`).
    """
    opened = list(_BOX_OPEN.finditer(text))
    bare = list(_BOX_BARE.finditer(text))
    last_open = opened[-1] if opened else None
    last_bare = bare[-1] if bare else None
    if last_bare is not None and (last_open is None or last_bare.start() > last_open.start()):
        return _bare_box_content(text, last_bare.end())
    if last_open is None:
        return None
    depth = 0
    begin = last_open.end()
    for i in range(begin, len(text)):
        char = text[i]
        if char == "{":
            depth += 1
        elif char == "}":
            if depth == 0:
                return text[begin:i].strip()
            depth -= 1
    return None
