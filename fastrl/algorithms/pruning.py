"""Rollout pruning: the result type, Jaccard similarity and MDAP (FastRL); Phase 2 refill.

Spec section 2. All pruners (MDAP here, the baselines CPPO / random / advantage-only in
:mod:`fastrl.algorithms.baseline_pruners`) take one scalar advantage per rollout, computed on the
full batch (advantages are never recomputed after pruning), and the group id of each rollout; they
return a :class:`PruneResult` whose ``keep`` mask is in input row order. Results depend on the
inputs only: no global random state (the random pruners take an explicit ``torch.Generator``), and
ties are broken by batch order.

MDAP, Maximizing Differential Advantage Pruning (FastRL paper, section 3.2):

- Phase 1. Within a group, rollouts are bucketed by advantage (``semantics="reference"``: the value
  rounded to 4 decimals; ``"paper"``: single-link clusters of values closer than
  ``adv_tolerance``). Inside a bucket, near-copies are dropped by token-set Jaccard similarity
  ``J(x, y) = |S(x) ∩ S(y)| / |S(x) ∪ S(y)|`` over n-gram sets:
  "reference" keeps the seed (largest ``|a|``) and every member with ``J(member, seed) <
  similarity_threshold``; "paper" visits members by decreasing ``|a|`` and keeps one iff
  ``J(member, k) <= similarity_threshold`` for every member ``k`` already kept.
- Phase 2. The kept count ``K`` is raised to the next multiple of ``multiple`` with pruned rollouts,
  round robin over groups in ascending id order by decreasing ``|a|`` ("round_robin", the
  reference), or by decreasing ``|a|`` over the whole batch ("global_abs_adv"). The baselines
  share this phase and the result assembly (:func:`finish_pruner`).

Similarities are exact by default (see :mod:`fastrl.algorithms.token_sets`; identical decisions to
a Python-set implementation); passing a :class:`~fastrl.algorithms.minhash.ResponseSketch` instead
of the token sequences uses the MinHash estimate.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fastrl.algorithms._checks import check_positive_int
from fastrl.algorithms._prune_batch import (
    Batch,
    PrunerCall,
    Refill,
    Semantics,
    advantage_buckets,
    rank_by_abs_desc,
    start_pruner,
)
from fastrl.algorithms.minhash import ResponseSketch, estimate_jaccard
from fastrl.algorithms.token_sets import flatten_responses, group_intersections, ngram_items

__all__ = ["PruneResult", "jaccard", "mdap_select", "refill_need"]


@dataclass(frozen=True)
class PruneResult:
    """Outcome of a pruner on one global batch of N rollouts.

    Attributes:
        keep: bool [N], final keep mask (Phase 1 + Phase 2), input row order.
        phase1_keep: bool [N], kept by Phase 1 (the selection rule itself).
        kept_per_group: group id -> final kept count, ascending group id.
        f1: mean of ``kept_per_group`` values (spec 2.4). f2: their maximum.
        num_buckets: advantage buckets over all groups (0 for pruners that do not bucket).
        num_refilled: rollouts added back by Phase 2.
        num_padding: rows the caller must add (e.g. zero-weight copies) to reach a multiple of
            ``multiple``; non-zero only with ``allow_padding=True`` when too few rollouts were pruned.
        zero_advantage_kept: kept rollouts whose advantage is exactly 0.
        kept_tokens, total_tokens: response tokens kept / in the batch (None when unknown).
        time_s: wall time spent in the pruner, seconds.
    """

    keep: torch.Tensor
    phase1_keep: torch.Tensor
    kept_per_group: dict[int, int]
    f1: float
    f2: int
    num_buckets: int
    num_refilled: int
    num_padding: int
    zero_advantage_kept: int
    kept_tokens: int | None
    total_tokens: int | None
    time_s: float = field(compare=False)

    def __eq__(self, other: object) -> bool:
        """Same selection and statistics (the timing is ignored)."""
        if not isinstance(other, PruneResult):
            return NotImplemented
        return (
            torch.equal(self.keep, other.keep)
            and torch.equal(self.phase1_keep, other.phase1_keep)
            and all(
                getattr(self, f) == getattr(other, f)
                for f in (
                    "kept_per_group",
                    "f1",
                    "f2",
                    "num_buckets",
                    "num_refilled",
                    "num_padding",
                    "zero_advantage_kept",
                    "kept_tokens",
                    "total_tokens",
                )
            )
        )

    __hash__ = None  # holds tensors

    @property
    def num_rollouts(self) -> int:
        return int(self.keep.shape[0])

    @property
    def num_kept(self) -> int:
        return int(self.keep.sum())

    @property
    def kept_fraction(self) -> float:
        return self.num_kept / max(self.num_rollouts, 1)

    @property
    def kept_token_fraction(self) -> float | None:
        if self.kept_tokens is None or self.total_tokens is None:
            return None
        return self.kept_tokens / max(self.total_tokens, 1)

    @property
    def indices(self) -> torch.Tensor:
        """int64 [K], kept rows in ascending order."""
        return torch.nonzero(self.keep).reshape(-1)

    def metrics(self, prefix: str = "prune/") -> dict[str, float]:
        """Scalar statistics for logging (spec section 2.4)."""
        out = {
            "num_rollouts": float(self.num_rollouts),
            "num_kept": float(self.num_kept),
            "kept_fraction": self.kept_fraction,
            "phase1_kept": float(self.phase1_keep.sum()),
            "num_refilled": float(self.num_refilled),
            "num_padding": float(self.num_padding),
            "num_buckets": float(self.num_buckets),
            "zero_advantage_kept": float(self.zero_advantage_kept),
            "f1": float(self.f1),
            "f2": float(self.f2),
            "time_s": float(self.time_s),
        }
        if self.kept_tokens is not None:
            out["kept_tokens"] = float(self.kept_tokens)
            out["total_tokens"] = float(self.total_tokens)
            out["kept_token_fraction"] = float(self.kept_token_fraction)
        return {prefix + k: v for k, v in out.items()}


# ----------------------------------------------------------------------------------------------
# Jaccard on one pair (the definition; the batch path is in token_sets / minhash)
# ----------------------------------------------------------------------------------------------


def _ngram_set(x: Any, ngram: int) -> set:
    seq = x.tolist() if isinstance(x, (torch.Tensor, np.ndarray)) else list(x)
    if ngram == 1:
        return set(seq)
    return {tuple(seq[p : p + ngram]) for p in range(len(seq) - ngram + 1)}


def jaccard(a: Any, b: Any, ngram: int = 1) -> float:
    """Jaccard index of the token-id n-gram sets of two sequences: ``|A ∩ B| / |A ∪ B|``.

    Two empty sets give 1.0 (spec 2.2). Examples: {1,2,3,4} vs {3,4,5,6} -> 2/6; [1,1,2] vs [2,2,1] -> 1.0.

    Args:
        a, b: 1-D int tensors, arrays or sequences of token ids.
        ngram: n-gram size >= 1 (a sequence shorter than ``ngram`` has the empty set).
    """
    if not (isinstance(ngram, int) and ngram >= 1):
        raise ValueError(f"`ngram` must be an integer >= 1, got {ngram!r}")
    for name, x in (("a", a), ("b", b)):
        if isinstance(x, (torch.Tensor, np.ndarray)) and x.ndim != 1:
            raise ValueError(f"`{name}` must be one-dimensional, got shape {tuple(x.shape)}")
    sa, sb = _ngram_set(a, ngram), _ngram_set(b, ngram)
    union = len(sa | sb)
    return len(sa & sb) / union if union > 0 else 1.0


# ----------------------------------------------------------------------------------------------
# Phase 1 (MDAP)
# ----------------------------------------------------------------------------------------------

SimilarityFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _exact_similarity(
    b: Batch, responses: Sequence[Any], ngram: int, backend: str = "auto"
) -> tuple[SimilarityFn, np.ndarray]:
    flat, lengths = flatten_responses(responses, order=b.order)
    if lengths.shape[0] != b.n:
        raise ValueError(f"`responses` has {lengths.shape[0]} rows but `advantages` has {b.n}; they must match")
    items, counts_ordered = ngram_items(flat, lengths[b.order], ngram)
    inter = group_intersections(items, counts_ordered, b.group_sizes, backend=backend)
    sizes = np.empty(b.n, dtype=np.int64)
    sizes[b.order] = inter[b.gidx[b.order], b.local[b.order], b.local[b.order]]

    def sim(rows_a: np.ndarray, rows_b: np.ndarray) -> np.ndarray:
        i = inter[b.gidx[rows_a], b.local[rows_a], b.local[rows_b]]
        union = sizes[rows_a] + sizes[rows_b] - i
        with np.errstate(divide="ignore", invalid="ignore"):
            j = i.astype(np.float64) / union.astype(np.float64)
        return np.where(union > 0, j, 1.0)

    return sim, lengths


def _sketch_similarity(b: Batch, sketch: ResponseSketch, ngram: int) -> tuple[SimilarityFn, np.ndarray]:
    if len(sketch) != b.n:
        raise ValueError(f"the response sketch has {len(sketch)} rows but `advantages` has {b.n}; they must match")
    if sketch.ngram != ngram:
        raise ValueError(f"the response sketch was built with ngram={sketch.ngram} but mdap_select got ngram={ngram}")
    sig = sketch.signatures

    def sim(rows_a: np.ndarray, rows_b: np.ndarray) -> np.ndarray:
        return estimate_jaccard(sig[rows_a], sig[rows_b])

    return sim, sketch.lengths


def _phase1_reference(b: Batch, bid: np.ndarray, sim: SimilarityFn, threshold: float) -> np.ndarray:
    srt, rank = rank_by_abs_desc(b, bid)
    seed_of_bucket = srt[rank == 0]  # bucket ids are dense and sorted, so index = bucket id
    seed = seed_of_bucket[bid]
    keep = seed == np.arange(b.n)
    others = np.nonzero(~keep)[0]
    if others.size:
        keep[others] = sim(others, seed[others]) < threshold
    return keep


def _phase1_paper(b: Batch, bid: np.ndarray, num_buckets: int, sim: SimilarityFn, threshold: float) -> np.ndarray:
    srt, rank = rank_by_abs_desc(b, bid)
    depth = int(rank.max()) + 1
    members = np.full((num_buckets, depth), -1, dtype=np.int64)
    members[bid[srt], rank] = srt
    kept = np.zeros((num_buckets, depth), dtype=bool)
    kept[:, 0] = True  # every bucket has a first member
    for r in range(1, depth):
        active = np.nonzero(members[:, r] >= 0)[0]
        if active.size == 0:
            continue
        cand = members[active, r]
        prev = members[active, :r]  # all valid: ranks below r exist in these buckets
        prev_kept = kept[active, :r]
        j = sim(np.repeat(cand, r), prev.reshape(-1)).reshape(active.size, r)
        ok = np.all(~prev_kept | (j <= threshold), axis=1)
        kept[active, r] = ok
    keep = np.zeros(b.n, dtype=bool)
    keep[members[kept]] = True
    return keep


# ----------------------------------------------------------------------------------------------
# Phase 2 (refill) and result assembly
# ----------------------------------------------------------------------------------------------


def refill_need(kept: int, multiple: int) -> int:
    """Rollouts to add so that ``kept`` becomes a multiple of ``multiple``: ``(multiple - kept % multiple) % multiple``.

    Example: 600 kept, multiple 128 -> 40 (640 kept).
    """
    multiple = check_positive_int(multiple, "multiple")
    if kept < 0:
        raise ValueError(f"`kept` must be >= 0, got {kept}")
    return (multiple - kept % multiple) % multiple


def _phase2_refill(
    b: Batch, phase1: np.ndarray, multiple: int, refill: str, allow_padding: bool, pruner: str
) -> tuple[np.ndarray, int, int]:
    """Phase 2: add pruned rollouts until the kept count is a multiple of ``multiple``.

    Args:
        phase1: bool [N], Phase 1 keep mask. refill: "round_robin" or "global_abs_adv" (module
        docstring). pruner: name used in the error message.

    Returns:
        ``(keep, num_refilled, num_padding)``: bool [N] final mask; ``num_padding`` > 0 only with
        ``allow_padding`` when too few rollouts were pruned (then everything is kept).

    Raises:
        ValueError: too few pruned rollouts to reach a multiple and ``allow_padding`` is False.
    """
    keep = phase1.copy()
    k = int(phase1.sum())
    need = refill_need(k, multiple)
    if need == 0:
        return keep, 0, 0
    pruned = np.nonzero(~phase1)[0]
    if pruned.size < need:
        if not allow_padding:
            raise ValueError(
                f"{pruner}: Phase 1 kept K={k} of {b.n} rollouts; reaching a multiple of multiple={multiple} "
                f"needs {need} more but only {pruned.size} were pruned. Use a `multiple` that divides the "
                f"batch ({b.n} rollouts), lower it, or allow padding (the caller then adds zero-weight rows)."
            )
        keep[:] = True
        return keep, int(pruned.size), refill_need(b.n, multiple)
    if refill == "round_robin":
        srt, rank = rank_by_abs_desc(b, b.gidx, pruned)
        take = srt[np.lexsort((b.gidx[srt], rank))][:need]
    else:
        take = pruned[np.lexsort((pruned, -b.abs_adv[pruned]))][:need]
    keep[take] = True
    return keep, need, 0


def _assemble_result(
    b: Batch,
    phase1: np.ndarray,
    keep: np.ndarray,
    num_buckets: int,
    refilled: int,
    padding: int,
    lengths: np.ndarray | None,
    t0: float,
) -> PruneResult:
    """The :class:`PruneResult` of masks ``phase1`` / ``keep`` (bool [N]); ``t0``: the pruner's start time."""
    counts = np.bincount(b.gidx[keep], minlength=b.uniq_groups.shape[0])
    kept_per_group = {int(g): int(c) for g, c in zip(b.uniq_groups.tolist(), counts.tolist())}
    kept_tokens = total_tokens = None
    if lengths is not None:
        kept_tokens = int(lengths[keep].sum())
        total_tokens = int(lengths.sum())
    return PruneResult(
        keep=torch.from_numpy(keep.copy()),
        phase1_keep=torch.from_numpy(phase1.copy()),
        kept_per_group=kept_per_group,
        f1=float(counts.mean()),
        f2=int(counts.max()),
        num_buckets=num_buckets,
        num_refilled=refilled,
        num_padding=padding,
        zero_advantage_kept=int(np.count_nonzero(keep & (b.adv == 0))),
        kept_tokens=kept_tokens,
        total_tokens=total_tokens,
        time_s=time.perf_counter() - t0,
    )


def finish_pruner(call: PrunerCall, phase1: np.ndarray, *, num_buckets: int, pruner: str) -> PruneResult:
    """The last step of every public pruner: Phase 2 refill of the Phase 1 mask, then the result.

    Args:
        call: from :func:`~fastrl.algorithms._prune_batch.start_pruner`.
        phase1: bool [N], the pruner's Phase 1 keep mask.
        num_buckets: advantage buckets (0 for pruners that do not bucket).
        pruner: name for error messages.
    """
    b = call.batch
    keep, refilled, padding = _phase2_refill(b, phase1, call.multiple, call.refill, call.allow_padding, pruner)
    return _assemble_result(b, phase1, keep, num_buckets, refilled, padding, call.lengths, call.t0)


# ----------------------------------------------------------------------------------------------
# MDAP
# ----------------------------------------------------------------------------------------------


def mdap_select(
    advantages: Any,
    group_ids: Any,
    responses: Sequence[Any] | ResponseSketch,
    *,
    similarity_threshold: float = 0.2,
    semantics: Semantics = "reference",
    ngram: int = 1,
    adv_tolerance: float = 1e-4,
    multiple: int = 1,
    refill: Refill = "round_robin",
    allow_padding: bool = False,
) -> PruneResult:
    """Maximizing Differential Advantage Pruning (FastRL, spec section 2).

    Args:
        advantages: float [N] tensor/array, one scalar per rollout (for per-token advantages, their
            masked mean: :func:`fastrl.algorithms.advantages.token_to_sequence_advantages`),
            computed on the full batch.
        group_ids: int [N], one id per prompt.
        responses: N 1-D int tensors (response token ids, unpadded, EOS included) for exact
            similarities, or a :class:`~fastrl.algorithms.minhash.ResponseSketch` of them for the
            approximate mode.
        similarity_threshold: Jaccard threshold (0.2 = the paper's tau 0.8). "reference" keeps a
            member iff ``J < threshold`` (vs the seed), "paper" iff ``J <= threshold`` (vs every kept member).
        semantics: "reference" (the released code, default) or "paper".
        ngram: n-gram size of the token sets.
        adv_tolerance: "paper" bucketing tolerance (ignored by "reference", which rounds to 4 decimals).
        multiple: the final kept count is raised to a multiple of this (Phase 2).
        refill: "round_robin" (reference) or "global_abs_adv".
        allow_padding: when too few rollouts were pruned to reach a multiple, keep everything and
            report the rows still missing in ``num_padding`` instead of raising.

    Returns:
        :class:`PruneResult`.

    Raises:
        ValueError: empty batch, mismatched lengths, non-finite advantages, bad options,
            ``multiple`` larger than the batch, or Phase 2 cannot reach a multiple (without
            ``allow_padding``). TypeError: non-integer group ids or token ids.
    """
    ngram = check_positive_int(ngram, "ngram")
    if not (0.0 <= float(similarity_threshold) <= 1.0):
        raise ValueError(f"`similarity_threshold` must be in [0, 1], got {similarity_threshold}")
    if not float(adv_tolerance) >= 0.0:
        raise ValueError(f"`adv_tolerance` must be >= 0, got {adv_tolerance}")
    call = start_pruner(
        advantages, group_ids, multiple=multiple, refill=refill, allow_padding=allow_padding, semantics=semantics
    )
    b = call.batch
    if isinstance(responses, ResponseSketch):
        sim, lengths = _sketch_similarity(b, responses, ngram)
    elif isinstance(responses, (torch.Tensor, np.ndarray)) and responses.ndim != 1:
        raise ValueError(
            f"`responses` is a {responses.ndim}-D array of shape {tuple(responses.shape)}; pass a list of "
            "unpadded 1-D token-id tensors (e.g. [r[:n] for r, n in zip(responses, lengths)]): padding "
            "tokens would otherwise count as response tokens"
        )
    else:
        if len(responses) != b.n:
            raise ValueError(f"`responses` has {len(responses)} rows but `advantages` has {b.n}; they must match")
        sim, lengths = _exact_similarity(b, responses, ngram)
    bid, num_buckets = advantage_buckets(b, semantics, float(adv_tolerance))
    threshold = float(similarity_threshold)
    if semantics == "reference":
        phase1 = _phase1_reference(b, bid, sim, threshold)
    else:
        phase1 = _phase1_paper(b, bid, num_buckets, sim, threshold)
    return finish_pruner(dataclasses.replace(call, lengths=lengths), phase1, num_buckets=num_buckets, pruner="MDAP")
