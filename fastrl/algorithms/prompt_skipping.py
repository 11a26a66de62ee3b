"""GRESO-style pre-rollout prompt skipping (Zhang et al. 2025, "Act Only When It Pays: Efficient
Reinforcement Learning for LLM Reasoning via Selective Rollouts").

Post-rollout pruning (MDAP, CPPO, PODS, ...) saves the old/ref/update passes but never the
generation; a prompt whose group will be all right or all wrong (zero reward variance: every
advantage 0) costs its full generation for nothing. GRESO observes that this is temporally
consistent: a prompt that was zero-variance the last ``z`` times it was drawn is likely to be so
again. Rule (GRESO's probabilistic skip, exploration probability ``p``):

    z(q) = consecutive zero-variance observations of prompt q (most recent first; 0 if the last
           observation had reward variance, or q was never drawn)
    skip q with probability 1 - p ** z(q)

so a never-seen or informative prompt is always generated, and a prompt stuck at zero variance is
re-tried with probability ``p ** z`` (it can come back when the policy changes). The skipped
prompts are not replaced in the step (the step trains on fewer groups; the rollout budget saved is
``skipped x n``). ``max_skip_fraction`` caps the share of a batch that may be skipped.

Pure: question ids and rewards in, a mask out; randomness only from the caller's generator; the
whole state in :meth:`PromptSkipper.state_dict` (kept in the trainer's ``TrainState``-owned
adaptive sampler state so that a checkpoint restores it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["PromptSkipper"]


class PromptSkipper:
    """Per-prompt zero-variance streaks and the skip decision.

    Args:
        explore_prob: ``p`` in (0, 1]: a prompt with streak ``z`` is generated with probability ``p ** z``.
        max_skip_fraction: at most this fraction of a batch is skipped (the rest are generated).
        tolerance: reward spread (max - min) at or below which a group counts as zero-variance.
    """

    def __init__(self, explore_prob: float = 0.5, max_skip_fraction: float = 0.5, tolerance: float = 1e-6) -> None:
        if not 0.0 < float(explore_prob) <= 1.0:
            raise ValueError(f"`explore_prob` must be in (0, 1], got {explore_prob}")
        if not 0.0 <= float(max_skip_fraction) < 1.0:
            raise ValueError(f"`max_skip_fraction` must be in [0, 1), got {max_skip_fraction}")
        self.explore_prob = float(explore_prob)
        self.max_skip_fraction = float(max_skip_fraction)
        self.tolerance = float(tolerance)
        self.streak: dict[int, int] = {}
        self.skipped_total = 0

    def record(self, question_ids: Sequence[int], rewards: Sequence[Sequence[float]]) -> None:
        """Record one observation per prompt: the rewards of its group (any length >= 1)."""
        for q, r in zip(question_ids, rewards, strict=True):
            vals = [float(x) for x in r]
            if not vals:
                continue
            zero_var = max(vals) - min(vals) <= self.tolerance
            self.streak[int(q)] = self.streak.get(int(q), 0) + 1 if zero_var else 0

    def skip_mask(self, question_ids: Sequence[int], generator: torch.Generator) -> list[bool]:
        """True for each prompt to skip this step. Draws one uniform per prompt (in order) from
        ``generator``; when more than ``max_skip_fraction`` would be skipped, the prompts with the
        longest streak (then the earliest) are skipped and the others generated."""
        qs = [int(q) for q in question_ids]
        u = torch.rand(len(qs), generator=generator, dtype=torch.float64).tolist()
        want = [u[i] >= self.explore_prob ** self.streak.get(q, 0) for i, q in enumerate(qs)]
        cap = int(self.max_skip_fraction * len(qs))
        chosen = [i for i in range(len(qs)) if want[i]]
        if len(chosen) > cap:
            chosen = sorted(chosen, key=lambda i: (-self.streak.get(qs[i], 0), i))[:cap]
        mask = [False] * len(qs)
        for i in chosen:
            mask[i] = True
        self.skipped_total += len(chosen)
        return mask

    def state_dict(self) -> dict[str, Any]:
        return {
            "explore_prob": self.explore_prob, "max_skip_fraction": self.max_skip_fraction,
            "tolerance": self.tolerance, "streak": {str(k): v for k, v in sorted(self.streak.items())},
            "skipped_total": self.skipped_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = {int(k): int(v) for k, v in state["streak"].items()}
        self.skipped_total = int(state.get("skipped_total", 0))
