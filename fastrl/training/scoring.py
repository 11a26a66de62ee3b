"""Phases 3-4 of a step: rewards, DAPO dynamic sampling, the KL penalty in the reward
(``algorithm.kl_in_reward``), group advantages."""

from __future__ import annotations

import logging
import math
from typing import Callable

import torch

from fastrl.algorithms.advantages import grpo_advantages, rloo_advantages
from fastrl.algorithms.filters import overlong_penalty
from fastrl.algorithms.kl_penalty import kl_penalized_rewards
from fastrl.batch import PolicyBatch
from fastrl.config import AlgorithmConfig, RunConfig
from fastrl.distributed import collectives, world
from fastrl.rollout.engine import Rollouts
from fastrl.training.prompting import PromptBatch
from fastrl.training.reward_health import RewardHealth
from fastrl.training.rollout_batch import (
    AdvantagedRollouts,
    ScoredRollouts,
    concat_scored,
    filter_informative,
    num_groups,
    select_scored,
)

logger = logging.getLogger("fastrl.trainer")

Metrics = dict[str, float]


def score(
    scorer, prompts: PromptBatch, rollouts: Rollouts, cfg: RunConfig, *, health: RewardHealth | None = None
) -> tuple[ScoredRollouts, Metrics]:
    """Grade every rollout (invalid where the grader failed) and apply DAPO's overlong shaping.

    Args:
        health: counts the invalid results of the step (closed by ``health.end_step``).

    Returns:
        The scored rollouts and the engine's and scorer's metrics.
    """
    truths = [prompts[i][1].answer for i in rollouts.prompt_index]
    results = scorer.score(rollouts.response_texts, truths)
    if health is not None:
        health.observe(results)
    valid = torch.tensor([r.valid for r in results])
    rewards = torch.tensor([r.overall if r.valid else 0.0 for r in results], dtype=torch.float32)
    accuracy = torch.tensor([r.accuracy if r.valid else 0.0 for r in results], dtype=torch.float32)
    formatted = torch.tensor([bool(r.valid and r.format > 0) for r in results])
    alg = cfg.algorithm
    if alg.overlong_shaping:
        rewards = rewards + overlong_penalty(
            torch.tensor(rollouts.lengths), cfg.rollout.max_response_length, alg.overlong_cache_length
        ).float()
    group_ids = torch.tensor([prompts[i][0] for i in rollouts.prompt_index], dtype=torch.long)
    metrics = {**rollouts.metrics, **scorer.last_stats.as_metrics()}
    return ScoredRollouts(rollouts, group_ids, rewards, accuracy, valid, formatted), metrics


def dynamic_sampling(
    scored: ScoredRollouts, *, alg: AlgorithmConfig, step: int, more: Callable[[int], tuple[ScoredRollouts, int]]
) -> tuple[ScoredRollouts, Metrics]:
    """DAPO dynamic sampling: drop groups whose accuracy is all 0 or all 1 (on accuracy, not the
    shaped reward) and generate more prompts, at most ``max_dynamic_sampling_rounds`` extra
    rounds, until every DP rank holds as many informative groups as it had prompts. When the
    rounds are exhausted, train on what was collected (warned).

    Args:
        more: ``more(round_index)`` generates and scores one extra round on this rank; returns the
            scored rollouts and the number of prompts drawn on this rank.
    """
    if not alg.dynamic_sampling:
        return scored, {}
    target = num_groups(scored)
    total_groups = target
    collected = filter_informative(scored)
    generated = [scored]
    rounds = 0
    while world.any_rank(num_groups(collected) < target) and rounds < alg.max_dynamic_sampling_rounds:
        rounds += 1
        extra, drawn = more(rounds)
        total_groups += drawn
        generated.append(extra)
        collected = concat_scored(collected, filter_informative(extra))
    have = num_groups(collected)
    metrics = {"dapo/extra_rounds": float(rounds), "dapo/informative_group_fraction": have / max(total_groups, 1)}
    metrics.update(generated_view(generated))
    if world.any_rank(have < target):
        logger.warning(
            "step %d: DAPO dynamic sampling found %d of %d informative groups on this rank after %d extra "
            "round(s) (algorithm.max_dynamic_sampling_rounds); training on what was collected",
            step, have, target, rounds,
        )
    if have == 0:
        logger.warning("step %d: no informative group at all; training on the unfiltered batch", step)
        return scored, metrics
    ids = collected.group_ids.tolist()
    wanted = set(sorted(set(ids), key=ids.index)[:target])
    return select_scored(collected, [r for r, g in enumerate(ids) if g in wanted]), metrics


def generated_view(rounds: list[ScoredRollouts]) -> Metrics:
    """DAPO's generated view, over every round and every DP rank, before the filter: the mean
    reward and accuracy of the valid graded rollouts (``reward/generated_mean``,
    ``accuracy/generated_mean``) and the rollouts generated (``rollout/generated_rows``). The
    kept view is ``reward/mean`` and ``accuracy/mean`` (:func:`compute_advantages`), over the
    groups the update trains on."""
    valid = torch.cat([r.valid for r in rounds])
    rewards = torch.cat([r.rewards for r in rounds])[valid]
    accuracy = torch.cat([r.accuracy for r in rounds])[valid]
    rows = collectives.all_reduce_sum_dp(torch.tensor([float(valid.numel())], dtype=torch.float64))
    return {
        "reward/generated_mean": global_mean_std(rewards)[0],
        "accuracy/generated_mean": global_mean_std(accuracy)[0],
        "rollout/generated_rows": float(rows[0]),
    }


def kl_in_reward(scored: ScoredRollouts, batch: PolicyBatch, alg: AlgorithmConfig) -> tuple[torch.Tensor, Metrics]:
    """The rewards the advantages see with ``algorithm.kl_in_reward``: each task reward minus
    ``kl_coef x`` the sum over its response of the per-token ``kl_estimator`` KL between the old and
    the reference policy (EasyR1/verl ``apply_kl_penalty``; :func:`fastrl.algorithms.kl_penalty.kl_penalized_rewards`).

    Args:
        scored: the step's full batch (after DAPO filtering), before advantages.
        batch: the same rows, in the same order, with ``old_log_probs`` and ``ref_log_probs``.

    Returns:
        float32 [R] penalized rewards, and DP-global metrics over the valid rollouts:
        ``kl_penalty/mean`` (the mean of ``kl_coef x sum_t kl_t``, what was subtracted from the
        reward), ``kl_penalty/sequence_kl_mean``, ``kl_penalty/token_kl_mean`` (per response token)
        and ``reward/penalized_mean``.

    Raises:
        KeyError: the batch has no old or reference log-probs.
    """
    missing = [k for k in ("old_log_probs", "ref_log_probs") if getattr(batch, k) is None]
    if missing:
        raise KeyError(f"algorithm.kl_in_reward needs {missing} on the full batch before the advantages")
    out = kl_penalized_rewards(
        scored.rewards, batch.old_log_probs, batch.ref_log_probs, batch.response_mask,
        kl_coef=alg.kl_coef, estimator=alg.kl_estimator,
    )
    v = scored.valid
    tokens = batch.response_mask[v].sum().double()
    sums = collectives.all_reduce_sum_dp(torch.stack([out.token_kl[v].double().sum(), tokens]))
    return out.rewards, {
        "kl_penalty/mean": global_mean_std(out.penalty[v])[0],
        "kl_penalty/sequence_kl_mean": global_mean_std(out.sequence_kl[v])[0],
        "kl_penalty/token_kl_mean": float(sums[0]) / max(float(sums[1]), 1.0),
        "reward/penalized_mean": global_mean_std(out.rewards[v])[0],
    }


def compute_advantages(
    scored: ScoredRollouts, alg: AlgorithmConfig, *, step: int, rewards: torch.Tensor | None = None
) -> tuple[AdvantagedRollouts, Metrics]:
    """Group-relative advantages of the full batch (GRPO / Dr. GRPO / RLOO; invalid rewards
    excluded from the statistics), and the DP-global reward, accuracy and advantage statistics.

    A group with a single valid rollout (every other member's grading failed, or a data source
    that gives every rollout its own group id) has nothing to be compared with: its advantage is 0
    and it teaches nothing. ``advantage/single_member_groups`` counts such groups over every DP
    rank, and a warning names the step whenever there is one. ``advantage/zero_fraction`` is the
    fraction of the step's rollouts (every DP rank) whose advantage is 0; when it is 1 (every
    group's rewards equal) a warning names the step: its update has no policy-gradient term.

    Args:
        step: the training step (for the warning).
        rewards: float [R], the rewards to compute the advantages from when they are not the task
            rewards (``algorithm.kl_in_reward``: :func:`kl_in_reward`); ``reward/*`` metrics stay
            those of the task rewards.

    Returns:
        The rollouts with their advantages (a new :class:`AdvantagedRollouts`; ``scored`` is
        unchanged) and the metrics.
    """
    r = scored.rewards if rewards is None else rewards
    if alg.advantage_estimator == "rloo":
        adv = rloo_advantages(r, scored.group_ids, valid=scored.valid)
    else:
        adv = grpo_advantages(
            r, scored.group_ids, eps=alg.adv_eps, unbiased=alg.std_unbiased,
            scale=alg.advantage_estimator == "grpo", valid=scored.valid,
        )
    scored = scored.with_advantages(adv)
    m: Metrics = {}
    for name, values in (
        ("reward", scored.rewards), ("accuracy", scored.accuracy), ("format", scored.formatted.float()), ("advantage", adv),
    ):
        m[f"{name}/mean"], m[f"{name}/std"] = global_mean_std(values[scored.valid])
    m["advantage/abs_mean"] = global_mean_std(adv.abs())[0]
    m["response/length_mean"] = float(scored.response_lengths.float().mean())
    m["advantage/single_member_groups"] = single = _single_member_groups(scored)
    if single:
        logger.warning(
            "step %d: %d group(s) have a single validly graded rollout, so their advantages are 0 and they "
            "teach nothing (advantage/single_member_groups); check that the rollouts of one prompt share a "
            "group id and that rollout.n >= 2, and the reward/num_invalid count", step, int(single),
        )
    zero, total = _zero_advantage_counts(adv)
    m["advantage/zero_fraction"] = zero / total if total else 0.0
    if total and zero == total:
        logger.warning(
            "step %d: every rollout's advantage is 0 (each group's rewards are all equal; advantage/zero_fraction = 1): "
            "the policy-gradient term of this step's update is 0 and its passes (old/reference log-probs, update, "
            "refit) run for the KL and entropy terms alone. A policy that is never (or always) right gives this; "
            "algorithm.max_dynamic_sampling_rounds (DAPO) draws more prompts until groups differ", step,
        )
    return scored, m


def _zero_advantage_counts(adv: torch.Tensor) -> tuple[float, float]:
    """Rollouts whose advantage is exactly 0 (equal rewards in their group; a single valid member; an
    invalid reward) and all rollouts, summed over every DP rank."""
    local = torch.tensor([float((adv == 0).sum()), float(adv.numel())], dtype=torch.float64)
    zero, total = collectives.all_reduce_sum_dp(local).tolist()
    return zero, total


def _single_member_groups(scored: ScoredRollouts) -> float:
    """Groups with exactly one valid rollout, summed over every DP rank (a group lives on one rank)."""
    ids = scored.group_ids[scored.valid]
    local = float((torch.unique(ids, return_counts=True)[1] == 1).sum()) if ids.numel() else 0.0
    return float(collectives.all_reduce_sum_dp(torch.tensor([local], dtype=torch.float64))[0])


def global_mean_std(values: torch.Tensor) -> tuple[float, float]:
    """Mean and standard deviation of ``values`` over every DP rank (one all-reduce of 3 floats)."""
    v = values.double()
    stats = collectives.all_reduce_sum_dp(torch.stack([v.sum(), (v * v).sum(), torch.tensor(float(v.numel()), dtype=torch.float64)]))
    count = max(float(stats[2]), 1.0)
    mean = float(stats[0]) / count
    return mean, math.sqrt(max(float(stats[1]) / count - mean * mean, 0.0))
