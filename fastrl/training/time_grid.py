"""When a step keeps a checkpoint for later evaluation, and when the training-time budget is spent.

A run compared with another at equal training time keeps checkpoints on a fixed grid of training
times (``checkpoint.save_at_train_s``) and of steps (``checkpoint.save_at_steps``) and stops once
its training time reaches ``trainer.max_train_time_s``; the checkpoints are evaluated after
training (``bench/eval_checkpoints.py``), so that no evaluation runs on the training clock.
Training time is ``time/train_elapsed``: the sum of the step times (seconds), validation,
evaluation and checkpoint saves left out.
"""

from __future__ import annotations

from collections.abc import Sequence


def grid_save_due(
    save_at_train_s: Sequence[float], save_at_steps: Sequence[int], *, step: int, before_s: float, after_s: float
) -> bool:
    """Whether step ``step``, which took the training time from ``before_s`` to ``after_s`` seconds,
    keeps a grid checkpoint: ``step`` is in ``save_at_steps``, or a grid time ``t`` of
    ``save_at_train_s`` was reached by this step (``before_s < t <= after_s``; the first step is
    the one that reaches ``t``, so a step that crosses two grid times keeps one checkpoint for both).
    """
    return step in save_at_steps or any(before_s < t <= after_s for t in save_at_train_s)


def time_budget_spent(max_train_time_s: float | None, train_seconds: float) -> bool:
    """Whether ``train_seconds`` reached the budget ``max_train_time_s`` (None: no budget)."""
    return max_train_time_s is not None and train_seconds >= max_train_time_s
