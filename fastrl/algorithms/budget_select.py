"""Budgeted stratified rollout selection (``pruning.method="budget_stratified"``, issue 49).

On real text MDAP keeps one rollout per advantage bucket (its similarity test is inert), and 30-40%
of what it keeps are the rollouts of uniform groups (advantage 0: no policy gradient;
docs/algorithm.md, "MDAP on real text"). This rule spends a fixed per-step budget where the gradient is:

1. Every row gets two uniform draws ``u``, ``v`` keyed by ``(seed, group id, position in its
   group)`` (:func:`keyed_uniforms`; the seed is one draw from the caller's generator). They depend
   on the rollout, not on its row, so every data-parallel layout of the same groups (the gathered
   batch is the ranks' rows in rank order; a group's rollouts are generated on one rank, in one
   order) makes the same decision for every rollout.
2. *Informative* rows are those whose advantage rounds (4 decimals, the reference's bucket key)
   to a non-zero value: the rows of mixed groups off the group mean. Within each advantage bucket
   they are ranked by ``u`` (a uniform random order); a row's *level* is ``min(rank,
   min_per_bucket)``. Rows whose advantage is 0 (uniform groups, ties at the mean) get level
   ``min_per_bucket + 1``. Rows outside ``candidates`` (near-duplicates merged into a
   representative, :mod:`fastrl.algorithms.near_duplicates`) are never chosen by this phase.
3. The candidates are ordered by (level, ``v``) and the first ones are kept while the budget
   lasts: ``max(1, int(budget_fraction x N))`` rollouts (``budget_unit="rollouts"``) or the longest
   prefix whose response tokens sum to at most ``int(budget_fraction x T)``
   (``budget_unit="tokens"``). Level 0 (one rollout of every informative bucket) is always kept,
   even past the budget (the trainer logs the excess, ``prune/budget_excess``): an informative
   bucket is never emptied. Then levels ``1 .. min_per_bucket - 1`` (up to ``min_per_bucket`` per
   bucket; a level that does not fit whole is filled in ``v`` order), then the other informative
   rows in ``v`` order, then the zero-advantage rows in ``v`` order.
4. MDAP's Phase 2 refill and :class:`~fastrl.algorithms.pruning.PruneResult` follow
   (:func:`~fastrl.algorithms.pruning.finish_pruner`).

Within a bucket the kept set is a uniform random subset given its size (every member has i.i.d.
keys), so weighting each kept rollout by ``members / kept`` of its bucket
(:func:`stratified_weights`) makes the kept advantage sum of every bucket equal the full bucket's
exactly, and the kept gradient a Horvitz-Thompson estimate of the full one. With the token budget
the stopping point depends on the kept rows' lengths, so a row's inclusion probability is only
approximately ``kept / members`` (a slight preference for short responses at the margin); the
bucket sums stay exact.

Uniform groups can also be removed before any selector runs (``pruning.drop_uniform_groups``,
:mod:`fastrl.algorithms.zero_advantage`).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from fastrl.algorithms._checks import check_choice, check_positive_int
from fastrl.algorithms._prune_batch import (
    Batch,
    Refill,
    Semantics,
    advantage_buckets,
    check_generator,
    check_lengths,
    checked_keep,
    rank_in_segments,
    start_pruner,
    to_numpy,
)
from fastrl.algorithms.minhash import _mix64
from fastrl.algorithms.pruning import PruneResult, finish_pruner

__all__ = [
    "BUDGET_UNITS",
    "budget_stratified_select",
    "generator_seed",
    "keyed_uniforms",
    "stratified_weights",
]

BudgetUnit = Literal["rollouts", "tokens"]
BUDGET_UNITS = ("rollouts", "tokens")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def generator_seed(generator: torch.Generator) -> int:
    """One 62-bit seed drawn from ``generator`` (advances it by one draw)."""
    check_generator(generator)
    return int(torch.randint(0, 2**62, (1,), generator=generator, dtype=torch.int64))


def keyed_uniforms(seed: int, group_ids: np.ndarray, local: np.ndarray, stream: int) -> np.ndarray:
    """float64 [N] uniforms in [0, 1) keyed by ``(seed, group id, position in the group, stream)``.

    splitmix64 of the key (the MinHash mixer, :mod:`fastrl.algorithms.minhash`): a rollout's draw
    does not depend on where its row sits in the batch.
    """
    with np.errstate(over="ignore"):
        z = np.uint64(seed & 0xFFFFFFFFFFFFFFFF) ^ _mix64(np.asarray([stream], dtype=np.uint64))[0]
        z = _mix64(group_ids.astype(np.int64).view(np.uint64) * _GOLDEN ^ z)
        z = _mix64(z + local.astype(np.int64).view(np.uint64) * _GOLDEN)
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _zero(adv: np.ndarray) -> np.ndarray:
    """bool [N]: advantage rounds (4 decimals, the reference's bucket key) to 0."""
    return np.round(adv.astype(np.float64), 4) == 0


def _budget_take(order: np.ndarray, floor: int, n: int, lengths: np.ndarray | None, fraction: float, unit: str) -> int:
    """How many rows of ``order`` the budget keeps (at least ``floor``)."""
    if unit == "rollouts":
        return max(floor, min(order.size, max(1, int(fraction * n))))
    budget = int(fraction * float(lengths.sum()))
    within = int(np.count_nonzero(np.cumsum(lengths[order]) <= budget))
    return max(floor, within, 1 if order.size else 0)


def budget_stratified_select(
    advantages: Any,
    group_ids: Any,
    *,
    generator: torch.Generator,
    budget_fraction: float = 0.25,
    budget_unit: BudgetUnit = "rollouts",
    min_per_bucket: int = 2,
    candidates: Any = None,
    semantics: Semantics = "reference",
    adv_tolerance: float = 1e-4,
    multiple: int = 1,
    refill: Refill = "round_robin",
    allow_padding: bool = False,
    response_lengths: Any = None,
) -> PruneResult:
    """Budgeted within-group stratified selection (module docstring), then MDAP's Phase 2 refill.

    Args:
        advantages: float [N], one scalar per rollout (full-batch values); group_ids: int [N].
        generator: seeded ``torch.Generator`` (one draw: the seed of the keyed uniforms).
        budget_fraction: in (0, 1]; of the rollouts (``budget_unit="rollouts"``) or of the batch's
            response tokens (``"tokens"``, needs ``response_lengths``).
        min_per_bucket: ``k >= 1``, rollouts guaranteed to every informative bucket (fewer when the
            bucket has fewer candidates) while the budget lasts; one per bucket always.
        candidates: bool [N] or None (all): the rows the rule may choose (near-duplicate
            representatives); a bucket's ``k`` counts candidates.
        semantics, adv_tolerance: the advantage buckets of
            :func:`~fastrl.algorithms.pruning.mdap_select` (spec 2.1).
        multiple, refill, allow_padding, response_lengths: as
            :func:`~fastrl.algorithms.baseline_pruners.cppo_select`.

    Returns:
        :class:`PruneResult` (``num_buckets``: all advantage buckets).

    Raises:
        ValueError: a bad option, ``candidates`` of another length, the token budget without
            ``response_lengths``; and as :func:`~fastrl.algorithms.pruning.mdap_select`.
    """
    check_choice(budget_unit, "budget_unit", BUDGET_UNITS)
    if not 0.0 < float(budget_fraction) <= 1.0:
        raise ValueError(f"`budget_fraction` must be in (0, 1], got {budget_fraction}")
    k = check_positive_int(min_per_bucket, "min_per_bucket")
    call = start_pruner(
        advantages, group_ids, multiple=multiple, refill=refill, allow_padding=allow_padding,
        response_lengths=response_lengths, semantics=semantics, generator=generator,
    )
    b = call.batch
    if budget_unit == "tokens" and call.lengths is None:
        raise ValueError("`budget_unit='tokens'` needs `response_lengths` (tokens per rollout)")
    cand = np.ones(b.n, dtype=bool) if candidates is None else to_numpy(candidates).astype(bool).reshape(-1)
    if cand.shape[0] != b.n:
        raise ValueError(f"`candidates` has {cand.shape[0]} rows but `advantages` has {b.n}; they must match")
    bid, num_buckets = advantage_buckets(b, semantics, float(adv_tolerance))
    order, floor = _priority(b, bid, cand, k, generator_seed(generator))
    take = _budget_take(order, floor, b.n, call.lengths, float(budget_fraction), budget_unit)
    phase1 = np.zeros(b.n, dtype=bool)
    phase1[order[:take]] = True
    return finish_pruner(call, phase1, num_buckets=num_buckets, pruner="budget-stratified selection")


def _priority(b: Batch, bid: np.ndarray, cand: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, int]:
    """The candidates in keep order (int64 [C]) and the number of informative buckets (level 0)."""
    u = keyed_uniforms(seed, b.group_ids, b.local, 0)
    v = keyed_uniforms(seed, b.group_ids, b.local, 1)
    info = np.nonzero(cand & ~_zero(b.adv))[0]
    srt = info[np.lexsort((b.local[info], b.group_ids[info], u[info], bid[info]))]
    level = np.full(b.n, k + 1, dtype=np.int64)
    level[srt] = np.minimum(rank_in_segments(bid[srt]), k)
    rows = np.nonzero(cand)[0]
    order = rows[np.lexsort((b.local[rows], b.group_ids[rows], v[rows], level[rows]))]
    return order, int(np.count_nonzero(level[info] == 0))


def stratified_weights(
    advantages: Any,
    group_ids: Any,
    keep: Any,
    *,
    clusters: Any = None,
    lengths: Any = None,
    semantics: Semantics = "reference",
    adv_tolerance: float = 1e-4,
) -> torch.Tensor:
    """Per-rollout advantage weights that restore every advantage bucket's sum after selection.

    A bucket ``b`` of ``m_b`` rollouts whose kept members are ``K_b``: each kept row ``i`` carries
    the mass ``mu_i = |c(i)| / |c(i) ∩ kept|`` of its near-duplicate cluster ``c(i)`` (1 without
    ``clusters``: every row its own cluster) and gets ``w_i = m_b mu_i / sum_{j in K_b} mu_j``, so
    ``sum_{i in K_b} w_i = m_b`` and the kept advantages of the bucket sum to ``m_b A_b`` exactly
    (a GRPO group's to 0). Without clusters ``w_i = m_b / k_b``, the Horvitz-Thompson weight of a
    uniform choice of ``k_b`` of ``m_b`` (:func:`~fastrl.algorithms.prune_weights.inverse_keep_weights`).
    As there, the trainer divides by the kept tokens ``T_K``, so the weights are multiplied by
    ``T_K / T_hat`` with ``T_hat = sum_kept w_i L_i`` (ratio estimator; ``lengths`` None: every
    rollout counts 1).

    Args:
        advantages: float [N]; group_ids: int [N]; keep: bool [N], the final keep mask.
        clusters: int [N] or None; rows with equal values form one near-duplicate cluster (e.g. its
            representative's row, :func:`fastrl.algorithms.near_duplicates.near_duplicate_clusters`).
        lengths: int [N] response tokens, or None.
        semantics, adv_tolerance: the advantage buckets (spec 2.1).

    Returns:
        float32 [N]: the weights on kept rows, 0 on the others.

    Raises:
        ValueError: mismatched lengths, an empty keep mask, a bad option.
    """
    b, kept = checked_keep(advantages, group_ids, keep, semantics)
    cl = np.arange(b.n) if clusters is None else to_numpy(clusters).astype(np.int64).reshape(-1)
    if cl.shape[0] != b.n:
        raise ValueError(f"`clusters` has {cl.shape[0]} rows but `advantages` has {b.n}; they must match")
    lens = check_lengths(b.n, lengths, "lengths")
    bid, num_buckets = advantage_buckets(b, semantics, float(adv_tolerance))
    _, cid = np.unique(cl, return_inverse=True)
    cid = cid.reshape(-1)
    size = np.bincount(cid).astype(np.float64)
    kept_in_cluster = np.bincount(cid[kept], minlength=size.shape[0]).astype(np.float64)
    mass = np.zeros(b.n)
    mass[kept] = size[cid[kept]] / kept_in_cluster[cid[kept]]
    members = np.bincount(bid, minlength=num_buckets).astype(np.float64)
    kept_mass = np.bincount(bid[kept], weights=mass[kept], minlength=num_buckets)
    w = np.zeros(b.n)
    w[kept] = members[bid[kept]] * mass[kept] / kept_mass[bid[kept]]
    ln = np.ones(b.n) if lens is None else lens.astype(np.float64)
    t_hat = float((w[kept] * ln[kept]).sum())
    if t_hat > 0:
        w[kept] *= float(ln[kept].sum()) / t_hat
    return torch.from_numpy(w.astype(np.float32))
