"""Approximate MDAP similarity from small per-response sketches (one-permutation MinHash).

For very large batches, gathering every response token on every data-parallel rank is the cost
of exact MDAP. Instead each rank sketches its own rollouts and the ranks exchange
``num_bins * 2`` bytes per rollout (256 bytes by default) plus the length.

Sketch: one-permutation hashing with rotation densification (Li, Owen & Zhang 2012, "One
Permutation Hashing"; Shrivastava & Li 2014, "Densifying One Permutation Hashing via Rotation"):
every n-gram item is hashed once with a 64-bit mixer (splitmix64 finalizer), the top bits choose
one of ``num_bins`` bins and the rest is the value; each bin keeps its minimum. Empty bins borrow
the value of the next non-empty bin to the right (circularly) at distance ``d``, mixed with ``d``.
Values are stored as 16-bit residues (b-bit MinHash, Li & König 2010), so two bins match with
probability ``J + (1 - J) / 65535``; :func:`estimate_jaccard` removes that bias.

A sketch depends only on the response's own tokens, ``ngram`` and ``seed``: sketching on each rank
and concatenating gives exactly the sketch of the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastrl.algorithms.token_sets import flatten_responses

__all__ = ["ResponseSketch", "minhash_sketch", "estimate_jaccard"]

_EMPTY_SET = np.uint16(0xFFFF)  # every bin of an empty set; never produced for a non-empty set
_MOD = np.uint64(0xFFFF)  # stored value = 64-bit value mod 65535, in [0, 65534]
_COLLISION = 1.0 / 65535.0
_U64_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray, *, inplace: bool = False) -> np.ndarray:
    """splitmix64 finalizer on a uint64 array (wrapping arithmetic)."""
    if not inplace:
        z = z.copy()
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


@dataclass(frozen=True)
class ResponseSketch:
    """MinHash sketches of N responses: what DP ranks exchange instead of the tokens.

    Attributes:
        signatures: uint16 [N, num_bins].
        lengths: int64 [N], response lengths in tokens (for the kept-token statistics).
        ngram: n-gram size the sketch was built with.
        seed: hash seed (all ranks must use the same one).
    """

    signatures: np.ndarray
    lengths: np.ndarray
    ngram: int
    seed: int

    def __post_init__(self):
        if self.signatures.dtype != np.uint16 or self.signatures.ndim != 2:
            raise ValueError(
                f"signatures must be uint16 [N, num_bins], got {self.signatures.dtype} {self.signatures.shape}"
            )
        if self.lengths.shape != (self.signatures.shape[0],):
            raise ValueError(f"lengths must have shape [{self.signatures.shape[0]}], got {self.lengths.shape}")

    def __len__(self) -> int:
        return int(self.signatures.shape[0])

    @property
    def num_bins(self) -> int:
        return int(self.signatures.shape[1])

    @property
    def bytes_per_rollout(self) -> int:
        """Bytes of one rollout's signature (the length adds 8 more if sent separately)."""
        return int(self.signatures.shape[1] * self.signatures.itemsize)

    @classmethod
    def concat(cls, sketches: Sequence[ResponseSketch]) -> ResponseSketch:
        """Concatenate sketches (e.g. gathered from DP ranks, in rank order).

        Raises:
            ValueError: empty input, or sketches built with different ``ngram`` / ``seed`` / ``num_bins``.
        """
        if not sketches:
            raise ValueError("no sketches to concatenate")
        first = sketches[0]
        for i, s in enumerate(sketches):
            if (s.ngram, s.seed, s.num_bins) != (first.ngram, first.seed, first.num_bins):
                raise ValueError(
                    f"sketch {i} has ngram={s.ngram}, seed={s.seed}, num_bins={s.num_bins}; sketch 0 has "
                    f"ngram={first.ngram}, seed={first.seed}, num_bins={first.num_bins}"
                )
        return cls(
            np.concatenate([s.signatures for s in sketches]),
            np.concatenate([s.lengths for s in sketches]),
            first.ngram,
            first.seed,
        )

    def to_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(int16 [N, num_bins], int64 [N])`` for collectives (bit-identical view of the uint16 values)."""
        return torch.from_numpy(self.signatures.view(np.int16).copy()), torch.from_numpy(self.lengths.copy())

    @classmethod
    def from_tensors(cls, signatures: torch.Tensor, lengths: torch.Tensor, *, ngram: int, seed: int) -> ResponseSketch:
        """Inverse of :meth:`to_tensors`."""
        if signatures.dtype != torch.int16:
            raise ValueError(f"signatures must be int16 (see to_tensors), got {signatures.dtype}")
        sig = signatures.detach().cpu().contiguous().numpy().view(np.uint16)
        return cls(sig, lengths.detach().cpu().numpy().astype(np.int64), ngram, seed)


def _ngram_hash_items(flat: np.ndarray, lengths: np.ndarray, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row n-gram items as uint64 hashes; depend on the row's tokens only (no batch-wide renumbering)."""
    tok = flat.view(np.uint64)  # same bits as the int64 ids
    if ngram == 1:
        return tok, lengths
    counts = np.maximum(lengths - ngram + 1, 0)
    off = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    row_end = np.repeat(off[1:], lengths)
    starts = np.nonzero(np.arange(flat.shape[0]) + ngram <= row_end)[0]
    h = tok[starts]
    for j in range(1, ngram):
        h = _mix64(h + _GOLDEN) ^ tok[starts + j]
    return h, counts


def minhash_sketch(
    responses: Sequence[Any],
    *,
    num_bins: int = 128,
    ngram: int = 1,
    seed: int = 0,
) -> ResponseSketch:
    """One-permutation MinHash sketch of each response's n-gram set.

    Args:
        responses: N sequences of token ids (1-D int tensors, arrays or lists), unpadded.
        num_bins: sketch size, a power of two in [16, 4096]; bytes per rollout = 2 * num_bins.
            The standard error of the Jaccard estimate is about ``sqrt(J (1 - J) / num_bins)``.
        ngram: n-gram size (as in :func:`fastrl.algorithms.pruning.jaccard`).
        seed: hash seed; every rank must use the same.

    Returns:
        :class:`ResponseSketch`.

    Raises:
        ValueError: bad ``num_bins`` / ``ngram``; TypeError / ValueError for malformed responses.
    """
    if not (isinstance(num_bins, int) and 16 <= num_bins <= 4096 and num_bins & (num_bins - 1) == 0):
        raise ValueError(f"`num_bins` must be a power of two in [16, 4096], got {num_bins!r}")
    if not (isinstance(ngram, int) and ngram >= 1):
        raise ValueError(f"`ngram` must be an integer >= 1, got {ngram!r}")
    flat, lengths = flatten_responses(responses)
    n = lengths.shape[0]
    items, counts = _ngram_hash_items(flat, lengths, ngram)
    shift = np.uint64(64 - (num_bins.bit_length() - 1))
    seed_key = _mix64(np.array([seed], dtype=np.uint64) + _GOLDEN)[0]
    hv = _mix64(items ^ seed_key, inplace=True)
    key = (hv >> shift).view(np.int64)  # bin
    key += np.repeat(np.arange(n, dtype=np.int64) * num_bins, counts)
    hv &= (np.uint64(1) << shift) - np.uint64(1)  # value within the bin
    full = np.full(n * num_bins, _U64_MAX, dtype=np.uint64)
    np.minimum.at(full, key, hv)
    full = full.reshape(n, num_bins)

    nonempty = full != _U64_MAX
    # rotation densification: an empty bin j takes bin j+d (mod k), the next non-empty one, mixed with d
    idx = np.arange(2 * num_bins, dtype=np.int64)
    cand = np.where(np.concatenate([nonempty, nonempty], axis=1), idx, 4 * num_bins)
    nxt = np.minimum.accumulate(cand[:, ::-1], axis=1)[:, ::-1][:, :num_bins]
    has_any = nonempty.any(axis=1)
    nxt = np.where(has_any[:, None], nxt, np.arange(num_bins)[None, :])
    dist = (nxt - np.arange(num_bins)[None, :]).astype(np.uint64)
    src = np.take_along_axis(full, nxt % num_bins, axis=1)
    borrowed = _mix64(src + dist * _GOLDEN)
    value64 = np.where(dist == 0, src, borrowed)
    sig = (value64 % _MOD).astype(np.uint16)
    sig[~has_any] = _EMPTY_SET
    return ResponseSketch(sig, lengths, ngram, seed)


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    """Estimated Jaccard index of row pairs from their sketches.

    Args:
        sig_a, sig_b: uint16 [P, num_bins] (row ``p`` of each is one pair) or [num_bins].

    Returns:
        float64 [P] (or a 0-dim array): the bias-corrected match fraction
        ``(m - c) / (1 - c)`` clipped to [0, 1] with ``c = 1/65535``; 1.0 when both sets are empty and
        0.0 when exactly one is (the convention of :func:`fastrl.algorithms.pruning.jaccard`).
    """
    a = np.asarray(sig_a)
    b = np.asarray(sig_b)
    if a.shape != b.shape:
        raise ValueError(f"sketch shapes differ: {a.shape} vs {b.shape}")
    match = (a == b).mean(axis=-1)
    est = np.clip((match - _COLLISION) / (1.0 - _COLLISION), 0.0, 1.0)
    empty_a = (a == _EMPTY_SET).all(axis=-1)
    empty_b = (b == _EMPTY_SET).all(axis=-1)
    est = np.where(empty_a & empty_b, 1.0, np.where(empty_a | empty_b, 0.0, est))
    return est
