"""Peer rollout selectors compared with MDAP (issue 18): PODS max-variance down-sampling and
zero-advantage skip. Like :mod:`fastrl.algorithms.baseline_pruners` each selects a Phase 1 keep
mask by its own rule and shares MDAP's Phase 2 refill and :class:`~fastrl.algorithms.pruning.PruneResult`.

- :func:`pods_select`: PODS (Xu et al. 2025, "Not All Rollouts are Useful: Down-Sampling Rollouts
  in LLM Reinforcement Learning"), max-variance rule: keep the ``m`` of a group's ``n`` rollouts
  whose values have the largest variance. Sorting the values, a best set is always the ``k``
  highest plus the ``m - k`` lowest for some ``k`` in ``0..m`` (PODS, Lemma 1), so the rule tries
  the ``m + 1`` such sets. The values are the advantages: within a group the GRPO / Dr.GRPO / RLOO
  advantage is an increasing affine map of the reward, which keeps both the order and the ranking
  of the variances.
  Tie-breaks: equal values are ordered by batch order (the lowest = the first of the ascending
  (value, row) order, the highest = the last); among values of ``k`` with the same variance (to
  1e-12 relative) the smallest ``k`` wins (more of the low end).
- :func:`matched_select`: the matched-ratio peers of MDAP: in every group keep exactly as many
  rollouts as a reference keep mask (MDAP's Phase 1 at the same step) keeps there, chosen by another
  rule: ``"random"`` (uniform, from the caller's generator), ``"top_abs"`` (largest ``|a|``, CPPO's
  rule; ties: batch order) or ``"pods"`` (max variance, as :func:`pods_select`). The same budget,
  spent another way: whether MDAP's choice of *which* rollouts to keep matters.
- :func:`zero_advantage_select`: drop every rollout whose advantage is 0 (to 4 decimals: the
  reference's bucket rounding), i.e. the groups where every response got the same reward and the
  ties at the group mean; they carry no policy gradient (only the KL term). A batch where every
  advantage is 0 keeps the first rollout (batch order) of each group, so that a step still trains.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastrl.algorithms._prune_batch import Refill, rank_by_abs_desc, start_pruner
from fastrl.algorithms.baseline_pruners import first_k, rank_randomly
from fastrl.algorithms.pruning import PruneResult, finish_pruner

__all__ = ["MATCHED_RULES", "matched_select", "max_variance_subset", "pods_select", "zero_advantage_select"]

#: The selection rules of :func:`matched_select`.
MATCHED_RULES = ("random", "top_abs", "pods")


def max_variance_subset(values: Any, m: int) -> np.ndarray:
    """Indices (ascending) of the ``m`` entries of ``values`` with the largest population variance.

    The best set is the ``k`` highest plus the ``m - k`` lowest values for some ``k``; ties as in
    the module docstring (equal values by position, equal variances: the smallest ``k``).

    Raises:
        ValueError: ``m`` outside ``[1, len(values)]``.
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    n = v.shape[0]
    if not 1 <= m <= n:
        raise ValueError(f"`m` must be in [1, {n}], got {m}")
    order = np.lexsort((np.arange(n), v))  # ascending value, then position
    best_k, best_var = 0, -np.inf
    for k in range(m + 1):
        pick = np.concatenate([order[: m - k], order[n - k:]]) if k else order[:m]
        var = float(v[pick].var())
        if k == 0 or var > best_var + 1e-12 * max(1.0, best_var):
            best_k, best_var = k, var
    k = best_k
    pick = np.concatenate([order[: m - k], order[n - k:]]) if k else order[:m]
    return np.sort(pick)


def pods_select(
    advantages: Any,
    group_ids: Any,
    *,
    keep_ratio: float = 0.5,
    multiple: int = 1,
    refill: Refill = "round_robin",
    allow_padding: bool = False,
    response_lengths: Any = None,
) -> PruneResult:
    """PODS max-variance down-sampling: in each group of ``n`` keep the ``m = max(1, int(n x
    keep_ratio))`` rollouts whose advantages have the largest variance (:func:`max_variance_subset`),
    then refill as MDAP's Phase 2.

    Arguments as :func:`~fastrl.algorithms.baseline_pruners.cppo_select`.
    """
    if not (0.0 < float(keep_ratio) <= 1.0):
        raise ValueError(f"`keep_ratio` must be in (0, 1], got {keep_ratio}")
    call = start_pruner(
        advantages, group_ids, multiple=multiple, refill=refill, allow_padding=allow_padding,
        response_lengths=response_lengths,
    )
    b = call.batch
    keep = np.zeros(b.n, dtype=bool)
    for g in range(b.uniq_groups.shape[0]):
        rows = np.nonzero(b.gidx == g)[0]  # batch order
        m = max(1, int(rows.shape[0] * float(keep_ratio)))
        keep[rows[max_variance_subset(b.adv[rows], m)]] = True
    return finish_pruner(call, keep, num_buckets=0, pruner="PODS")


def zero_advantage_select(
    advantages: Any,
    group_ids: Any,
    *,
    multiple: int = 1,
    refill: Refill = "round_robin",
    allow_padding: bool = False,
    response_lengths: Any = None,
) -> PruneResult:
    """Zero-advantage skip: keep the rollouts whose advantage rounds (4 decimals) to a non-zero
    value, then refill as MDAP's Phase 2 (the refill takes the largest ``|a|`` first, so it adds
    zero-advantage rows only when nothing else is left).

    Arguments as :func:`~fastrl.algorithms.baseline_pruners.cppo_select`.
    """
    call = start_pruner(
        advantages, group_ids, multiple=multiple, refill=refill, allow_padding=allow_padding,
        response_lengths=response_lengths,
    )
    b = call.batch
    keep = np.round(b.adv.astype(np.float64), 4) != 0
    if not keep.any():  # no rollout carries a policy gradient: keep each group's first (the KL term trains)
        keep[np.sort(b.order[np.r_[0, np.cumsum(b.group_sizes)[:-1]]])] = True
    return finish_pruner(call, keep, num_buckets=0, pruner="zero-advantage skip")


def matched_select(
    advantages: Any,
    group_ids: Any,
    reference_keep: Any,
    *,
    rule: str,
    generator: Any = None,
    multiple: int = 1,
    refill: Refill = "round_robin",
    allow_padding: bool = False,
    response_lengths: Any = None,
) -> PruneResult:
    """Keep, in every group, as many rollouts as ``reference_keep`` keeps there, chosen by ``rule``;
    then refill as MDAP's Phase 2.

    Args:
        advantages: float [N]; group_ids: int [N].
        reference_keep: bool [N], the reference selection whose per-group counts are matched
            (MDAP's ``PruneResult.phase1_keep`` of the same batch).
        rule: ``"random"`` (uniform; needs ``generator``, draws N float64 uniforms), ``"top_abs"``
            (largest ``|a|``, ties: batch order) or ``"pods"`` (max variance of the kept advantages,
            :func:`max_variance_subset`).
        generator: a seeded ``torch.Generator`` (rule ``"random"`` only).
        multiple / refill / allow_padding / response_lengths: as :func:`pods_select`.

    Returns:
        :class:`PruneResult` whose ``phase1_keep`` holds exactly the reference's count per group
        (``num_buckets`` = 0).

    Raises:
        ValueError: an unknown ``rule``, ``reference_keep`` of another length, or ``"random"``
            without a generator.
    """
    if rule not in MATCHED_RULES:
        raise ValueError(f"`rule` must be one of {MATCHED_RULES}, got {rule!r}")
    call = start_pruner(
        advantages, group_ids, multiple=multiple, refill=refill, allow_padding=allow_padding,
        response_lengths=response_lengths, **({"generator": generator} if rule == "random" else {}),
    )
    b = call.batch
    ref = np.asarray(reference_keep, dtype=bool).reshape(-1)
    if ref.shape[0] != b.n:
        raise ValueError(f"`reference_keep` has {ref.shape[0]} entries for {b.n} rollouts")
    k_group = np.bincount(b.gidx, weights=ref.astype(np.float64), minlength=b.uniq_groups.shape[0]).astype(np.int64)
    if rule == "random":
        srt, rank = rank_randomly(b, b.gidx, generator)
        keep = first_k(b, srt, rank, k_group[b.gidx])
    elif rule == "top_abs":
        srt, rank = rank_by_abs_desc(b, b.gidx)
        keep = first_k(b, srt, rank, k_group[b.gidx])
    else:
        keep = np.zeros(b.n, dtype=bool)
        for g in np.nonzero(k_group)[0]:
            rows = np.nonzero(b.gidx == g)[0]  # batch order
            keep[rows[max_variance_subset(b.adv[rows], int(k_group[g]))]] = True
    return finish_pruner(call, keep, num_buckets=0, pruner=f"matched-ratio {rule}")
