"""KL to the reference policy folded into the reward (``algorithm.kl_in_reward``).

As EasyR1 / verl ``apply_kl_penalty`` (``verl/trainer/ray_trainer.py``): the token-level reward is

    r_{i,t} = s_{i,t} - beta * kl_{i,t},     kl_{i,t} = KL estimator(log pi_old(y_t), log pi_ref(y_t)),

with ``s`` the task score (the scalar reward on the last response token, 0 elsewhere) and ``kl``
masked to response tokens. Their outcome advantage estimators (``compute_grpo_outcome_advantage``,
``compute_rloo_outcome_advantage`` in ``core_algos.py``) reduce the token-level reward by a
**sum** over the response, so a group-relative estimator sees the sequence reward

    R_i = s_i - beta * sum_t m_{i,t} kl_{i,t}.

This module keeps that sum (not a mean): it is what the reference computes, and it is the
single-sample estimate of the sequence-level KL(pi_old(. | x) || pi_ref(. | x)), whose chain rule
is the sum of per-token KLs; a per-token mean would make the penalty independent of length.
The KL is between the *old* policy (the one that generated the rollouts, before this step's
update) and the reference; nothing here is differentiated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.algorithms.kl import KLEstimator, kl_estimate

__all__ = ["KLPenalty", "kl_penalized_rewards"]


@dataclass(frozen=True)
class KLPenalty:
    """What :func:`kl_penalized_rewards` computes.

    Attributes:
        rewards: float32 [N], ``scores - kl_coef * sequence_kl`` (the advantages' input).
        token_kl: float32 [N, T], the per-token KL estimate, 0 outside the response mask.
        sequence_kl: float32 [N], ``sum_t token_kl`` over each response.
        penalty: float32 [N], ``kl_coef * sequence_kl`` (what was subtracted from each reward).
    """

    rewards: torch.Tensor
    token_kl: torch.Tensor
    sequence_kl: torch.Tensor
    penalty: torch.Tensor


def kl_penalized_rewards(
    scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_coef: float,
    estimator: KLEstimator,
) -> KLPenalty:
    """Sequence rewards with the KL to the reference policy subtracted (EasyR1/verl ``apply_kl_penalty``).

    Args:
        scores: float [N], the task reward of each response.
        old_log_probs: float [N, T], log pi_old of each sampled token (any alignment, as long as
            ``ref_log_probs`` and ``response_mask`` share it).
        ref_log_probs: float [N, T], log pi_ref of the same tokens.
        response_mask: bool or 0/1 [N, T], True on response tokens.
        kl_coef: beta >= 0.
        estimator: ``"k1"``, ``"k2"`` or ``"low_var_kl"`` (:mod:`fastrl.algorithms.kl`).

    Returns:
        :class:`KLPenalty` (rewards ``R_i = s_i - beta * sum_t m_{i,t} kl_{i,t}``).

    Raises:
        ValueError: shapes disagree, ``kl_coef`` is negative or not finite, or unknown estimator.

    Example: ``s = [1, 0]``, ``log pi_old = [[-1, -2], [-0.5, 0]]``, ``log pi_ref = [[-1.5, -1],
    [-0.5, 0]]``, mask ``[[1, 1], [1, 0]]``, k1, ``beta = 0.1``: token KL ``[[0.5, -1], [0, 0]]``,
    sequence KL ``[-0.5, 0]``, rewards ``[1.05, 0]``.
    """
    if scores.dim() != 1:
        raise ValueError(f"`scores` must have shape [N], got {tuple(scores.shape)}")
    n = scores.shape[0]
    for name, t in (("old_log_probs", old_log_probs), ("ref_log_probs", ref_log_probs), ("response_mask", response_mask)):
        if t.dim() != 2 or t.shape[0] != n:
            raise ValueError(f"`{name}` must have shape [N={n}, T], got {tuple(t.shape)}")
    if response_mask.shape != old_log_probs.shape:
        raise ValueError(
            f"`response_mask` {tuple(response_mask.shape)} and `old_log_probs` {tuple(old_log_probs.shape)} differ"
        )
    if not (kl_coef >= 0 and kl_coef != float("inf")):
        raise ValueError(f"`kl_coef` must be a finite number >= 0, got {kl_coef}")
    kl = kl_estimate(old_log_probs.float(), ref_log_probs.float(), estimator)
    token_kl = torch.where(response_mask.bool(), kl, torch.zeros_like(kl))  # no 0 * inf outside responses
    sequence_kl = token_kl.sum(dim=1)
    penalty = kl_coef * sequence_kl
    return KLPenalty(
        rewards=(scores.float() - penalty).float(), token_kl=token_kl, sequence_kl=sequence_kl, penalty=penalty.float()
    )
