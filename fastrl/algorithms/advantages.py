"""Group-relative advantage estimators (GRPO, Dr. GRPO, RLOO) and sequence <-> token conversions.

All functions are vectorized over the batch (``index_add`` / ``scatter_reduce`` over group ids);
nothing loops over groups in Python. Statistics are computed in float64 and the result is returned
in the dtype of ``rewards`` (float32 when ``rewards`` holds integers).

Rows whose reward is invalid (the grader raised or timed out, see ``valid``) are left out of
their group's statistics and get advantage 0, so they contribute no gradient.
"""

from __future__ import annotations

import torch

from fastrl.algorithms._checks import (
    as_1d_tensor,
    as_valid_mask,
    check_finite,
    check_nonempty,
    check_same_length,
)

__all__ = [
    "grpo_advantages",
    "rloo_advantages",
    "sequence_to_token_advantages",
    "token_to_sequence_advantages",
]


class _GroupStats:
    """Per-row group statistics over the valid rows: count, mean, and whether the group is constant."""

    def __init__(self, rewards: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor):
        _, inverse = torch.unique(group_ids, return_inverse=True)
        num_groups = int(inverse.max()) + 1
        r = torch.where(valid, rewards.to(torch.float64), torch.zeros((), dtype=torch.float64))
        w = valid.to(torch.float64)
        count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, w)
        total = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, r)
        mean = total / count.clamp(min=1.0)
        # max == min over the valid members: the group is constant and its advantages are exactly 0
        big = torch.tensor(float("inf"), dtype=torch.float64)
        hi = torch.full((num_groups,), -float("inf"), dtype=torch.float64).scatter_reduce(
            0, inverse, torch.where(valid, r, -big), reduce="amax", include_self=True
        )
        lo = torch.full((num_groups,), float("inf"), dtype=torch.float64).scatter_reduce(
            0, inverse, torch.where(valid, r, big), reduce="amin", include_self=True
        )
        self.inverse = inverse
        self.num_groups = num_groups
        self.r = r
        self.count = count
        self.total = total
        self.mean = mean
        self.constant = hi <= lo  # also True for groups without valid rows
        # a row gets a non-zero advantage only if it is valid and its group has >= 2 valid,
        # non-identical rewards
        self.active = valid & (count[inverse] >= 2) & ~self.constant[inverse]


def _prepare(rewards, group_ids, valid):
    r = as_1d_tensor(rewards, "rewards", floating=True)
    g = as_1d_tensor(group_ids, "group_ids", floating=False).to(torch.int64)
    check_nonempty(r.shape[0], "rewards")
    check_same_length(r.shape[0], group_ids=g)
    v = as_valid_mask(valid, r.shape[0])
    check_finite(r.to(torch.float64), "rewards", mask=v)
    out_dtype = r.dtype if r.dtype.is_floating_point else torch.float32
    return r, g, v, out_dtype


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    eps: float = 1e-6,
    unbiased: bool = True,
    scale: bool = True,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO outcome advantages, normalized within each group of responses to the same prompt.

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` (Shao et al. 2024, DeepSeekMath, eq. 3 in the
    outcome-supervision form). With ``scale=False`` this is Dr. GRPO, ``A_i = r_i - mean_g(r)``
    (Liu et al. 2025, "Understanding R1-Zero-Like Training", section 3.2).

    Args:
        rewards: float [N], one scalar reward per rollout.
        group_ids: int [N], one id per prompt; the rollouts of a prompt share it. Any integers.
        eps: added to the standard deviation (not to the variance).
        unbiased: standard deviation with Bessel's correction (N-1), as in the reference code.
        scale: divide by the standard deviation (GRPO); False gives Dr. GRPO.
        valid: optional bool [N]; False rows (grading failed) are excluded from the group
            statistics and get advantage 0.

    Returns:
        float [N] (dtype of ``rewards``). A group whose valid rewards are all equal, or that has
        fewer than two valid rollouts, gets exactly 0 (there is no relative signal; verl instead
        uses mean 0 / std 1 for a singleton group).

    Raises:
        ValueError: empty batch, mismatched lengths, non-finite reward on a valid row.
        TypeError: non-integer ``group_ids`` or non-bool ``valid``.
    """
    r, g, v, out_dtype = _prepare(rewards, group_ids, valid)
    s = _GroupStats(r, g, v)
    dev = s.r - s.mean[s.inverse]
    if scale:
        sq = torch.zeros(s.num_groups, dtype=torch.float64).index_add_(0, s.inverse, torch.where(v, dev * dev, 0.0))
        denom = (s.count - 1.0) if unbiased else s.count
        std = torch.sqrt(sq / denom.clamp(min=1.0))
        adv = dev / (std[s.inverse] + eps)
    else:
        adv = dev
    adv = torch.where(s.active, adv, torch.zeros((), dtype=torch.float64))
    return adv.to(out_dtype)


def rloo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE leave-one-out advantages: ``A_i = r_i - mean_{j != i, j in g} r_j``.

    (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization", eq. 5.)
    Equivalently ``A_i = n / (n - 1) * (r_i - mean_g(r))`` over the ``n`` valid members of the group.

    Args:
        rewards: float [N]; group_ids: int [N]; valid: optional bool [N] as in :func:`grpo_advantages`.

    Returns:
        float [N] (dtype of ``rewards``); exactly 0 for invalid rows, for groups with fewer than two
        valid rollouts and for groups whose valid rewards are all equal.

    Raises:
        ValueError / TypeError: as :func:`grpo_advantages`.
    """
    r, g, v, out_dtype = _prepare(rewards, group_ids, valid)
    s = _GroupStats(r, g, v)
    n = s.count[s.inverse]
    loo_mean = (s.total[s.inverse] - s.r) / (n - 1.0).clamp(min=1.0)
    adv = torch.where(s.active, s.r - loo_mean, torch.zeros((), dtype=torch.float64))
    return adv.to(out_dtype)


def _check_mask(response_mask: torch.Tensor, n: int) -> torch.Tensor:
    if response_mask.dim() != 2 or response_mask.shape[0] != n:
        raise ValueError(f"`response_mask` must have shape [{n}, T], got {tuple(response_mask.shape)}")
    return response_mask


def sequence_to_token_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast one advantage per sequence to its response tokens.

    Args:
        advantages: float [N].
        response_mask: [N, T], 1/True on response tokens (EOS included), 0 on padding.

    Returns:
        [N, T] in the dtype of ``advantages``: ``advantages[i]`` on response tokens, 0 elsewhere.
    """
    a = as_1d_tensor(advantages, "advantages", floating=True)
    m = _check_mask(response_mask, a.shape[0])
    return a.unsqueeze(1) * m.to(a.dtype)


def token_to_sequence_advantages(token_advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Masked mean of per-token advantages over each response: the scalar ``a[i]`` MDAP prunes on.

    ``a_i = sum_t A_{i,t} m_{i,t} / sum_t m_{i,t}`` (spec section 2), accumulated in float64 so that
    rollouts with the same per-token value get bit-identical scalars. A response without tokens
    gets 0.

    Args:
        token_advantages: float [N, T]; response_mask: [N, T] (bool or 0/1).

    Returns:
        float [N] in the dtype of ``token_advantages``.
    """
    if token_advantages.dim() != 2:
        raise ValueError(f"`token_advantages` must have shape [N, T], got {tuple(token_advantages.shape)}")
    m = _check_mask(response_mask, token_advantages.shape[0])
    if m.shape != token_advantages.shape:
        raise ValueError(
            f"`response_mask` shape {tuple(m.shape)} differs from `token_advantages` shape "
            f"{tuple(token_advantages.shape)}"
        )
    m64 = m.to(torch.float64)
    num = (token_advantages.to(torch.float64) * m64).sum(dim=1)
    den = m64.sum(dim=1)
    return torch.where(den > 0, num / den.clamp(min=1.0), 0.0).to(token_advantages.dtype)
