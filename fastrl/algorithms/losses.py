"""Policy losses (PPO clipped surrogate with clip-higher and dual clip, GSPO, GSPO-token), KL loss,
and loss aggregation over a mini-batch that is split across micro-batches and data-parallel ranks.

Aggregation with a global denominator (spec section 4; DAPO eq. 12 for token-mean): every function
returns ``sum(local terms) / global_denominator``. The trainer computes the denominator once per
mini-batch with :func:`loss_denominator` on each micro-batch, sums it over micro-batches and
data-parallel ranks (one all-reduce), and passes it in. Summing the returned losses over all
micro-batches and ranks then gives the mini-batch loss, whatever the split, so the loss is
testable on one CPU and independent of the parallel layout.

Sign convention: the returned loss is minimized (loss = -objective). Metrics are detached 0-dim
tensors over the local micro-batch (token-weighted means unless the name says otherwise); the
trainer reduces them.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from fastrl.algorithms.kl import KLEstimator, kl_estimate

__all__ = [
    "AggMode",
    "AGG_MODES",
    "loss_denominator",
    "aggregate_loss",
    "ppo_clip_loss",
    "gspo_loss",
    "kl_loss",
]

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")

_MAX_LOG_RATIO = 20.0  # exp(20) ~ 4.9e8: keeps ratios finite, as verl does


def _check_agg_mode(agg_mode: str) -> None:
    if agg_mode not in AGG_MODES:
        raise ValueError(f"`agg_mode` must be one of {list(AGG_MODES)}, got {agg_mode!r}")


def _check_2d(name: str, t: torch.Tensor, shape: torch.Size) -> None:
    if t.shape != shape:
        raise ValueError(f"`{name}` must have shape {tuple(shape)} (like `log_probs`), got {tuple(t.shape)}")


def loss_denominator(response_mask: torch.Tensor, agg_mode: AggMode, row_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Local contribution to the global loss denominator of ``agg_mode``.

    - "token-mean": number of response tokens,
    - "seq-mean-token-mean" / "seq-mean-token-sum": number of responses with at least one token.

    Args:
        response_mask: [N, T] (bool or 0/1).
        row_weights: float [N] or None: each rollout counts ``row_weights[i]`` times (its tokens, or
            itself), as it does in :func:`kl_loss` (a sample of the uniform groups standing for all of
            them, ``pruning.zero_adv_kl='sample'``: the denominator then estimates the token count of
            the rows they stand for, as the KL sum estimates their KL; a ratio estimator).

    Returns:
        float64 0-dim tensor. Sum it over micro-batches and DP ranks to get ``global_denominator``.
    """
    _check_agg_mode(agg_mode)
    if response_mask.dim() != 2:
        raise ValueError(f"`response_mask` must have shape [N, T], got {tuple(response_mask.shape)}")
    m = response_mask.to(torch.float64)
    per_row = m.sum(dim=1) if agg_mode == "token-mean" else (m.sum(dim=1) > 0).to(torch.float64)
    if row_weights is None:
        return per_row.sum()
    if row_weights.shape != per_row.shape:
        raise ValueError(f"`row_weights` has shape {tuple(row_weights.shape)}, expected ({per_row.shape[0]},)")
    return (per_row * row_weights.to(torch.float64)).sum()


def _check_denominator(global_denominator) -> torch.Tensor | float:
    value = float(global_denominator)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"`global_denominator` must be a positive count (tokens or sequences over the whole "
            f"mini-batch), got {value}"
        )
    return global_denominator


def aggregate_loss(
    loss_mat: torch.Tensor,
    response_mask: torch.Tensor,
    agg_mode: AggMode,
    *,
    global_denominator: torch.Tensor | float,
) -> torch.Tensor:
    """Reduce per-token losses [N, T] to this micro-batch's share of the mini-batch loss.

    - "token-mean": ``sum_{i,t} l_{i,t} m_{i,t} / D`` with D = response tokens in the mini-batch
      (DAPO, Yu et al. 2025, eq. 12).
    - "seq-mean-token-mean": ``sum_i (sum_t l_{i,t} m_{i,t} / |y_i|) / D`` with D = responses in the
      mini-batch (GRPO, Shao et al. 2024, eq. 3; GSPO).
    - "seq-mean-token-sum": ``sum_{i,t} l_{i,t} m_{i,t} / D`` with D = responses (Dr. GRPO uses a
      constant per-response normalizer instead of ``|y_i|``).

    Args:
        loss_mat: float [N, T]; response_mask: [N, T];
        global_denominator: positive scalar from :func:`loss_denominator`, summed over the mini-batch.

    Returns:
        0-dim tensor in the dtype of ``loss_mat``.

    Raises:
        ValueError: unknown ``agg_mode``, shape mismatch, non-positive denominator.
    """
    _check_agg_mode(agg_mode)
    if loss_mat.dim() != 2 or loss_mat.shape != response_mask.shape:
        raise ValueError(
            f"`loss_mat` {tuple(loss_mat.shape)} and `response_mask` {tuple(response_mask.shape)} must share "
            "one shape [N, T]"
        )
    denom = _check_denominator(global_denominator)
    m = response_mask.to(loss_mat.dtype)
    masked = loss_mat * m
    if agg_mode == "seq-mean-token-mean":
        per_seq = masked.sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
        total = per_seq.sum()
    else:
        total = masked.sum()
    return total / denom


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return ((x * m).sum() / m.sum().clamp(min=1.0)).detach()


def _masked_max(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    if not bool((m > 0).any()):
        return torch.zeros((), dtype=x.dtype)
    return x.detach()[m > 0].max()


def _masked_min(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    if not bool((m > 0).any()):
        return torch.zeros((), dtype=x.dtype)
    return x.detach()[m > 0].min()


def _token_advantages(advantages: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if advantages.dim() == 1 and advantages.shape[0] == shape[0]:
        return advantages.unsqueeze(1).expand(shape)
    if advantages.shape == shape:
        return advantages
    raise ValueError(f"`advantages` must have shape [{shape[0]}] or {tuple(shape)}, got {tuple(advantages.shape)}")


def _weights(importance_weights: torch.Tensor | None, shape: torch.Size) -> torch.Tensor | None:
    if importance_weights is None:
        return None
    w = importance_weights.detach()
    if w.dim() == 1 and w.shape[0] == shape[0]:
        return w.unsqueeze(1).expand(shape)
    if w.shape != shape:
        raise ValueError(f"`importance_weights` must have shape [{shape[0]}] or {tuple(shape)}, got {tuple(w.shape)}")
    return w


def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    global_denominator: torch.Tensor | float,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg_mode: AggMode = "token-mean",
    importance_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate per token, with decoupled clip range and dual clip.

    ``rho = exp(log pi - log pi_old)``;
    ``l = max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high))`` (Schulman et al. 2017, eq. 7;
    clip-higher from DAPO, Yu et al. 2025, eq. 10: ``clip_low = 0.2, clip_high = 0.28``);
    for ``A < 0`` the loss is further capped at ``-dual_clip * A`` (Ye et al. 2020, "Mastering
    Complex Control in MOBA Games", eq. 5, ``c = 3``). Examples with dual clip 3, clip_low 0.2:
    A=+1, rho=1.35 -> -1.28 (clip_high 0.28); A=-1, rho=5 -> 3.

    Args:
        log_probs: float [N, T], current policy, with grad.
        old_log_probs: float [N, T], policy that generated the rollouts (no grad needed).
        advantages: float [N] (broadcast over tokens) or [N, T].
        response_mask: [N, T].
        global_denominator: see :func:`aggregate_loss`.
        clip_low, clip_high: clip range ``[1 - clip_low, 1 + clip_high]``.
        dual_clip: ``c > 1``, or None to disable.
        agg_mode: see :func:`aggregate_loss`.
        importance_weights: optional detached [N, T] or [N] weights (truncated IS, see
            :mod:`fastrl.algorithms.importance_sampling`) multiplying each token's loss.

    Returns:
        ``(loss, metrics)``; metrics ``pg_clipfrac`` (tokens where the clipped term is active),
        ``pg_clipfrac_high``, ``pg_clipfrac_low``, ``pg_dual_clipfrac``, ``approx_kl`` (k3 estimate of
        KL(pi_old || pi)), ``ppo_kl`` (k1 estimate), ``ratio_mean``, ``ratio_max``, ``ratio_min``,
        ``pg_loss_token_mean``.

    Raises:
        ValueError: shapes, unknown ``agg_mode``, clip values outside (0, 1] / negative, ``dual_clip <= 1``.
    """
    shape = log_probs.shape
    if log_probs.dim() != 2:
        raise ValueError(f"`log_probs` must have shape [N, T], got {tuple(shape)}")
    _check_2d("old_log_probs", old_log_probs, shape)
    _check_2d("response_mask", response_mask, shape)
    if not (0.0 <= clip_low < 1.0) or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"`dual_clip` must be > 1 (or None to disable), got {dual_clip}")
    adv = _token_advantages(advantages, shape).to(log_probs.dtype)
    w = _weights(importance_weights, shape)
    m = response_mask.to(log_probs.dtype)

    log_ratio = (log_probs - old_log_probs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(pg1, pg2)
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual_active = (adv < 0) & (clipped > cap)
        loss_tok = torch.where(adv < 0, torch.minimum(clipped, cap), clipped)
    else:
        dual_active = torch.zeros_like(adv, dtype=torch.bool)
        loss_tok = clipped
    if w is not None:
        loss_tok = loss_tok * w.to(loss_tok.dtype)
    loss = aggregate_loss(loss_tok, response_mask, agg_mode, global_denominator=global_denominator)

    with torch.no_grad():
        fm = m.detach()
        is_clipped = (pg2 > pg1).to(fm.dtype)
        high = ((adv > 0) & (ratio > 1.0 + clip_high)).to(fm.dtype)
        low = ((adv < 0) & (ratio < 1.0 - clip_low)).to(fm.dtype)
        metrics = {
            "pg_clipfrac": _masked_mean(is_clipped, fm),
            "pg_clipfrac_high": _masked_mean(high, fm),
            "pg_clipfrac_low": _masked_mean(low, fm),
            "pg_dual_clipfrac": _masked_mean(dual_active.to(fm.dtype), fm),
            "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, fm),
            "ppo_kl": _masked_mean(-log_ratio, fm),
            "ratio_mean": _masked_mean(ratio, fm),
            "ratio_max": _masked_max(ratio, fm),
            "ratio_min": _masked_min(ratio, fm),
            "pg_loss_token_mean": _masked_mean(loss_tok, fm),
        }
    return loss, metrics


def gspo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    global_denominator: torch.Tensor | float,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    variant: Literal["sequence", "token"] = "sequence",
    agg_mode: AggMode = "seq-mean-token-mean",
    importance_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Sequence Policy Optimization loss (Zheng et al. 2025, "Group Sequence Policy Optimization").

    Sequence ratio ``s_i = exp(mean_t(log pi - log pi_old))`` over response tokens (eq. 7); loss per
    response ``-min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i)`` (eq. 5), clip range
    ``[1 - 3e-4, 1 + 4e-4]`` by default. Example: token log-ratios [0.01, -0.02, 0.04] give
    ``s = e^0.01 = 1.010050``, clipped to 1.0004.

    ``variant="token"`` is GSPO-token (eq. 13-14): ``s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]``,
    numerically equal to ``s_i`` but with a per-token gradient, so per-token advantages [N, T] are
    allowed; with a per-sequence advantage its gradient equals the sequence variant's.

    The per-response (or per-token) loss is spread over the response tokens and reduced with
    ``agg_mode`` (default "seq-mean-token-mean": the mean over responses). The log ratio is clamped
    to [-20, 20] before ``exp``.

    Args:
        log_probs, old_log_probs: float [N, T]; response_mask: [N, T];
        advantages: float [N] (sequence variant) or [N] / [N, T] (token variant);
        global_denominator: see :func:`aggregate_loss`;
        importance_weights: optional detached [N] or [N, T] multipliers of the per-token loss.

    Returns:
        ``(loss, metrics)``; metrics ``seq_clipfrac`` (fraction of responses whose ratio was clipped,
        over responses with tokens), ``seq_ratio_mean`` / ``seq_ratio_max`` / ``seq_ratio_min``
        (unclipped ``s_i``), ``approx_kl`` and ``ppo_kl`` per token as in :func:`ppo_clip_loss`.

    Raises:
        ValueError: shapes, unknown ``variant`` / ``agg_mode``, per-token advantages with the
            sequence variant, negative clip values.
    """
    shape = log_probs.shape
    if log_probs.dim() != 2:
        raise ValueError(f"`log_probs` must have shape [N, T], got {tuple(shape)}")
    _check_2d("old_log_probs", old_log_probs, shape)
    _check_2d("response_mask", response_mask, shape)
    if variant not in ("sequence", "token"):
        raise ValueError(f"`variant` must be 'sequence' or 'token', got {variant!r}")
    if clip_low < 0 or clip_high < 0 or clip_low >= 1:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    m = response_mask.to(log_probs.dtype)
    lengths = m.sum(dim=1)
    log_ratio_tok = log_probs - old_log_probs
    seq_log_ratio = ((log_ratio_tok * m).sum(dim=1) / lengths.clamp(min=1.0)).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    lo, hi = 1.0 - clip_low, 1.0 + clip_high

    if variant == "sequence":
        if advantages.dim() != 1 or advantages.shape[0] != shape[0]:
            raise ValueError(
                f"sequence-level GSPO needs one advantage per response, shape [{shape[0]}]; got "
                f"{tuple(advantages.shape)} (use variant='token' for per-token advantages)"
            )
        a = advantages.to(log_probs.dtype)
        s = torch.exp(seq_log_ratio)
        loss_seq = torch.maximum(-a * s, -a * s.clamp(lo, hi))
        loss_tok = loss_seq.unsqueeze(1).expand(shape)
    else:
        a = _token_advantages(advantages, shape).to(log_probs.dtype)
        log_s_tok = seq_log_ratio.detach().unsqueeze(1) + log_probs - log_probs.detach()
        s_tok = torch.exp(log_s_tok)
        loss_tok = torch.maximum(-a * s_tok, -a * s_tok.clamp(lo, hi))
    w = _weights(importance_weights, shape)
    if w is not None:
        loss_tok = loss_tok * w.to(loss_tok.dtype)
    loss = aggregate_loss(loss_tok, response_mask, agg_mode, global_denominator=global_denominator)

    with torch.no_grad():
        s_val = torch.exp(seq_log_ratio.detach())
        has = (lengths > 0).to(s_val.dtype)
        outside = ((s_val < lo) | (s_val > hi)).to(s_val.dtype)
        lr = log_ratio_tok.detach().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        metrics = {
            "seq_clipfrac": _masked_mean(outside, has),
            "seq_ratio_mean": _masked_mean(s_val, has),
            "seq_ratio_max": _masked_max(s_val, has),
            "seq_ratio_min": _masked_min(s_val, has),
            "approx_kl": _masked_mean(torch.exp(lr) - 1.0 - lr, m.detach()),
            "ppo_kl": _masked_mean(-lr, m.detach()),
        }
    return loss, metrics


def kl_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    global_denominator: torch.Tensor | float,
    estimator: KLEstimator = "low_var_kl",
    agg_mode: AggMode = "token-mean",
    row_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL(pi || pi_ref) as a loss term (GRPO, Shao et al. 2024, eq. 4), aggregated like the policy loss.

    The caller scales it by the KL coefficient (0.01 in the paper's runs).

    Args:
        log_probs: float [N, T] (with grad); ref_log_probs: float [N, T]; response_mask: [N, T];
        estimator: "k1", "k2" or "low_var_kl" (see :mod:`fastrl.algorithms.kl`).
        row_weights: float [N] or None: each rollout's KL terms are multiplied by its weight before
            the aggregation (the denominator is unchanged); the metric stays unweighted.

    Returns:
        ``(loss, {"kl_token_mean": ...})``.
    """
    _check_2d("ref_log_probs", ref_log_probs, log_probs.shape)
    _check_2d("response_mask", response_mask, log_probs.shape)
    kl = kl_estimate(log_probs, ref_log_probs.detach(), estimator)
    weighted = kl
    if row_weights is not None:
        if row_weights.shape != (log_probs.shape[0],):
            raise ValueError(f"`row_weights` has shape {tuple(row_weights.shape)}, expected ({log_probs.shape[0]},)")
        weighted = kl * row_weights.to(kl.dtype)[:, None]
    loss = aggregate_loss(weighted, response_mask, agg_mode, global_denominator=global_denominator)
    return loss, {"kl_token_mean": _masked_mean(kl.detach(), response_mask.to(kl.dtype))}
