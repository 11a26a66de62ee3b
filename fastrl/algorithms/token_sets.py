"""Exact token-set overlaps between the responses of each group, without Python sets.

MDAP compares responses of the same group by the Jaccard index of their token-id n-gram sets
(spec section 2.2). This module computes, for every group, the full matrix of set-intersection
sizes ``|S(x_i) ∩ S(x_j)|``:

1. each n-gram becomes one int64 item (exact packing ``sum_j t_{p+j} * base^(k-1-j)`` when it fits
   in 63 bits, otherwise an exact iterative renumbering of (prefix id, next token) pairs);
2. compiled kernels (numba, :mod:`fastrl.algorithms._token_sets_numba`): one pass over the items
   with a table (or, for large ids, a per-group hash table) of row bitmasks;
3. numpy kernel (used when numba is missing, and as a cross-check in the tests): per group, a
   table indexed by item holds the bitmask of rows containing it (one vectorized
   ``table[items_of_row] |= bit`` per row); each distinct item is visited once (a "claim" pass:
   ``pos[items] = arange``; the positions that read back their own index are the distinct items),
   its bitmask is unpacked into a 0/1 row, and the Gram matrix ``B^T B`` of those rows is the
   intersection matrix (its diagonal holds the set sizes).

Counts are exact integers, so ``inter / (size_i + size_j - inter)`` evaluated in float64 equals the
Python expression ``len(a & b) / len(a | b)`` bit for bit.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

__all__ = ["flatten_responses", "ngram_items", "dense_item_ids", "group_intersections", "numba_available"]

logger = logging.getLogger(__name__)

# Items are used directly as table indices when they are below this bound; larger item values
# (packed n-grams, huge vocabularies) are renumbered first.
_DIRECT_TABLE_LIMIT = 1 << 22


def _as_token_tensor(i: int, r: Any) -> torch.Tensor:
    if not isinstance(r, torch.Tensor):
        arr = np.asarray(r)
        if arr.size == 0:
            arr = arr.astype(np.int64)
        r = torch.from_numpy(np.ascontiguousarray(arr))
    if r.dim() != 1:
        raise ValueError(f"`responses[{i}]` must be a 1-D tensor of token ids, got shape {tuple(r.shape)}")
    if r.dtype.is_floating_point or r.dtype.is_complex or r.dtype == torch.bool:
        raise TypeError(f"`responses[{i}]` must hold integer token ids, got dtype {r.dtype}")
    return r


_INT_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})


def flatten_responses(responses: Sequence[Any], order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate token-id sequences (1-D int tensors, arrays or lists) into one int64 array.

    Args:
        responses: N sequences of token ids (unpadded; EOS included).
        order: optional permutation of ``range(N)``: the concatenation order.

    Returns:
        ``(flat, lengths)``: int64 [sum of lengths] in ``order``, and int64 [N] lengths in input order.

    Raises:
        ValueError / TypeError: a response that is not 1-D or not integer (names its index).
    """
    tensors = list(responses)
    all_tensors = all(isinstance(t, torch.Tensor) for t in tensors)
    if not (all_tensors and {t.dim() for t in tensors} <= {1} and {t.dtype for t in tensors} <= _INT_DTYPES):
        tensors = [_as_token_tensor(i, r) for i, r in enumerate(tensors)]  # converts, or names the bad row
    lengths = np.fromiter((t.shape[0] for t in tensors), dtype=np.int64, count=len(tensors))
    if not tensors:
        return np.zeros(0, dtype=np.int64), lengths
    seq = tensors if order is None else [tensors[i] for i in np.asarray(order).tolist()]
    flat = torch.empty(int(lengths.sum()), dtype=torch.int64)
    torch.cat([t.detach().cpu() if t.device.type != "cpu" else t for t in seq], out=flat)
    return flat.numpy(), lengths


def _segment_offsets(lengths: np.ndarray) -> np.ndarray:
    off = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def ngram_items(flat: np.ndarray, lengths: np.ndarray, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Turn each row's tokens into exact int64 ids of its n-grams (set semantics of ``jaccard``).

    Args:
        flat: int64 [L], rows concatenated; lengths: int64 [R] row lengths (in the same order).
        ngram: n-gram size >= 1.

    Returns:
        ``(items, counts)``: int64 ids (equal ids <=> equal n-grams) and the number of n-grams per
        row, ``max(len - ngram + 1, 0)``.
    """
    if ngram == 1:
        return flat, lengths
    counts = np.maximum(lengths - ngram + 1, 0)
    if flat.size == 0 or counts.sum() == 0:
        return np.zeros(0, dtype=np.int64), counts
    off = _segment_offsets(lengths)
    row_end = np.repeat(off[1:], lengths)
    starts = np.nonzero(np.arange(flat.shape[0]) + ngram <= row_end)[0]
    tokens, _ = dense_item_ids(flat) if flat.min() < 0 else (flat, None)
    base = int(tokens.max()) + 1
    if base**ngram < (1 << 63):
        items = np.zeros(starts.shape[0], dtype=np.int64)
        for j in range(ngram):
            items = items * base + tokens[starts + j]
        return items, counts
    # exact iterative renumbering: id(t_p..t_{p+j}) = dense(id(t_p..t_{p+j-1}), t_{p+j})
    ids = tokens[starts]
    ids, space = dense_item_ids(ids)
    for j in range(1, ngram):
        nxt, nspace = dense_item_ids(tokens[starts + j])
        ids, space = dense_item_ids(ids * nspace + nxt)
    return ids, counts


def dense_item_ids(items: np.ndarray) -> tuple[np.ndarray, int]:
    """Renumber items to ``0..D-1`` when needed so they can index a table; returns ``(ids, table_size)``.

    Items already in ``[0, max(2^22, 2 * len))`` are returned unchanged.
    """
    if items.size == 0:
        return items.astype(np.int64), 1
    lo, hi = int(items.min()), int(items.max())
    if lo >= 0 and hi < max(_DIRECT_TABLE_LIMIT, 2 * items.size):
        return items, hi + 1
    uniq, inverse = np.unique(items, return_inverse=True)
    return inverse.astype(np.int64).reshape(-1), int(uniq.shape[0])


def _mask_dtype(n: int) -> np.dtype:
    for bits, dt in ((8, "<u1"), (16, "<u2"), (32, "<u4"), (64, "<u8")):
        if n <= bits:
            return np.dtype(dt)
    return np.dtype("<u8")


@functools.cache
def _numba_kernels():
    """``(direct_kernel, hashed_kernel)`` or None when numba cannot be imported."""
    try:
        from fastrl.algorithms._token_sets_numba import direct_kernel, hashed_kernel
    except ImportError as exc:  # numba is in requirements.txt; an environment without it still works
        logger.warning("numba unavailable (%s): MDAP similarities use the slower numpy kernel", exc)
        return None
    return direct_kernel, hashed_kernel


def numba_available() -> bool:
    """Whether the compiled kernel can be used (numba importable)."""
    return _numba_kernels() is not None


def group_intersections(
    items: np.ndarray,
    item_counts: np.ndarray,
    group_sizes: np.ndarray,
    *,
    backend: Literal["auto", "numba", "numpy"] = "auto",
) -> np.ndarray:
    """Intersection sizes of the item sets of every pair of rows in the same group.

    Args:
        items: int64 item ids (any values), rows concatenated, rows ordered by group.
        item_counts: int64 [R], items per row (same order).
        group_sizes: int64 [G], rows per group; the rows of group ``g`` follow those of ``g - 1``.
        backend: "numba" (compiled single pass with a per-group hash table), "numpy" (vectorized
            per group and per row), or "auto" (numba when importable). Both give identical results.

    Returns:
        int64 [G, n_max, n_max]; entry ``[g, a, b]`` is ``|S_a ∩ S_b|`` for the ``a``-th and ``b``-th
        rows of group ``g`` (diagonal: set sizes; padding rows are 0).

    Raises:
        ValueError: unknown ``backend``. RuntimeError: ``backend="numba"`` without numba.
    """
    if backend not in ("auto", "numba", "numpy"):
        raise ValueError(f"`backend` must be 'auto', 'numba' or 'numpy', got {backend!r}")
    num_groups = int(group_sizes.shape[0])
    n_max = int(group_sizes.max()) if num_groups else 0
    if num_groups == 0 or items.size == 0:
        return np.zeros((num_groups, n_max, n_max), dtype=np.int64)
    if backend != "numpy":
        kernels = _numba_kernels()
        if kernels is None and backend == "numba":
            raise RuntimeError("backend='numba' was requested but numba cannot be imported; install requirements.txt")
        if kernels is not None:
            items = np.ascontiguousarray(items, dtype=np.int64)
            item_off = _segment_offsets(item_counts)
            row_off = _segment_offsets(group_sizes)
            lo, hi = int(items.min()), int(items.max())
            words = -(-n_max // 64)
            if lo >= 0 and hi < _DIRECT_TABLE_LIMIT:
                stamp = np.full(hi + 1, -1, dtype=np.int64)
                return kernels[0](items, item_off, row_off, n_max, stamp, np.empty((hi + 1, words), dtype=np.uint64))
            largest_group = int(np.max(item_off[row_off[1:]] - item_off[row_off[:-1]]))
            cap = 1 << max(4, (2 * largest_group - 1).bit_length())
            return kernels[1](
                items,
                item_off,
                row_off,
                n_max,
                np.empty(cap, dtype=np.int64),
                np.full(cap, -1, dtype=np.int64),
                np.empty((cap, words), dtype=np.uint64),
            )
    return _group_intersections_numpy(items, item_counts, group_sizes, n_max)


def _group_intersections_numpy(
    items: np.ndarray, item_counts: np.ndarray, group_sizes: np.ndarray, n_max: int
) -> np.ndarray:
    items, table_size = dense_item_ids(items)
    num_groups = int(group_sizes.shape[0])
    out = np.zeros((num_groups, n_max, n_max), dtype=np.int64)
    words = max(1, -(-n_max // 64))
    mdt = _mask_dtype(n_max)
    table = np.zeros((table_size, words) if words > 1 else table_size, dtype=mdt)
    pos = np.full(table_size, -1, dtype=np.int64)
    item_off = _segment_offsets(item_counts).tolist()
    row_off = _segment_offsets(group_sizes).tolist()
    bit = [mdt.type(1 << (r % 64)) for r in range(min(n_max, 64))]
    for g in range(num_groups):
        r0, r1 = row_off[g], row_off[g + 1]
        a, b = item_off[r0], item_off[r1]
        if a == b:
            continue
        # 1. bitmask of the group's rows holding each item
        for r in range(r1 - r0):
            xr = items[item_off[r0 + r] : item_off[r0 + r + 1]]
            if words > 1:
                table[xr, r // 64] |= bit[r % 64]
            else:
                table[xr] |= bit[r]
        # 2. one position per distinct item ("claim": the position that reads back its own index)
        x = items[a:b]
        local = np.arange(b - a, dtype=np.int64)
        pos[x] = local
        distinct = x[pos[x] == local]
        masks = table[distinct]
        table[distinct] = 0
        # 3. Gram matrix of the 0/1 membership rows = intersection sizes
        n = r1 - r0
        bits = np.unpackbits(
            np.ascontiguousarray(masks).view(np.uint8).reshape(distinct.shape[0], -1), axis=1, bitorder="little"
        )[:, :n]
        bf = bits.astype(np.float32)
        # exact: every partial sum is an integer < 2^24 (fewer than 16M distinct items per group)
        out[g, :n, :n] = np.rint(bf.T @ bf).astype(np.int64)
    return out
