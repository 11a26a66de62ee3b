"""Phase 1-2 of a step: the group size n (ARS), the prompt count, and rollout generation."""

from __future__ import annotations

from typing import Sequence

from fastrl.algorithms.adaptive_sampling import AdaptiveRolloutSampler
from fastrl.config import RolloutConfig, RunConfig
from fastrl.data import Record
from fastrl.rollout.engine import RolloutEngine, Rollouts, SamplingParams
from fastrl.training.prompting import PromptSource
from fastrl.training.seeds import derive_seed


def group_size(cfg: RunConfig, ars: AdaptiveRolloutSampler) -> int:
    """n for this step: the adaptive sampler's decision, or the configured ``rollout.n``."""
    return ars.n if cfg.adaptive_sampling.enabled else cfg.rollout.n


def prompts_this_step(rollout: RolloutConfig, n: int) -> int:
    """Prompts of a step at group size ``n`` (more prompts at a smaller n when
    ``rollout.keep_rollout_budget_constant``)."""
    if rollout.keep_rollout_budget_constant and n < rollout.n:
        return AdaptiveRolloutSampler.prompts_for_constant_budget(rollout.prompts_per_step, rollout.n, n)
    return rollout.prompts_per_step


def generate(
    engine: RolloutEngine, prompts: PromptSource, items: Sequence[tuple[int, Record]], n: int, *,
    rollout: RolloutConfig, seed: int, dp_rank: int,
) -> Rollouts:
    """``n`` responses to each prompt of ``items``, sampled with a seed derived from
    ``(rollout.seed, seed, dp_rank)``; the engine is woken for the call and put back to sleep."""
    sampling = SamplingParams.for_training(rollout, seed=derive_seed(rollout.seed, seed, dp_rank))
    engine.wake()
    try:
        return engine.generate([prompts.prompt_of(r) for _, r in items], n, sampling)
    finally:
        engine.sleep()
