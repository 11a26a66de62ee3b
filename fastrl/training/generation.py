"""Phase 1-2 of a step: the group size n (ARS), the prompt count, and rollout generation."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from fastrl.algorithms.adaptive_sampling import AdaptiveRolloutSampler
from fastrl.config import RolloutConfig, RunConfig
from fastrl.data import Record
from fastrl.distributed import collectives
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
    rollout: RolloutConfig, seed: int, dp_rank: int, weight_version: int | None = None,
) -> Rollouts:
    """``n`` responses to each prompt of ``items``, sampled with a seed derived from
    ``(rollout.seed, seed, dp_rank)``; the engine is woken for the call (a no-op when it is awake)
    and stays awake: the step puts it to sleep after its last generation round
    (:func:`sleep_engine`), since a level-2 sleep discards the weights, which only the next refit
    brings back (DAPO's extra rounds generate again before any refit).
    ``weight_version`` (the trainer's policy version, ``actor.policy_version``) goes with the
    request: an engine holding older weights raises
    :class:`~fastrl.rollout.engine.StaleWeightsError`.

    With model parallelism (TP or PP > 1) the rollouts are generated once per model-parallel group,
    on its first rank, and broadcast to the peers (:func:`collectives.computed_on_model_parallel_source`;
    the prompts themselves, images included, are not sent: every peer rendered the same ones),
    so every rank holding a shard of one model replica trains on the same token ids (engines on
    different GPUs are not bitwise deterministic even with equal seeds). The peers hold no engine
    (:class:`~fastrl.training.engine_placement.EnginelessPeer`). Collective over the model-parallel
    group; an error on the first rank is raised on every rank of the group.
    """
    chosen = [prompts.prompt_of(r) for _, r in items]

    def sample() -> Rollouts:
        sampling = SamplingParams.for_training(rollout, seed=derive_seed(rollout.seed, seed, dp_rank))
        engine.wake()
        return engine.generate(chosen, n, sampling, weight_version=weight_version)

    if collectives.model_parallel_size() == 1:
        return sample()
    shared = collectives.computed_on_model_parallel_source(lambda: replace(sample(), prompts=[]), what="rollout generation")
    return replace(shared, prompts=list(chosen))


def sleep_engine(engine: RolloutEngine) -> None:
    """After the step's last generation round: the engine (on the model-parallel source rank; the
    peers hold none) releases its GPU memory for the training phases (vLLM sleep level 2 on a GPU
    with ``rollout.sleep_between_steps``; a no-op otherwise). The next refit brings its weights back."""
    if collectives.is_model_parallel_source():
        engine.sleep()
