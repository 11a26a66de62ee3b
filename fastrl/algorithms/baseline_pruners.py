"""Baseline rollout pruners: CPPO, random and advantage-only (spec section 2, baselines).

Each selects a Phase 1 keep mask by its own rule, then shares MDAP's Phase 2 refill and result
(:mod:`fastrl.algorithms.pruning`): same inputs (one scalar advantage per rollout, its group id),
same :class:`~fastrl.algorithms.pruning.PruneResult`, ties broken by batch order, randomness only
from the caller's seeded ``torch.Generator``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fastrl.algorithms._prune_batch import (
    Batch,
    Refill,
    Semantics,
    advantage_buckets,
    rank_by_abs_desc,
    rank_in_segments,
    start_pruner,
)
from fastrl.algorithms.pruning import PruneResult, finish_pruner

__all__ = ["advantage_only_select", "cppo_select", "random_select"]


def _per_group_k(b: Batch, keep_ratio: float) -> np.ndarray:
    """int64 [N]: the kept count ``max(1, int(n_g * keep_ratio))`` of each row's group ``g``."""
    if not (0.0 < float(keep_ratio) <= 1.0):
        raise ValueError(f"`keep_ratio` must be in (0, 1], got {keep_ratio}")
    k_group = np.maximum(1, (b.group_sizes * float(keep_ratio)).astype(np.int64))
    return k_group[b.gidx]


def rank_randomly(b: Batch, segment: np.ndarray, generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by (segment, uniform draw) and their rank within the segment.

    Draws N float64 uniforms from ``generator`` (one per row, row order), so the same seed gives
    the same order. Returns ``(sorted_rows, rank_within_segment)``, both int64 [N].
    """
    u = torch.rand(b.n, generator=generator, dtype=torch.float64).numpy()
    srt = np.lexsort((u, segment))
    return srt, rank_in_segments(segment[srt])


def first_k(b: Batch, srt: np.ndarray, rank: np.ndarray, k: np.ndarray | int) -> np.ndarray:
    """bool [N] Phase 1 mask: the rows ranked below ``k`` (int64 [N] per row, or one int) in their segment.

    ``srt`` / ``rank``: rows sorted by segment and their rank within it (int64 [N] each).
    """
    keep = np.zeros(b.n, dtype=bool)
    keep[srt[rank < (k[srt] if isinstance(k, np.ndarray) else k)]] = True
    return keep


def cppo_select(
    advantages: Any,
    group_ids: Any,
    *,
    keep_ratio: float = 0.5,
    multiple: int = 1,
    refill: Refill = "round_robin",
    allow_padding: bool = False,
    response_lengths: Any = None,
) -> PruneResult:
    """CPPO pruning (Lin et al. 2025, "CPPO: Accelerating the Training of GRPO", section 3):
    keep the ``k = max(1, int(n * keep_ratio))`` rollouts of each group with the largest ``|a|``
    (ties: batch order), then refill as MDAP's Phase 2.

    Args:
        advantages: float [N]; group_ids: int [N]; keep_ratio in (0, 1]; multiple / refill /
        allow_padding: as :func:`~fastrl.algorithms.pruning.mdap_select`; response_lengths:
        optional int [N] for token statistics.

    Returns:
        :class:`PruneResult` (``num_buckets`` = 0).
    """
    call = start_pruner(
        advantages, group_ids, multiple=multiple, refill=refill, allow_padding=allow_padding,
        response_lengths=response_lengths,
    )
    b = call.batch
    k = _per_group_k(b, keep_ratio)
    srt, rank = rank_by_abs_desc(b, b.gidx)
    return finish_pruner(call, first_k(b, srt, rank, k), num_buckets=0, pruner="CPPO")


def random_select(
    advantages: Any,
    group_ids: Any,
    *,
    generator: torch.Generator,
    keep_ratio: float = 0.5,
    multiple: int = 1,
    refill: Refill = "round_robin",
    allow_padding: bool = False,
    response_lengths: Any = None,
) -> PruneResult:
    """Random pruning baseline: keep ``max(1, int(n * keep_ratio))`` uniformly random rollouts per
    group, then refill as MDAP's Phase 2.

    Args:
        generator: a seeded ``torch.Generator`` (draws N uniform numbers; same seed, same result).
        Other arguments as :func:`cppo_select`.
    """
    call = start_pruner(
        advantages, group_ids, multiple=multiple, refill=refill, allow_padding=allow_padding,
        response_lengths=response_lengths, generator=generator,
    )
    b = call.batch
    k = _per_group_k(b, keep_ratio)
    srt, rank = rank_randomly(b, b.gidx, generator)
    return finish_pruner(call, first_k(b, srt, rank, k), num_buckets=0, pruner="random pruning")


def advantage_only_select(
    advantages: Any,
    group_ids: Any,
    *,
    generator: torch.Generator,
    semantics: Semantics = "reference",
    adv_tolerance: float = 1e-4,
    multiple: int = 1,
    refill: Refill = "round_robin",
    allow_padding: bool = False,
    response_lengths: Any = None,
) -> PruneResult:
    """Advantage-only baseline (MDAP without the similarity check): keep one uniformly random
    rollout per advantage bucket, buckets as in :func:`~fastrl.algorithms.pruning.mdap_select`;
    then refill as Phase 2.

    Args:
        generator: a seeded ``torch.Generator``. Other arguments as
        :func:`~fastrl.algorithms.pruning.mdap_select` / :func:`cppo_select`.
    """
    call = start_pruner(
        advantages, group_ids, multiple=multiple, refill=refill, allow_padding=allow_padding,
        response_lengths=response_lengths, semantics=semantics, generator=generator,
    )
    b = call.batch
    bid, num_buckets = advantage_buckets(b, semantics, float(adv_tolerance))
    srt, rank = rank_randomly(b, bid, generator)
    return finish_pruner(call, first_k(b, srt, rank, 1), num_buckets=num_buckets, pruner="advantage-only pruning")
