"""The public grading entry point: :func:`get_reward` (``fastrl.rewards.get_reward``)."""

from __future__ import annotations

import math

from fastrl.rewards.registry import RewardFn, load_reward
from fastrl.rewards.result import RewardResult
from fastrl.rewards.scorer import RewardScorer

__all__ = ["get_reward"]


def get_reward(name: str, *, timeout_s: float | None = None) -> RewardFn:
    """The reward function ``fn(response: str, ground_truth: str) -> RewardResult``.

    ``name`` is a built-in (``geo3k``, ``geoqa8k``, ``math``, ``easy_vqa``, ``easy_vqa_strict``)
    or ``path/to/file.py:function`` for a custom reward. A custom function is called as
    ``function(response, ground_truth)`` and may return a :class:`RewardResult`, a mapping with
    keys ``overall``, ``format`` and ``accuracy`` (``valid`` optional), or a number, which is then
    used as both ``overall`` and ``accuracy`` (``format`` 0).

    Time limit. Without ``timeout_s`` the returned function grades in the calling thread (any
    thread; no signals) with **no time limit**: an adversarial answer can keep sympy (``geo3k``,
    ``geoqa8k``, ``math``) busy for as long as it likes, and a grader exception propagates. Grade
    untrusted responses with ``timeout_s``, or with :class:`fastrl.rewards.RewardScorer` (what the
    trainer uses: batches, a pool of workers, a per-response timeout, counts). With ``timeout_s``
    the function grades in a worker process of its own (a one-worker ``RewardScorer``, started by
    the first call, stopped by the function's ``close()`` or when it is garbage collected) and
    returns ``RewardResult.invalid(...)`` (``valid=False``; ``timed_out=True``) when a response
    takes longer than ``timeout_s`` seconds, whose worker is then killed and replaced; a grader
    exception becomes an invalid result naming it. Keep the function and reuse it: each call is a
    round trip to the worker, the first one also starts it.

    Raises:
        RewardSpecError: unknown name, missing file, missing or non-callable function.
        ValueError: ``timeout_s`` is not a finite number > 0.
    """
    if timeout_s is None:
        return load_reward(name)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
        math.isfinite(timeout_s) and timeout_s > 0
    ):
        raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
    scorer = RewardScorer(name, num_workers=1, timeout_s=float(timeout_s), backend="process")

    def reward(response: str, ground_truth: str) -> RewardResult:
        return scorer.score([response], [ground_truth])[0]

    reward.__name__ = reward.__qualname__ = f"{name} (at most {float(timeout_s):g}s)"
    reward.__doc__ = f"Reward {name!r} graded in a worker process, at most {float(timeout_s):g} s per response."
    reward.close = scorer.close  # type: ignore[attr-defined]
    reward.scorer = scorer  # type: ignore[attr-defined]
    return reward
