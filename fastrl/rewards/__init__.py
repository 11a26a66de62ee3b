"""Reward functions and graders.

    from fastrl.rewards import get_reward, RewardScorer
    result = get_reward("geo3k")(response, ground_truth)   # RewardResult(overall, format, accuracy, valid)

A reward function takes the response only, never the prompt. Built-ins: ``geo3k`` (spec section
5, mathruler), ``geoqa8k`` (plus unit-aware numbers), ``math`` (math-verify), ``easy_vqa`` and
``easy_vqa_strict``; custom ones load from ``path.py:function``.
"""

from fastrl.rewards.answer_format import FORMAT_SCORE, format_score, has_thinking_format, last_boxed_content
from fastrl.rewards.registry import RewardFn, RewardSpecError, get_reward, list_rewards
from fastrl.rewards.result import RewardResult
from fastrl.rewards.scorer import RewardScorer, ScoreStats

__all__ = [
    "FORMAT_SCORE",
    "RewardFn",
    "RewardResult",
    "RewardScorer",
    "RewardSpecError",
    "ScoreStats",
    "format_score",
    "get_reward",
    "has_thinking_format",
    "last_boxed_content",
    "list_rewards",
]
