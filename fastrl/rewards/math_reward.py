"""``math`` reward: math-verify grading of the boxed answer (or an ``Answer:`` line).

Answer extraction (the documented choice for the ``math`` reward):
1. the content of the last ``\\boxed{...}``;
2. otherwise the last line of the form ``Answer: ...`` / ``Final answer: ...`` (dollar signs
   stripped), since MATH-style models often end that way;
3. otherwise there is no answer: accuracy 0. The rest of the text is never searched for a number
   (math-verify's own fallback would take the last expression of the response).

The format part is the one of spec section 5: an ``Answer:`` line earns accuracy but never format.

math-verify enforces its time limits with ``signal.alarm``, which raises off the main thread (and
other frameworks' wrappers turned that error into a silent 0). Here its limits are disabled
(``parsing_timeout=None``, ``timeout_seconds=None``): the function works from any thread and the
time limit is enforced by :class:`fastrl.rewards.scorer.RewardScorer`.
"""

from __future__ import annotations

import logging
import re

from fastrl.rewards.answer_format import format_score, last_boxed_content
from fastrl.rewards.result import RewardResult

_ANSWER_LINE = re.compile(
    r"^[ \t>*_#]*(?:final[ \t]+answer|answer)[ \t*_]*[:：][ \t]*(?P<answer>.+?)[ \t]*$",
    re.IGNORECASE | re.MULTILINE,
)


class _DropDisabledTimeoutWarning(logging.Filter):
    """math-verify warns once per process that its own timeout is disabled; the scorer owns the
    time limit, so that warning is noise in every grading worker."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


_FILTER = _DropDisabledTimeoutWarning()


def extract_math_answer(response: str) -> str | None:
    """The answer text of ``response`` per the module rules, or ``None``."""
    boxed = last_boxed_content(response)
    if boxed is not None:
        return boxed
    lines = _ANSWER_LINE.findall(response)
    if not lines:
        return None
    answer, previous = lines[-1], None
    while answer != previous:  # "$13$." -> "13"
        previous = answer
        answer = answer.strip().rstrip(".").strip("$")
    return answer or None


def math_verify_equal(answer: str, ground_truth: str) -> bool:
    """math-verify equality of two LaTeX answers, without signal-based timeouts (thread-safe).

    Raises:
        ValueError: the ground truth cannot be parsed (a data problem, not a wrong answer).
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    gold = parse(f"${ground_truth.strip().strip('$')}$", extraction_config=config, parsing_timeout=None)
    if not gold:
        raise ValueError(f"math-verify cannot parse the ground truth {ground_truth!r}")
    pred = parse(f"${answer.strip().strip('$')}$", extraction_config=config, parsing_timeout=None)
    if not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=None))


def math_reward(response: str, ground_truth: str) -> RewardResult:
    """MATH-style reward: ``overall = accuracy + format`` (values 0, 0.5, 1, 1.5), grader math-verify."""
    fmt = format_score(response)
    answer = extract_math_answer(response)
    accuracy = 1.0 if answer is not None and math_verify_equal(answer, ground_truth) else 0.0
    return RewardResult(overall=accuracy + fmt, format=fmt, accuracy=accuracy)
