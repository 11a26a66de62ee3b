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
# \boxed 12: the brace-less form of the MATH solutions (one token, up to a space or $), or
# \boxed \frac{1}{2}: a command token, whose brace groups follow (read by _command_with_groups).
_BOX_BARE = re.compile(r"\\boxed[ \t]+(\\[A-Za-z]+|[^\s{}$\\]+)")


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


def _command_with_groups(text: str, end: int, command: str) -> str | None:
    """``command`` and the balanced brace groups that follow it in ``text`` from ``end`` (``\\frac``
    then ``{1}{2}``); None when a group is never closed."""
    out, i = command, end
    while i < len(text) and text[i] == "{":
        depth, j = 0, i
        while j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                break
            j += 1
        if j == len(text):
            return None
        out, i = out + text[i : j + 1], j + 1
    return out


def last_boxed_content(text: str) -> str | None:
    """Content of the last box in ``text``, brace-balanced and stripped; ``None`` when there is none.

    A box is ``\\boxed{...}`` or a variant that models emit for their final answer: ``\\boxed {...}``,
    ``\\fbox{...}``, ``\\framebox[...]{...}``, ``\\bbox[...]{...}``, ``\\colorbox{c}{...}``, and the
    brace-less ``\\boxed 12`` of MATH solutions (one token, up to a space or $; a command token with
    the brace groups after it: ``\\boxed \\frac{1}{2}`` gives ``\\frac{1}{2}``). The last box by
    position wins; ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. A last box that is never closed
    gives ``None`` (an unfinished answer is no answer). The format reward of spec section 5 still
    requires ``\\boxed{`` itself (:func:`has_thinking_format`).
    """
    opened = list(_BOX_OPEN.finditer(text))
    bare = list(_BOX_BARE.finditer(text))
    last_open = opened[-1] if opened else None
    last_bare = bare[-1] if bare else None
    if last_bare is not None and (last_open is None or last_bare.start() > last_open.start()):
        token = last_bare.group(1)
        return _command_with_groups(text, last_bare.end(), token) if token.startswith("\\") else token.strip()
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
