"""Input validation shared by the algorithm modules: clear errors naming the argument, row and value."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def as_1d_tensor(x: Any, name: str, *, floating: bool | None = None) -> torch.Tensor:
    """Return ``x`` as a 1-D tensor (no copy when it already is one).

    Raises:
        TypeError: ``floating=True`` and ``x`` is not a real floating/integer type, or
            ``floating=False`` and ``x`` is not an integer type.
        ValueError: ``x`` is not one-dimensional.
    """
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.dim() != 1:
        raise ValueError(f"`{name}` must be one-dimensional, got shape {tuple(t.shape)}")
    if floating is False and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
        raise TypeError(f"`{name}` must hold integers, got dtype {t.dtype}")
    if floating is True and (t.dtype.is_complex or t.dtype == torch.bool):
        raise TypeError(f"`{name}` must hold real numbers, got dtype {t.dtype}")
    return t


def check_same_length(n: int, **named: Any) -> None:
    """Raise ValueError naming the first argument whose length differs from ``n``."""
    for key, value in named.items():
        if value is not None and len(value) != n:
            raise ValueError(f"`{key}` has {len(value)} rows but the batch has {n}; they must match row for row")


def check_finite(t: torch.Tensor, name: str, mask: torch.Tensor | None = None) -> None:
    """Raise ValueError naming the first non-finite row of ``t`` (rows where ``mask`` is False are ignored)."""
    bad = ~torch.isfinite(t)
    if mask is not None:
        bad &= mask
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"`{name}[{row}]` is {t[row].item()}; every value must be finite")


def check_nonempty(n: int, name: str) -> None:
    if n == 0:
        raise ValueError(f"`{name}` is empty: a batch needs at least one rollout")


def as_valid_mask(valid: Any, n: int) -> torch.Tensor:
    """Return the optional ``valid`` mask as a bool tensor [n] (all True when ``valid`` is None)."""
    if valid is None:
        return torch.ones(n, dtype=torch.bool)
    v = valid if isinstance(valid, torch.Tensor) else torch.as_tensor(np.asarray(valid))
    if v.dim() != 1 or v.shape[0] != n:
        raise ValueError(f"`valid` must have shape [{n}], got {tuple(v.shape)}")
    if v.dtype != torch.bool:
        raise TypeError(f"`valid` must be a bool mask, got dtype {v.dtype}")
    return v


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_choice(value: str, name: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {list(choices)}, got {value!r}")
    return value
