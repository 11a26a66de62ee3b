"""Geometry rewards: ``geo3k`` (spec section 5, mathruler) and ``geoqa8k`` (plus units).

Both score ``overall = accuracy + format`` with ``format`` 0.5 for
``<thinking>...</thinking>...\\boxed{...}`` and ``accuracy`` 1.0 when the last boxed answer grades
equal to the ground truth. A response without ``\\boxed{}`` (for example ``Answer: $13$``) gets
accuracy 0: the reference experiments only read boxed answers.
"""

from __future__ import annotations

from fastrl.rewards.answer_format import format_score, last_boxed_content
from fastrl.rewards.quantities import parse_quantity, quantities_equal
from fastrl.rewards.result import RewardResult


def mathruler_equal(answer: str, ground_truth: str) -> bool:
    """``mathruler.grader.grade_answer(answer, ground_truth)`` (the reference grader, PRM800K rules).

    Known leniency kept for fidelity with the reference: units are stripped, so ``6\\text{ mm}``
    equals ``6\\text{ cm}``; known strictness: ``\\pi \\div 8 + 1 \\div 2`` does not equal
    ``0.5 + \\frac{\\pi}{8}``, and unreduced fractions do not equal reduced ones.
    """
    from mathruler.grader import grade_answer  # imported on first use: pulls in sympy

    return bool(grade_answer(answer, ground_truth))


def geoqa_equal(answer: str, ground_truth: str) -> bool:
    """Unit-aware equality: numeric comparison with unit conversion when both sides read as numbers
    with optional units (:func:`fastrl.rewards.quantities.parse_quantity`), which then decides
    (``6 cm == 60 mm``, ``6 mm != 6 cm``, ``2√3 == \\sqrt{12}``); otherwise mathruler.
    """
    ours, truth = parse_quantity(answer), parse_quantity(ground_truth)
    if ours is not None and truth is not None:
        return quantities_equal(ours, truth)
    return mathruler_equal(answer, ground_truth)


def _boxed_reward(response: str, ground_truth: str, equal) -> RewardResult:
    fmt = format_score(response)
    answer = last_boxed_content(response)
    accuracy = 1.0 if answer is not None and equal(answer, ground_truth) else 0.0
    return RewardResult(overall=accuracy + fmt, format=fmt, accuracy=accuracy)


def geo3k_reward(response: str, ground_truth: str) -> RewardResult:
    """Geometry3K reward exactly as spec section 5 (grader: mathruler). Values 0, 0.5, 1, 1.5."""
    return _boxed_reward(response, ground_truth, mathruler_equal)


def geoqa8k_reward(response: str, ground_truth: str) -> RewardResult:
    """GeoQA8K reward: as ``geo3k`` with the unit-aware comparison :func:`geoqa_equal`."""
    return _boxed_reward(response, ground_truth, geoqa_equal)
