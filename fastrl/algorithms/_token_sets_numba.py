"""Compiled kernels of :func:`fastrl.algorithms.token_sets.group_intersections` (numba).

Both kernels make one pass over every item of the batch, group by group, keeping for each item
of the current group a bitmask of the rows already holding it. When row ``r`` meets an item for
the first time, ``|S_r|`` grows by one and the bitmask ``m`` of earlier rows is counted in a
histogram ``hist[r, byte, m_byte]``; at the end of the group the histogram is expanded into
``|S_r ∩ S_j|`` for every earlier row ``j``. Counts are exact integers, identical to the numpy
kernel.

- :func:`direct_kernel`: items index a table directly (ids below ``table_size``); branch-free
  inner loop, with a per-group stamp instead of clearing the table.
- :func:`hashed_kernel`: any int64 ids (packed n-grams); a per-group open-addressing hash table
  with capacity >= 2x the group's items.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ONE = np.uint64(1)


@njit(cache=True, nogil=True)
def _group_buffers(row_off, n_max):  # pragma: no cover - compiled
    """Work buffers of both kernels for ``G = len(row_off) - 1`` groups of at most ``n_max`` rows.

    Returns ``(G, out, hist, sizes)``: ``out`` int64 [G, n_max, n_max] (the intersections, zeroed),
    ``hist`` int64 [n_max, ceil(n_max / 8), 256] (per-row byte histograms of earlier-row masks),
    ``sizes`` int64 [n_max] (``|S_r|`` of the current group's rows).
    """
    num_groups = row_off.shape[0] - 1
    out = np.zeros((num_groups, n_max, n_max), dtype=np.int64)
    hist = np.zeros((n_max, (n_max + 7) // 8, 256), dtype=np.int64)
    sizes = np.zeros(n_max, dtype=np.int64)
    return num_groups, out, hist, sizes


@njit(cache=True, nogil=True)
def _expand(hist, sizes, out, g, n):  # pragma: no cover - compiled
    for a in range(n):
        out[g, a, a] = sizes[a]
        for q in range((a + 7) >> 3):
            for m in range(1, 256):
                cnt = hist[a, q, m]
                if cnt:
                    for t in range(8):
                        if (m >> t) & 1:
                            out[g, a, q * 8 + t] += cnt
        for b in range(a):
            out[g, b, a] = out[g, a, b]


@njit(cache=True, nogil=True)
def direct_kernel(items, item_off, row_off, n_max, stamp, mask):  # pragma: no cover - compiled
    """``stamp``: int64 [table_size] filled with -1; ``mask``: uint64 [table_size, ceil(n_max / 64)]
    (any content). Allocated by the caller: numpy fills them much faster than compiled code."""
    num_groups, out, hist, sizes = _group_buffers(row_off, n_max)
    words = mask.shape[1]
    for g in range(num_groups):
        r0 = row_off[g]
        n = row_off[g + 1] - r0
        hist[:n, :, :] = 0
        for lr in range(n):
            r = r0 + lr
            w = lr >> 6
            sh = np.uint64(lr & 63)
            bit = _ONE << sh
            nq = (lr + 7) >> 3  # bytes holding the bits of rows 0..lr-1
            new_items = 0
            for p in range(item_off[r], item_off[r + 1]):
                x = items[p]
                seen = np.uint64(stamp[x] == g)
                stamp[x] = g
                if words == 1:
                    m = mask[x, 0] * seen  # 0 when the slot is stale (first time in this group)
                    new = np.int64(1) - np.int64((m >> sh) & _ONE)
                    new_items += new
                    for q in range(nq):
                        hist[lr, q, np.int64((m >> np.uint64(8 * q)) & np.uint64(255))] += new
                    mask[x, 0] = m | bit
                else:
                    if seen == 0:
                        for k in range(words):
                            mask[x, k] = 0
                    m = mask[x, w]
                    new = np.int64(1) - np.int64((m >> sh) & _ONE)
                    new_items += new
                    for q in range(nq):
                        mw = mask[x, q >> 3]
                        hist[lr, q, np.int64((mw >> np.uint64(8 * (q & 7))) & np.uint64(255))] += new
                    mask[x, w] = m | bit
            sizes[lr] = new_items
        _expand(hist, sizes, out, g, n)
    return out


@njit(cache=True, nogil=True)
def hashed_kernel(items, item_off, row_off, n_max, keys, stamp, mask):  # pragma: no cover - compiled
    """``keys``: int64 [cap]; ``stamp``: int64 [cap] filled with -1; ``mask``: uint64
    [cap, ceil(n_max / 64)]; ``cap`` a power of two >= 2x the items of the largest group."""
    num_groups, out, hist, sizes = _group_buffers(row_off, n_max)
    words = mask.shape[1]
    for g in range(num_groups):
        r0 = row_off[g]
        n = row_off[g + 1] - r0
        count = item_off[r0 + n] - item_off[r0]
        c = 16
        log2c = 4
        while c < 2 * count:
            c *= 2
            log2c += 1
        shift = np.uint64(64 - log2c)
        cmask = c - 1
        hist[:n, :, :] = 0
        for lr in range(n):
            r = r0 + lr
            w = lr >> 6
            bit = _ONE << np.uint64(lr & 63)
            nq = (lr + 7) >> 3
            new_items = 0
            for p in range(item_off[r], item_off[r + 1]):
                x = items[p]
                h = np.int64((np.uint64(x) * _GOLDEN) >> shift)
                while stamp[h] == g and keys[h] != x:
                    h = (h + 1) & cmask
                if stamp[h] != g:
                    stamp[h] = g
                    keys[h] = x
                    for k in range(words):
                        mask[h, k] = 0
                elif mask[h, w] & bit:
                    continue  # repeated item within the row
                new_items += 1
                for q in range(nq):
                    mq = np.int64((mask[h, q >> 3] >> np.uint64(8 * (q & 7))) & np.uint64(255))
                    if mq:
                        hist[lr, q, mq] += 1
                mask[h, w] |= bit
            sizes[lr] = new_items
        _expand(hist, sizes, out, g, n)
    return out
