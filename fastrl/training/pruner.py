"""Pruning dispatch: the configured pruner (MDAP or a baseline) on one global batch.

Pure selection functions live in :mod:`fastrl.algorithms.pruning`; this maps a
:class:`fastrl.config.PruningConfig` onto them. ``method="none"`` keeps every rollout (a
``PruneResult`` with full keep masks, so the statistics and the adaptive sampler see the same
shape of data whatever the method).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from fastrl.algorithms import pruning as P
from fastrl.config import PruningConfig


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
    responses: "Sequence[torch.Tensor] | ResponseSketch",
    *,
    multiple: int,
    generator: torch.Generator,
) -> P.PruneResult:
    """Run ``cfg.method`` on the global batch.

    Args:
        advantages: float [N]; group_ids: int64 [N]; responses: N int64 [L_i] token-id tensors,
            or their MinHash sketch (``similarity_mode="minhash"``; what DP ranks exchange).
        multiple: the kept count is refilled to a multiple of this (spec 2.3).
        generator: seeded generator of the random and advantage-only pruners.
    """
    from fastrl.algorithms.minhash import ResponseSketch, minhash_sketch

    if isinstance(responses, ResponseSketch):
        lengths = torch.as_tensor(responses.to_tensors()[1], dtype=torch.long)
    else:
        lengths = torch.tensor([int(r.numel()) for r in responses], dtype=torch.long)
    common = dict(multiple=multiple, refill=cfg.refill, allow_padding=cfg.allow_padding)
    if cfg.method == "none":
        return keep_all(group_ids, lengths)
    if cfg.method == "fastrl":
        if cfg.similarity_mode == "minhash" and not isinstance(responses, ResponseSketch):
            responses = minhash_sketch(responses, num_bins=cfg.minhash_num_perm, ngram=cfg.ngram)
        result = P.mdap_select(
            advantages, group_ids, responses, similarity_threshold=cfg.similarity_threshold,
            semantics=cfg.semantics, ngram=cfg.ngram, adv_tolerance=cfg.adv_tolerance, **common,
        )
    elif cfg.method == "cppo":
        result = P.cppo_select(advantages, group_ids, keep_ratio=cfg.keep_ratio, response_lengths=lengths, **common)
    elif cfg.method == "random":
        result = P.random_select(
            advantages, group_ids, generator=generator, keep_ratio=cfg.keep_ratio, response_lengths=lengths, **common
        )
    elif cfg.method == "advantage_only":
        result = P.advantage_only_select(
            advantages, group_ids, generator=generator, semantics=cfg.semantics, adv_tolerance=cfg.adv_tolerance,
            response_lengths=lengths, **common,
        )
    else:  # guarded by the config's Literal
        raise ValueError(f"unknown pruning.method {cfg.method!r}")
    return result


def trim_to_multiple(
    result: P.PruneResult, advantages: torch.Tensor, group_ids: torch.Tensor, multiple: int
) -> tuple[P.PruneResult, int]:
    """Drop the kept rollouts with the smallest ``|a|`` (latest first on ties) until the kept
    count is a multiple of ``multiple`` (whole micro-batches on every DP rank).

    Only needed when nothing could be refilled (no pruning, or a batch shorter than the update
    geometry after DAPO filtering). Returns the new result and the number dropped.

    Raises:
        ValueError: fewer kept rollouts than ``multiple``.
    """
    kept = result.num_kept
    excess = kept % multiple
    if excess == 0:
        return result, 0
    if kept < multiple:
        raise ValueError(
            f"only {kept} rollouts are left for the update, fewer than dp_size x micro_batch_size = {multiple}; "
            f"raise rollout.prompts_per_step or algorithm.max_dynamic_sampling_rounds"
        )
    idx = result.indices
    order = sorted(idx.tolist(), key=lambda i: (abs(float(advantages[i])), -i))
    keep = result.keep.clone()
    keep[torch.tensor(order[:excess])] = False
    ids, counts = torch.unique(group_ids[keep], return_counts=True)
    per_group = {int(g): 0 for g in result.kept_per_group}
    per_group.update({int(g): int(c) for g, c in zip(ids, counts)})
    values = list(per_group.values())
    return (
        dataclasses.replace(
            result, keep=keep, kept_per_group=per_group,
            f1=sum(values) / max(len(values), 1), f2=max(values, default=0),
        ),
        excess,
    )


def mini_batch_sizes(rows: int, mini: int, micro: int) -> list[int]:
    """Sizes of the policy-update mini-batches of ``rows`` rollouts on one rank.

    About ``rows / mini`` mini-batches (at least one), as equal as possible, each a whole number of
    micro-batches of ``micro`` rollouts: exactly ``mini`` each when ``rows`` is a multiple of
    ``mini`` and ``mini`` a multiple of ``micro`` (the usual case; the adaptive sampler's odd group
    sizes and DAPO's short batches give the others).

    Raises:
        ValueError: ``rows`` is not a multiple of ``micro``.
    """
    if rows % micro:
        raise ValueError(f"{rows} rollouts cannot be split into micro-batches of {micro}")
    units = rows // micro
    count = max(1, min(units, round(rows / mini)))
    base, extra = divmod(units, count)
    return [(base + (1 if i < extra else 0)) * micro for i in range(count)]
