"""Pruning dispatch: the configured pruner (MDAP or a baseline) on one global batch.

Pure selection functions live in :mod:`fastrl.algorithms.pruning`; this maps a
:class:`fastrl.config.PruningConfig` onto them. ``method="none"`` keeps every rollout (a
``PruneResult`` with full keep masks, so the statistics and the adaptive sampler see the same
shape of data whatever the method).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

import fastrl.algorithms as P
from fastrl.algorithms.budget_select import budget_stratified_select
from fastrl.algorithms.minhash import ResponseSketch, minhash_sketch
from fastrl.algorithms.near_duplicates import near_duplicate_clusters
from fastrl.algorithms.zero_advantage import merge_uniform_drop, zero_advantage_groups
from fastrl.config import PruningConfig

#: Methods whose kept rollouts are weighted members / kept of their bucket whatever
#: ``pruning.weighting`` says (importance-weighted MDAP, the budget-stratified rule).
SELF_WEIGHTED_METHODS = ("fastrl_unbiased", "budget_stratified")

#: The methods that run MDAP: itself, its importance-weighted variant, and the matched-ratio peers
#: (which keep MDAP's per-group counts, chosen by another rule).
MDAP_METHODS = ("fastrl", "fastrl_unbiased", "matched_random", "matched_top_abs", "matched_pods")


def keep_all(group_ids: torch.Tensor, lengths: torch.Tensor) -> P.PruneResult:
    """A PruneResult that keeps every rollout."""
    keep = torch.ones(len(group_ids), dtype=torch.bool)
    ids, counts = torch.unique(group_ids, return_counts=True)
    per_group = {int(g): int(c) for g, c in zip(ids, counts)}
    total = int(lengths.sum())
    return P.PruneResult(
        keep=keep, phase1_keep=keep.clone(), kept_per_group=per_group,
        f1=float(counts.float().mean()) if len(counts) else 0.0, f2=int(counts.max()) if len(counts) else 0,
        num_buckets=0, num_refilled=0, num_padding=0, zero_advantage_kept=0,
        kept_tokens=total, total_tokens=total, time_s=0.0,
    )


def select_rollouts(
    cfg: PruningConfig,
    advantages: torch.Tensor,
    group_ids: torch.Tensor,
    responses: Sequence[torch.Tensor] | ResponseSketch,
    *,
    multiple: int,
    generator: torch.Generator,
    response_lengths: torch.Tensor | None = None,
) -> P.PruneResult:
    """Run ``cfg.method`` on the global batch.

    Args:
        advantages: float [N]; group_ids: int64 [N]; responses: N int64 [L_i] token-id tensors,
            or their MinHash sketch (``similarity_mode="minhash"``; what DP ranks exchange).
        multiple: the kept count is refilled to a multiple of this (spec 2.3).
        generator: seeded generator of the random, advantage-only, matched-ratio random and
            budget-stratified pruners.
        response_lengths: int64 [N] response tokens (the trainer's count, :func:`select_step`);
            None: the responses' own lengths (``L_i``, or the sketch's recorded lengths).
    """
    lengths = _lengths(responses) if response_lengths is None else response_lengths
    return _select(cfg, advantages, group_ids, responses, lengths, multiple=multiple, generator=generator)[0]


@dataclass(frozen=True)
class StepSelection:
    """:func:`select_step`'s choice on the global batch of N rollouts.

    Attributes:
        result: the :class:`~fastrl.algorithms.pruning.PruneResult` on the whole batch.
        kl_weights: float32 [N] KL-loss weights (``pruning.zero_adv_kl='sample'``), or None.
        clusters: int64 [N] near-duplicate representative row of each row (budget_stratified with
            ``pruning.dedup_threshold``), or None.
        metrics: ``prune/uniform_*``, ``prune/duplicate_*`` and ``prune/budget_excess`` (budget_stratified:
            rollouts or tokens kept past the budget to keep one per informative bucket) of the step.
    """

    result: P.PruneResult
    kl_weights: torch.Tensor | None = None
    clusters: np.ndarray | None = None
    metrics: dict[str, float] | None = None


def _rows(responses: Sequence[torch.Tensor] | ResponseSketch, rows: np.ndarray):
    if isinstance(responses, ResponseSketch):
        return ResponseSketch(responses.signatures[rows], responses.lengths[rows], responses.ngram, responses.seed)
    return [responses[int(i)] for i in rows]


def select_step(
    cfg: PruningConfig,
    advantages: torch.Tensor,
    group_ids: torch.Tensor,
    responses: Sequence[torch.Tensor] | ResponseSketch,
    *,
    response_lengths: torch.Tensor,
    multiple: int,
    generator: torch.Generator,
) -> StepSelection:
    """:func:`select_rollouts`, with ``pruning.drop_uniform_groups``: the uniform groups are
    removed first, the selector runs on the other groups, and
    :func:`~fastrl.algorithms.zero_advantage.merge_uniform_drop` adds the KL sample and refills on
    the whole batch. Arguments as :func:`select_rollouts`; ``response_lengths`` (int64 [N], the
    trainer's one count of the response tokens) is required.
    """
    lengths = response_lengths
    if not cfg.drop_uniform_groups:
        result, clusters, m = _select(cfg, advantages, group_ids, responses, lengths, multiple=multiple, generator=generator)
        return StepSelection(result, None, clusters, m)
    n = int(advantages.shape[0])
    uniform = zero_advantage_groups(advantages, group_ids)
    mixed = np.nonzero(~uniform)[0]
    mixed_keep = np.zeros(n, dtype=bool)
    clusters, buckets, m = None, 0, {}
    if mixed.size:
        idx = torch.from_numpy(mixed)
        sub, sub_clusters, m = _select(
            cfg, advantages[idx], group_ids[idx], _rows(responses, mixed), lengths[idx], multiple=1, generator=generator
        )
        mixed_keep[mixed] = sub.keep.numpy()
        buckets = sub.num_buckets
        if sub_clusters is not None:
            clusters = np.arange(n)
            clusters[mixed] = mixed[sub_clusters]
    result, kl_weights = merge_uniform_drop(
        advantages, group_ids, mixed_keep, kl=cfg.zero_adv_kl, generator=generator,
        num_samples=cfg.zero_adv_kl_samples, num_buckets=buckets, multiple=multiple, refill=cfg.refill,
        allow_padding=cfg.allow_padding, response_lengths=lengths,
    )
    uni = torch.from_numpy(uniform)
    kept_uniform = result.keep & uni
    m.update({
        "prune/uniform_groups": float(torch.unique(group_ids[uni]).numel()),
        "prune/uniform_rollouts": float(uni.sum()),
        "prune/uniform_tokens": float(lengths[uni].sum()),
        "prune/uniform_dropped": float((uni & ~result.keep).sum()),
        "prune/uniform_kept": float(kept_uniform.sum()),
    })
    if kl_weights is not None:
        m["prune/kl_sample_weight"] = float(kl_weights[kept_uniform].max()) if kept_uniform.any() else 0.0
    return StepSelection(result, kl_weights, clusters, m)


def _lengths(responses: Sequence[torch.Tensor] | ResponseSketch) -> torch.Tensor:
    """int64 [N]: the responses' own lengths (only for :func:`select_rollouts` without lengths)."""
    if isinstance(responses, ResponseSketch):
        return torch.as_tensor(responses.to_tensors()[1], dtype=torch.long)
    return torch.tensor([int(r.numel()) for r in responses], dtype=torch.long)


def _select(
    cfg: PruningConfig,
    advantages: torch.Tensor,
    group_ids: torch.Tensor,
    responses: Sequence[torch.Tensor] | ResponseSketch,
    lengths: torch.Tensor,
    *,
    multiple: int,
    generator: torch.Generator,
) -> tuple[P.PruneResult, np.ndarray | None, dict[str, float]]:
    """``cfg.method`` on the batch (``lengths``: int64 [N] response tokens): the result, the
    near-duplicate clusters (budget_stratified) and their counts."""
    common = dict(multiple=multiple, refill=cfg.refill, allow_padding=cfg.allow_padding)
    if cfg.method in ("none", "greso"):  # greso skips prompts before generation; trains on every rollout
        return keep_all(group_ids, lengths), None, {}
    if cfg.method == "budget_stratified":
        return _budget(cfg, advantages, group_ids, responses, lengths, generator, common)
    if cfg.method in MDAP_METHODS:
        if cfg.similarity_mode == "minhash" and not isinstance(responses, ResponseSketch):
            responses = minhash_sketch(responses, num_bins=cfg.minhash_num_perm, ngram=cfg.ngram)
        result = P.mdap_select(
            advantages, group_ids, responses, similarity_threshold=cfg.similarity_threshold,
            semantics=cfg.semantics, ngram=cfg.ngram, adv_tolerance=cfg.adv_tolerance, **common,
        )
        if cfg.method.startswith("matched_"):  # MDAP's count per group, another choice of rollouts
            result = P.matched_select(
                advantages, group_ids, result.phase1_keep, rule=cfg.method.removeprefix("matched_"),
                generator=generator, response_lengths=lengths, **common,
            )
    elif cfg.method == "cppo":
        result = P.cppo_select(advantages, group_ids, keep_ratio=cfg.keep_ratio, response_lengths=lengths, **common)
    elif cfg.method == "random":
        result = P.random_select(
            advantages, group_ids, generator=generator, keep_ratio=cfg.keep_ratio, response_lengths=lengths, **common
        )
    elif cfg.method == "pods":
        result = P.pods_select(advantages, group_ids, keep_ratio=cfg.keep_ratio, response_lengths=lengths, **common)
    elif cfg.method == "zero_adv_skip":
        result = P.zero_advantage_select(advantages, group_ids, response_lengths=lengths, **common)
    elif cfg.method == "advantage_only":
        result = P.advantage_only_select(
            advantages, group_ids, generator=generator, semantics=cfg.semantics, adv_tolerance=cfg.adv_tolerance,
            response_lengths=lengths, **common,
        )
    else:  # guarded by the config's Literal
        raise ValueError(f"unknown pruning.method {cfg.method!r}")
    return result, None, {}


def _budget(cfg, advantages, group_ids, responses, lengths, generator, common):
    """budget_stratified: near-duplicate clusters (``pruning.dedup_threshold``), then the budget."""
    if isinstance(responses, ResponseSketch):  # guarded by PruningConfig
        raise ValueError("pruning.method=budget_stratified needs the response token ids (similarity_mode=exact)")
    buckets = dict(semantics=cfg.semantics, adv_tolerance=cfg.adv_tolerance)
    clusters, candidates, m = None, None, {}
    if cfg.dedup_threshold is not None:
        clusters = near_duplicate_clusters(
            advantages, group_ids, responses, ngram=cfg.dedup_ngram, threshold=cfg.dedup_threshold, **buckets
        )
        candidates = clusters == np.arange(clusters.shape[0])
        sizes = np.bincount(clusters, minlength=clusters.shape[0])
        m = {"prune/duplicate_rows": float((~candidates).sum()), "prune/duplicate_clusters": float((sizes > 1).sum())}
    result = budget_stratified_select(
        advantages, group_ids, generator=generator, budget_fraction=cfg.budget_fraction,
        budget_unit=cfg.budget_unit, min_per_bucket=cfg.min_per_bucket, candidates=candidates,
        response_lengths=lengths, **buckets, **common,
    )
    n = int(advantages.shape[0])
    if cfg.budget_unit == "rollouts":
        m["prune/budget_excess"] = float(max(0, int(result.phase1_keep.sum()) - max(1, int(cfg.budget_fraction * n))))
    else:
        budget = int(cfg.budget_fraction * int(lengths.sum()))
        m["prune/budget_excess"] = float(max(0, int(lengths[result.phase1_keep].sum()) - budget))
    return result, clusters, m
