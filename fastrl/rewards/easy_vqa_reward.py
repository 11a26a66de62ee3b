"""easy-vqa rewards: normalized exact match of the last boxed answer.

``easy_vqa``: ``overall = accuracy + format`` as in spec section 5 (values 0, 0.5, 1, 1.5).
``easy_vqa_strict``: ``overall = 1`` only for a well-formatted correct answer, else 0, so that a
policy cannot trade the format for the answer; ``accuracy`` and ``format`` are reported as usual.
"""

from __future__ import annotations

import re

from fastrl.rewards.answer_format import format_score, last_boxed_content
from fastrl.rewards.result import RewardResult

_TEXT_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mathbf|textit|emph)\s*\{(.*)\}$", re.DOTALL)
_ARTICLE = re.compile(r"^(?:a|an|the)\s+")


def normalize_short_answer(text: str) -> str:
    """Lower-case, drop ``\\text{}``-style wrappers, quotes, a leading article, trailing
    punctuation and repeated spaces: ``"\\text{ Circle. }"`` -> ``"circle"``."""
    s = text.strip()
    while True:
        m = _TEXT_WRAPPER.match(s)
        if m is None:
            break
        s = m.group(1).strip()
    s = s.lower()
    previous = None
    while s != previous:  # quotes and punctuation in any order: "'Yes'!" -> yes
        previous = s
        s = s.strip().strip("\"'`").rstrip(".!?,;:")
    s = _ARTICLE.sub("", s)
    return " ".join(s.split())


def _match(response: str, ground_truth: str) -> tuple[float, float]:
    fmt = format_score(response)
    answer = last_boxed_content(response)
    correct = answer is not None and normalize_short_answer(answer) == normalize_short_answer(ground_truth)
    return fmt, 1.0 if correct else 0.0


def easy_vqa_reward(response: str, ground_truth: str) -> RewardResult:
    """``format (0.5) + accuracy (1.0)``; accuracy is a normalized exact match of the last box."""
    fmt, accuracy = _match(response, ground_truth)
    return RewardResult(overall=accuracy + fmt, format=fmt, accuracy=accuracy)


def easy_vqa_strict_reward(response: str, ground_truth: str) -> RewardResult:
    """``overall = 1`` for a well-formatted correct answer, else 0."""
    fmt, accuracy = _match(response, ground_truth)
    overall = 1.0 if (fmt > 0 and accuracy > 0) else 0.0
    return RewardResult(overall=overall, format=fmt, accuracy=accuracy)
