"""Shared input handling of the rollout pruners (:mod:`fastrl.algorithms.pruning`,
:mod:`fastrl.algorithms.baseline_pruners`, :mod:`fastrl.algorithms.prune_weights`).

- :func:`start_pruner`: the preamble every public pruner runs (option checks, batch preparation,
  the ``multiple`` and ``response_lengths`` checks, the clock), returning a :class:`PrunerCall`.
- :class:`Batch`: one global batch of N rollouts as numpy arrays, with its group structure.
- :func:`advantage_buckets`: MDAP's advantage buckets (spec 2.1); :func:`rank_by_abs_desc`: rows
  ordered by ``|a|`` within a segment (group or bucket), ties by batch order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from fastrl.algorithms._checks import check_choice, check_positive_int

Semantics = Literal["reference", "paper"]
Refill = Literal["round_robin", "global_abs_adv"]
SEMANTICS = ("reference", "paper")
REFILLS = ("round_robin", "global_abs_adv")

# ----------------------------------------------------------------------------------------------
# Input handling
# ----------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """One global batch of N rollouts over G groups (numpy arrays; built by :func:`prepare_batch`)."""

    adv: np.ndarray  # [N] float32/float64, the caller's values
    abs_adv: np.ndarray  # [N], same dtype
    group_ids: np.ndarray  # [N] int64
    uniq_groups: np.ndarray  # [G] ascending
    gidx: np.ndarray  # [N] group index (rank of the group id)
    local: np.ndarray  # [N] position of the row within its group, batch order
    group_sizes: np.ndarray  # [G]
    order: np.ndarray  # [N] rows sorted by (group, batch order)

    @property
    def n(self) -> int:
        return int(self.adv.shape[0])


def to_numpy(x: Any) -> np.ndarray:
    """``x`` (tensor, array or sequence) as a numpy array (no copy for CPU tensors and arrays)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def prepare_batch(advantages: Any, group_ids: Any) -> Batch:
    """Validate ``advantages`` (real [N], finite) and ``group_ids`` (int [N]) and index the groups.

    Raises:
        ValueError: empty batch, wrong shapes, mismatched lengths, non-finite advantages.
        TypeError: non-real advantages or non-integer group ids.
    """
    adv = to_numpy(advantages)
    gid = to_numpy(group_ids)
    if adv.ndim != 1:
        raise ValueError(
            f"`advantages` must be one scalar per rollout, shape [N]; got {adv.shape} (for per-token "
            "advantages pass fastrl.algorithms.advantages.token_to_sequence_advantages(adv, response_mask))"
        )
    if gid.ndim != 1:
        raise ValueError(f"`group_ids` must have shape [N], got {gid.shape}")
    if adv.shape[0] == 0:
        raise ValueError("`advantages` is empty: a batch needs at least one rollout")
    if gid.shape[0] != adv.shape[0]:
        raise ValueError(f"`group_ids` has {gid.shape[0]} rows but `advantages` has {adv.shape[0]}; they must match")
    if adv.dtype.kind not in "fiu":
        raise TypeError(f"`advantages` must be real numbers, got dtype {adv.dtype}")
    if adv.dtype.kind != "f":
        adv = adv.astype(np.float64)
    if gid.dtype.kind not in "iu":
        raise TypeError(f"`group_ids` must be integers, got dtype {gid.dtype}")
    bad = ~np.isfinite(adv)
    if bad.any():
        row = int(np.nonzero(bad)[0][0])
        raise ValueError(
            f"`advantages[{row}]` is {adv[row]}: advantages must be finite (check the rewards of group {int(gid[row])})"
        )
    gid = gid.astype(np.int64)
    uniq, gidx = np.unique(gid, return_inverse=True)
    gidx = gidx.reshape(-1)
    sizes = np.bincount(gidx, minlength=uniq.shape[0]).astype(np.int64)
    order = np.argsort(gidx, kind="stable")
    starts = np.zeros(uniq.shape[0], dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    local = np.empty(adv.shape[0], dtype=np.int64)
    local[order] = np.arange(adv.shape[0]) - starts[gidx[order]]
    return Batch(adv, np.abs(adv), gid, uniq, gidx, local, sizes, order)


def check_lengths(n: int, lengths: Any, name: str) -> np.ndarray | None:
    """Optional per-rollout lengths as int64 [n] (None stays None); ValueError on a row mismatch."""
    if lengths is None:
        return None
    ln = to_numpy(lengths).astype(np.int64).reshape(-1)
    if ln.shape[0] != n:
        raise ValueError(f"`{name}` has {ln.shape[0]} rows but the batch has {n}")
    return ln


def checked_keep(advantages: Any, group_ids: Any, keep: Any, semantics: str) -> tuple[Batch, np.ndarray]:
    """The batch (:func:`prepare_batch`) and a pruner's keep mask as bool [N], for the weight
    functions.

    Raises:
        ValueError: a bad ``semantics``, a mask of another length, or one that keeps nothing.
    """
    check_choice(semantics, "semantics", SEMANTICS)
    b = prepare_batch(advantages, group_ids)
    kept = to_numpy(keep).astype(bool).reshape(-1)
    if kept.shape[0] != b.n:
        raise ValueError(f"`keep` has {kept.shape[0]} rows but `advantages` has {b.n}; they must match")
    if not kept.any():
        raise ValueError("`keep` keeps no rollout: there is nothing to weight")
    return b, kept


def check_multiple(multiple: Any, n: int, allow_padding: bool) -> int:
    """``multiple`` as an int >= 1, at most the batch size ``n`` unless padding is allowed."""
    multiple = check_positive_int(multiple, "multiple")
    if multiple > n and not allow_padding:
        raise ValueError(
            f"`multiple` ({multiple}) is larger than the batch ({n} rollouts): no kept set can be a multiple "
            "of it. Lower `multiple` (the update geometry) or allow padding."
        )
    return multiple


def check_generator(generator: Any) -> torch.Generator:
    """``generator`` itself; TypeError unless it is a ``torch.Generator``."""
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            "`generator` must be a torch.Generator (seeded by the caller, identical on every rank); "
            f"got {type(generator).__name__}"
        )
    return generator


# ----------------------------------------------------------------------------------------------
# Buckets and orders
# ----------------------------------------------------------------------------------------------


def advantage_buckets(b: Batch, semantics: str, adv_tolerance: float) -> tuple[np.ndarray, int]:
    """Bucket id [N] (dense, sorted by group then value) and the number of buckets."""
    if semantics == "reference":
        key = np.round(b.adv, 4)  # in the caller's dtype, as the reference rounds its float32 values
        srt = np.lexsort((key, b.gidx))
        k = key[srt]
        g = b.gidx[srt]
        new = np.ones(b.n, dtype=bool)
        new[1:] = (g[1:] != g[:-1]) | (k[1:] != k[:-1])
    else:
        v = b.adv.astype(np.float64)
        srt = np.lexsort((v, b.gidx))
        s = v[srt]
        g = b.gidx[srt]
        new = np.ones(b.n, dtype=bool)
        new[1:] = (g[1:] != g[:-1]) | (s[1:] - s[:-1] >= adv_tolerance)
    bid = np.empty(b.n, dtype=np.int64)
    bid[srt] = np.cumsum(new) - 1
    return bid, int(new.sum())


def rank_by_abs_desc(b: Batch, segment: np.ndarray, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sort ``rows`` (default: all) by (segment, |a| descending, batch order).

    Returns ``(sorted_rows, rank_within_segment)`` with the rank aligned to ``sorted_rows``.
    """
    if rows is None:
        rows = np.arange(b.n)
    seg = segment[rows]
    srt = rows[np.lexsort((rows, -b.abs_adv[rows], seg))]
    return srt, rank_in_segments(segment[srt])


def rank_in_segments(seg_sorted: np.ndarray) -> np.ndarray:
    """int64 [M]: position of each row within its run of equal values of ``seg_sorted`` (sorted [M])."""
    first = np.ones(seg_sorted.shape[0], dtype=bool)
    first[1:] = seg_sorted[1:] != seg_sorted[:-1]
    start_idx = np.maximum.accumulate(np.where(first, np.arange(seg_sorted.shape[0]), 0))
    return np.arange(seg_sorted.shape[0]) - start_idx


# ----------------------------------------------------------------------------------------------
# Preamble of the public pruners
# ----------------------------------------------------------------------------------------------

_UNSET: Any = object()  # "this pruner has no such option" (None is a value to refuse)


@dataclass(frozen=True)
class PrunerCall:
    """One call of a public pruner after its preamble: the prepared batch and the Phase 2 options."""

    batch: Batch
    multiple: int  # the kept count is refilled to a multiple of this (checked: 1 <= multiple)
    refill: str  # "round_robin" or "global_abs_adv"
    allow_padding: bool
    lengths: np.ndarray | None  # int64 [N] response lengths for token statistics, or None
    t0: float  # time.perf_counter() when the pruner started


def start_pruner(
    advantages: Any,
    group_ids: Any,
    *,
    multiple: Any,
    refill: str,
    allow_padding: bool,
    response_lengths: Any = None,
    semantics: Any = _UNSET,
    generator: Any = _UNSET,
) -> PrunerCall:
    """The preamble of every public pruner: start the clock, check the options, prepare the batch.

    Checks, in this order: ``semantics`` (when the pruner has it), ``refill``, ``generator`` (when
    the pruner has it), the batch (:func:`prepare_batch`), ``multiple`` (:func:`check_multiple`),
    ``response_lengths`` (:func:`check_lengths`). The pruner ends with
    :func:`fastrl.algorithms.pruning.finish_pruner` on the returned :class:`PrunerCall`.
    """
    t0 = time.perf_counter()
    if semantics is not _UNSET:
        check_choice(semantics, "semantics", SEMANTICS)
    check_choice(refill, "refill", REFILLS)
    if generator is not _UNSET:
        check_generator(generator)
    b = prepare_batch(advantages, group_ids)
    multiple = check_multiple(multiple, b.n, allow_padding)
    lengths = check_lengths(b.n, response_lengths, "response_lengths")
    return PrunerCall(batch=b, multiple=multiple, refill=refill, allow_padding=allow_padding, lengths=lengths, t0=t0)
