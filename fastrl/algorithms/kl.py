"""Per-token estimators of KL(pi || pi_ref) from log-probabilities of the sampled tokens.

With ``x = log pi_ref(y_t) - log pi(y_t)`` for tokens sampled from ``pi`` (J. Schulman, "Approximating
KL Divergence", 2020):

- ``k1 = -x = log pi - log pi_ref`` (unbiased, high variance, can be negative),
- ``k2 = x^2 / 2`` (biased, low variance),
- ``low_var_kl`` (k3) ``= exp(x) - x - 1`` (unbiased, always >= 0). As in the reference code
  (EasyR1/verl), ``x`` is clamped to [-20, 20] and the result to [-10, 10] for numerical safety.

All functions take float tensors of any (equal) shape and return a tensor of that shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

__all__ = ["k1", "k2", "low_var_kl", "kl_estimate", "KL_ESTIMATORS", "KLEstimator"]

KLEstimator = Literal["k1", "k2", "low_var_kl"]


def _check(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> None:
    if log_probs.shape != ref_log_probs.shape:
        raise ValueError(
            f"`log_probs` shape {tuple(log_probs.shape)} differs from `ref_log_probs` shape "
            f"{tuple(ref_log_probs.shape)}"
        )


def k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``log pi - log pi_ref`` per token (Schulman 2020, k1)."""
    _check(log_probs, ref_log_probs)
    return log_probs - ref_log_probs


def k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``0.5 * (log pi - log pi_ref)^2`` per token (Schulman 2020, k2)."""
    _check(log_probs, ref_log_probs)
    d = log_probs - ref_log_probs
    return 0.5 * d * d


def low_var_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3: ``exp(x) - x - 1`` with ``x = clamp(log pi_ref - log pi, -20, 20)``, result clamped to [-10, 10].

    (Schulman 2020, k3; clamps as in EasyR1/verl ``core_algos.compute_kl`` "low_var_kl".)
    Example: ``log pi = -1.0, log pi_ref = -0.9`` gives ``e^0.1 - 1.1 = 0.0051709``.
    """
    _check(log_probs, ref_log_probs)
    x = (ref_log_probs - log_probs).clamp(-20.0, 20.0)
    return (torch.exp(x) - x - 1.0).clamp(-10.0, 10.0)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": k1,
    "k2": k2,
    "low_var_kl": low_var_kl,
}


def kl_estimate(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Dispatch to one of :data:`KL_ESTIMATORS` by name.

    Raises:
        ValueError: unknown ``estimator``, or shapes differ.
    """
    try:
        fn = KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {sorted(KL_ESTIMATORS)}") from None
    return fn(log_probs, ref_log_probs)
