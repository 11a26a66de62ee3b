"""Reward functions and graders.

    from fastrl.rewards import get_reward, RewardScorer
    result = get_reward("geo3k")(response, ground_truth)   # RewardResult(overall, format, accuracy, valid)
    bounded = get_reward("geo3k", timeout_s=5.0)            # the same in a worker process, 5 s at most

The bare function (no ``timeout_s``) has no time limit: an adversarial answer can hang sympy. Grade
untrusted text with ``timeout_s`` or with :class:`RewardScorer` (batches, worker pool, timeouts).

A reward function takes the response only, never the prompt. Built-ins: ``geo3k`` (spec section
5, mathruler), ``geoqa8k`` (plus unit-aware numbers), ``math`` (math-verify), ``easy_vqa`` and
``easy_vqa_strict``; custom ones load from ``path.py:function``.
"""

from fastrl.rewards.answer_format import FORMAT_SCORE, format_score, has_thinking_format, last_boxed_content
from fastrl.rewards.api import get_reward
from fastrl.rewards.registry import RewardFn, RewardSpecError, list_rewards
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
