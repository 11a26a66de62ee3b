"""Deterministic per-step / per-rank seeds (resume-safe: derived from the step number)."""

from __future__ import annotations


def derive_seed(*parts: int) -> int:
    """A deterministic 63-bit seed from integers (a hash combine over ``parts``)."""
    value = 0x9E3779B97F4A7C15
    for p in parts:
        value = (value ^ (int(p) + 0x9E3779B97F4A7C15 + (value << 6) + (value >> 2))) & ((1 << 63) - 1)
    return value
