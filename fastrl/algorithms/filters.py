"""DAPO batch filters and reward shaping (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement
Learning System at Scale"): dynamic sampling (section 3.2) and overlong reward shaping (eq. 13)."""

from __future__ import annotations

import torch

from fastrl.algorithms._checks import as_1d_tensor, as_valid_mask, check_nonempty, check_same_length

__all__ = ["dynamic_sampling_keep", "overlong_penalty"]


def dynamic_sampling_keep(
    accuracy: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """DAPO dynamic sampling: keep the groups whose accuracy is neither all 0 nor all 1.

    Such groups have zero reward variance, hence zero GRPO advantage and no gradient (DAPO eq. 11).
    Filter on accuracy, not on a format-inclusive score: a group of formatted-but-wrong answers
    scores 0.5 everywhere and must be dropped too.

    Args:
        accuracy: [N], 0 or 1 per rollout (float, int or bool).
        group_ids: int [N], one id per prompt.
        valid: optional bool [N]; rows whose grading failed are ignored when deciding (their
            accuracy may be anything, NaN included) and follow their group's decision.

    Returns:
        bool [N], True for every row of a kept group (a group is kept iff its valid rows hold at
        least one 0 and at least one 1).

    Raises:
        ValueError: empty batch, mismatched lengths, or a valid accuracy other than 0/1 (names the row).
        TypeError: non-integer ``group_ids``.
    """
    acc = as_1d_tensor(accuracy, "accuracy", floating=None)
    g = as_1d_tensor(group_ids, "group_ids", floating=False).to(torch.int64)
    check_nonempty(acc.shape[0], "accuracy")
    check_same_length(acc.shape[0], group_ids=g)
    v = as_valid_mask(valid, acc.shape[0])
    a = acc.to(torch.float64)
    bad = v & ~((a == 0) | (a == 1))
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0, 0])
        raise ValueError(
            f"`accuracy[{row}]` is {acc[row].item()}: dynamic sampling filters on accuracy (0 or 1), "
            "not on a format-inclusive score; pass the accuracy component of the reward"
        )
    _, inverse = torch.unique(g, return_inverse=True)
    num_groups = int(inverse.max()) + 1
    ones = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, (v & (a == 1)).to(torch.float64))
    zeros = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, (v & (a == 0)).to(torch.float64))
    keep_group = (ones > 0) & (zeros > 0)
    return keep_group[inverse]


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO soft overlong punishment (eq. 13), added to the reward.

    ``R(y) = 0`` if ``|y| <= Lmax - Lcache``; ``((Lmax - Lcache) - |y|) / Lcache`` if
    ``Lmax - Lcache < |y| <= Lmax``; ``-1`` if ``|y| > Lmax``.
    Example (Lmax 20480, Lcache 4096): 16000 -> 0, 18000 -> -0.39453125, 20481 -> -1.

    Args:
        lengths: int [N], response lengths in tokens.
        max_len: ``Lmax`` in tokens; cache_len: ``Lcache`` in tokens, ``0 < Lcache <= Lmax``.

    Returns:
        float32 [N], values in [-1, 0].

    Raises:
        ValueError: ``cache_len`` / ``max_len`` out of range, negative lengths.
    """
    ln = as_1d_tensor(lengths, "lengths", floating=False).to(torch.int64)
    if not (isinstance(max_len, int) and isinstance(cache_len, int) and 0 < cache_len <= max_len):
        raise ValueError(f"need integers 0 < cache_len <= max_len, got max_len={max_len!r}, cache_len={cache_len!r}")
    if bool((ln < 0).any()):
        row = int(torch.nonzero(ln < 0)[0, 0])
        raise ValueError(f"`lengths[{row}]` is {int(ln[row])}; lengths are token counts >= 0")
    expected = max_len - cache_len
    x = ln.to(torch.float64)
    ramp = (expected - x) / cache_len
    out = torch.where(x <= expected, torch.zeros_like(x), torch.where(x <= max_len, ramp, -torch.ones_like(x)))
    return out.to(torch.float32)
