"""Pruning dispatch: the configured pruner (MDAP or a baseline) on one global batch.

Pure selection functions live in :mod:`fastrl.algorithms.pruning`; this maps a
:class:`fastrl.config.PruningConfig` onto them. ``method="none"`` keeps every rollout (a
``PruneResult`` with full keep masks, so the statistics and the adaptive sampler see the same
shape of data whatever the method).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import fastrl.algorithms as P
from fastrl.algorithms.minhash import ResponseSketch, minhash_sketch
from fastrl.config import PruningConfig

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
) -> P.PruneResult:
    """Run ``cfg.method`` on the global batch.

    Args:
        advantages: float [N]; group_ids: int64 [N]; responses: N int64 [L_i] token-id tensors,
            or their MinHash sketch (``similarity_mode="minhash"``; what DP ranks exchange).
        multiple: the kept count is refilled to a multiple of this (spec 2.3).
        generator: seeded generator of the random, advantage-only and matched-ratio random pruners.
    """
    if isinstance(responses, ResponseSketch):
        lengths = torch.as_tensor(responses.to_tensors()[1], dtype=torch.long)
    else:
        lengths = torch.tensor([int(r.numel()) for r in responses], dtype=torch.long)
    common = dict(multiple=multiple, refill=cfg.refill, allow_padding=cfg.allow_padding)
    if cfg.method in ("none", "greso"):  # greso skips prompts before generation; trains on every rollout
        return keep_all(group_ids, lengths)
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
    return result
