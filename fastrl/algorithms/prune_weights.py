"""Stratified weights for a pruned batch: each advantage bucket keeps the weight it had.

Beyond the paper (``pruning.weighting="bucket_size"``; the reference and the paper train on the
kept rollouts with weight 1). Pruning keeps about one rollout per advantage bucket when responses
are near-copies, so a group of 8 with 6 right (``A = +0.54``) and 2 wrong (``A = -1.62``) can train
on one of each: the kept advantages sum to ``-1.08`` where the full group's sum to 0, and the wrong
minority weighs as much as the right majority. Scaling each kept rollout by
``members(bucket) / kept(bucket)`` makes the kept set a stratified sample of the full batch: every
bucket that keeps at least one rollout contributes ``members x A`` as before pruning, and a group's
kept advantages sum to what the whole group's did (0 for GRPO) unless a bucket lost every member.

Weights are normalized to mean 1 over the kept rollouts, so the loss scale (and the gradient norm
before clipping) stays comparable with unweighted pruning.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from fastrl.algorithms._prune_batch import advantage_buckets, checked_keep, to_numpy

__all__ = ["bucket_size_weights", "inverse_keep_weights"]


def bucket_size_weights(
    advantages: Any,
    group_ids: Any,
    keep: Any,
    *,
    semantics: Literal["reference", "paper"] = "reference",
    adv_tolerance: float = 1e-4,
) -> torch.Tensor:
    """Per-rollout weights that restore each advantage bucket's share after pruning.

    Buckets are the MDAP buckets (spec section 2.1): within a group, advantages rounded to 4
    decimals (``semantics="reference"``) or single-link clusters closer than ``adv_tolerance``
    (``"paper"``). A kept rollout of bucket ``b`` gets ``members(b) / kept(b)``; a pruned one gets 0;
    then the kept weights are divided by their mean.

    Args:
        advantages: float [N], one scalar per rollout (the values the pruner saw).
        group_ids: int [N], one id per prompt.
        keep: bool [N], the pruner's final keep mask (``PruneResult.keep``).
        semantics, adv_tolerance: the bucketing of :func:`fastrl.algorithms.pruning.mdap_select`.

    Returns:
        float32 [N]: weights, mean 1 over the kept rows, 0 on the pruned rows.

    Raises:
        ValueError: mismatched lengths, an empty keep mask, non-finite advantages or a bad option.
    """
    w, kept = _bucket_shares(advantages, group_ids, keep, semantics, adv_tolerance)
    w[kept] /= w[kept].mean()
    return torch.from_numpy(w.astype(np.float32))


def inverse_keep_weights(
    advantages: Any,
    group_ids: Any,
    keep: Any,
    *,
    lengths: Any = None,
    semantics: Literal["reference", "paper"] = "reference",
    adv_tolerance: float = 1e-4,
) -> torch.Tensor:
    """Importance weights of the unbiased MDAP variant (``pruning.method="fastrl_unbiased"``; in
    the spirit of DPPO, arXiv 2603.04135).

    Estimator. The full batch's token-mean policy gradient is
    ``G = (1/T) sum_i A_i sum_t g_it`` over all rollouts ``i`` (``T`` their tokens). Group the rows
    of a prompt into MDAP's advantage buckets ``b`` (``m_b`` members, equal ``A``); pruning keeps
    ``k_b >= 1`` of them, each member of ``b`` with probability ``pi_i = k_b / m_b`` when the choice
    inside a bucket is exchangeable (the members are i.i.d. samples of the same prompt; MDAP's
    similarity filter chooses by content, so this holds approximately). Horvitz-Thompson:
    ``E[sum_{i kept} (1/pi_i) A_i sum_t g_it] = sum_i A_i sum_t g_it``, so weighting each kept row
    by ``w_i = m_b / k_b`` makes the kept token-sum unbiased for the full one. The trainer
    normalizes by the kept tokens ``T_K`` (a global token mean), not ``T``; the weights are
    therefore multiplied by ``T_K / T_hat`` with ``T_hat = sum_{i kept} w_i L_i`` (the
    Horvitz-Thompson estimate of ``T``): the update is then the ratio (Hajek) estimator
    ``sum w_i A_i sum_t g_it / T_hat``, consistent for ``G``. Buckets that lost every member
    (``k_b = 0``) cannot be recovered (MDAP keeps one of every bucket in Phase 1, so this does
    not happen before a trim). Unlike :func:`bucket_size_weights` the weights are not normalized to
    mean 1: their scale carries the ``T_K / T_hat`` correction.

    Args:
        advantages, group_ids, keep, semantics, adv_tolerance: as :func:`bucket_size_weights`.
        lengths: int [N] response tokens per rollout (None: every rollout counts 1, a
            sequence-mean loss).

    Returns:
        float32 [N]: ``w_i T_K / T_hat`` on the kept rows, 0 on the pruned rows.
    """
    w, kept = _bucket_shares(advantages, group_ids, keep, semantics, adv_tolerance)
    lens = np.ones(w.shape[0]) if lengths is None else to_numpy(lengths).astype(np.float64).reshape(-1)
    if lens.shape[0] != w.shape[0]:
        raise ValueError(f"`lengths` has {lens.shape[0]} rows but `advantages` has {w.shape[0]}; they must match")
    t_hat = float((w[kept] * lens[kept]).sum())
    t_kept = float(lens[kept].sum())
    if t_hat > 0:
        w[kept] *= t_kept / t_hat
    return torch.from_numpy(w.astype(np.float32))


def _bucket_shares(advantages: Any, group_ids: Any, keep: Any, semantics: str, adv_tolerance: float) -> tuple[np.ndarray, np.ndarray]:
    """``members(b) / kept(b)`` on each kept row (0 on pruned rows) as float64 [N], and the bool [N]
    keep mask; raises ValueError on mismatched lengths, an empty mask or a bad option."""
    b, kept = checked_keep(advantages, group_ids, keep, semantics)
    bid, num_buckets = advantage_buckets(b, semantics, float(adv_tolerance))
    members = np.bincount(bid, minlength=num_buckets).astype(np.float64)
    kept_in = np.bincount(bid[kept], minlength=num_buckets).astype(np.float64)
    w = np.zeros(b.n, dtype=np.float64)
    w[kept] = members[bid[kept]] / kept_in[bid[kept]]
    return w, kept
