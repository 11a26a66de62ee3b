"""Truncated importance sampling (TIS) for the rollout-engine / trainer log-prob mismatch.

The rollout engine (vLLM, bf16/FP8 kernels) and the trainer compute slightly different
probabilities for the same policy, so the "on-policy" samples are in fact drawn from
``pi_engine``. The correction multiplies the policy-gradient loss of each token by

    w = min(pi_trainer_old(y) / pi_engine(y), cap)

(Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
truncated IS; Ionides 2008 for truncation). ``level="sequence"`` uses one weight per response,
the product of the token ratios ``exp(sum_t (log pi_trainer - log pi_engine))``, truncated at ``cap``.
The weights carry no gradient.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

__all__ = ["truncated_importance_weights"]


def truncated_importance_weights(
    trainer_log_probs: torch.Tensor,
    engine_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    level: Literal["token", "sequence"] = "token",
    cap: float = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance weights ``min(pi_trainer / pi_engine, cap)`` and mismatch metrics.

    Args:
        trainer_log_probs: float [N, T], log-probs of the sampled tokens under the trainer's copy
            of the rollout policy (the "old" log-probs).
        engine_log_probs: float [N, T], the same log-probs as reported by the rollout engine.
        response_mask: [N, T], 1/True on response tokens.
        level: "token" (one weight per token) or "sequence" (one weight per response, broadcast
            over its tokens).
        cap: truncation level C > 0 (Yao et al. use 2).

    Returns:
        ``(weights, metrics)``. ``weights``: float [N, T] (dtype of ``trainer_log_probs``), detached,
        0 on padding. ``metrics`` (detached 0-dim tensors over the local batch):
        ``is/mean_abs_logp_diff`` (mean over response tokens of ``|logp_engine - logp_trainer|``),
        ``is/max_abs_logp_diff``, ``is/frac_capped`` (fraction of tokens, or of sequences at
        sequence level, whose weight was truncated), ``is/weight_mean``, ``is/weight_max``.

    Raises:
        ValueError: shapes differ, unknown ``level``, ``cap`` not positive.
    """
    if trainer_log_probs.shape != engine_log_probs.shape or trainer_log_probs.shape != response_mask.shape:
        raise ValueError(
            "trainer_log_probs, engine_log_probs and response_mask must have one shape [N, T]; got "
            f"{tuple(trainer_log_probs.shape)}, {tuple(engine_log_probs.shape)}, {tuple(response_mask.shape)}"
        )
    if trainer_log_probs.dim() != 2:
        raise ValueError(f"log-probs must have shape [N, T], got {tuple(trainer_log_probs.shape)}")
    if level not in ("token", "sequence"):
        raise ValueError(f"`level` must be 'token' or 'sequence', got {level!r}")
    if not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > 0):
        raise ValueError(f"`cap` must be a positive finite number, got {cap!r}")

    with torch.no_grad():
        m = response_mask.to(torch.float64)
        diff = (trainer_log_probs.detach().to(torch.float64) - engine_log_probs.detach().to(torch.float64)) * m
        log_cap = math.log(cap)
        n_tok = m.sum().clamp(min=1.0)
        if level == "token":
            capped = (diff > log_cap) & (m > 0)
            w = torch.where(capped, torch.full_like(diff, cap), torch.exp(diff.clamp(max=log_cap)))
            frac_capped = capped.to(torch.float64).sum() / n_tok
        else:
            seq = diff.sum(dim=1)
            has_tokens = m.sum(dim=1) > 0
            capped_seq = (seq > log_cap) & has_tokens
            w_seq = torch.where(capped_seq, torch.full_like(seq, cap), torch.exp(seq.clamp(max=log_cap)))
            w = w_seq.unsqueeze(1).expand_as(diff)
            frac_capped = capped_seq.to(torch.float64).sum() / has_tokens.to(torch.float64).sum().clamp(min=1.0)
        w = w * m
        absdiff = diff.abs()
        any_token = bool((m > 0).any())
        zero = torch.zeros((), dtype=torch.float64)
        metrics = {
            "is/mean_abs_logp_diff": absdiff.sum() / n_tok,
            "is/max_abs_logp_diff": absdiff.max() if any_token else zero,
            "is/frac_capped": frac_capped,
            "is/weight_mean": w.sum() / n_tok,
            "is/weight_max": w[m > 0].max() if any_token else zero,
        }
        metrics = {k: v.to(torch.float32) for k, v in metrics.items()}
        return w.to(trainer_log_probs.dtype), metrics
