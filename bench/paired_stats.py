"""Paired statistics for two policies evaluated on the same questions: McNemar's exact test, a
seed x question bootstrap, Holm's step-down correction, and the power arithmetic that sizes a
comparison (seeds needed to see a difference).

Inputs are per-question outcomes (``1`` correct, ``0`` not), as the trainer writes them for every
evaluation (``<run dir>/evaluations/<split>_step<N>.jsonl``, ``fastrl/training/validation.py``),
one list per seed in question order, the same questions for both policies. Accuracies and
differences are fractions (0.03 = 3 points).
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.heldout import _T975  # noqa: E402

#: two-sided 5% and 80% power normal quantiles
Z975 = 1.959963984540054
Z80 = 0.8416212335729143


def discordant(a: Sequence[int], b: Sequence[int]) -> tuple[int, int]:
    """``(n10, n01)``: questions ``a`` answered right and ``b`` wrong, and the reverse.

    Raises:
        ValueError: the two lists differ in length, or hold a value other than 0 / 1.
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes of unequal length: {len(a)} and {len(b)} questions")
    if any(x not in (0, 1) for x in (*a, *b)):
        raise ValueError("paired outcomes must be 0 or 1 per question")
    return sum(1 for x, y in zip(a, b) if x > y), sum(1 for x, y in zip(a, b) if x < y)


def mcnemar_exact(n10: int, n01: int) -> float:
    """Two-sided exact McNemar p-value for ``n10`` / ``n01`` discordant questions: under the null
    each discordant question goes either way with probability 1/2, so ``p = min(1, 2 P[X <= min])``
    with ``X ~ Binomial(n10 + n01, 1/2)`` (1.0 without discordant questions)."""
    n, k = n10 + n01, min(n10, n01)
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n)


def _check_matrix(diffs: Sequence[Sequence[float]]) -> None:
    if not diffs or not diffs[0]:
        raise ValueError("need at least one seed and one question")
    if len({len(row) for row in diffs}) != 1:
        raise ValueError(f"every seed needs the same questions, got {[len(row) for row in diffs]} per seed")


def seed_question_bootstrap(
    diffs: Sequence[Sequence[float]], *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float, float]:
    """Mean paired difference over seeds and questions, with a 95% percentile interval and a
    two-sided p-value from a two-way bootstrap: each resample draws the seeds with replacement and,
    independently, the questions with replacement (the same questions for every drawn seed), so
    both sources of noise -- training randomness and the question sample -- are in the interval.

    Args:
        diffs: ``diffs[s][q]``, the difference of the two policies on question ``q`` at seed ``s``
            (``a - b`` of 0/1 outcomes: -1, 0 or 1).
        resamples: bootstrap resamples; seed: the resampling generator's seed (deterministic).

    Returns:
        ``(mean, lo, hi, p)``: ``p = min(1, 2 min(P*(d <= 0), P*(d >= 0)))`` over the resamples.

    Raises:
        ValueError: no seed or question, or seeds with different question counts.
    """
    _check_matrix(diffs)
    rng = random.Random(seed)
    n_s, n_q = len(diffs), len(diffs[0])
    mean = statistics.fmean(x for row in diffs for x in row)
    stats = []
    for _ in range(resamples):
        seeds = [rng.randrange(n_s) for _ in range(n_s)]
        questions = [rng.randrange(n_q) for _ in range(n_q)]
        stats.append(sum(diffs[s][q] for s in seeds for q in questions) / (n_s * n_q))
    stats.sort()
    lo, hi = stats[int(0.025 * (resamples - 1))], stats[math.ceil(0.975 * (resamples - 1))]
    p = min(1.0, 2.0 * min(sum(x <= 0 for x in stats), sum(x >= 0 for x in stats)) / resamples)
    return mean, lo, hi, p


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (family-wise error over the family ``pvalues``): sorted
    ascending, the i-th (from 0) of m is multiplied by ``m - i``, made non-decreasing, capped at 1.
    Holm, Scand. J. Statist. 6 (1979) 65-70."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, running, out = len(order), 0.0, {}
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[key]))
        out[key] = running
    return out


def question_sd(p: float, questions: int, rho: float = 0.0) -> float:
    """Standard deviation of the accuracy difference of two policies that each answer a share
    ``p`` of ``questions`` questions, from the question sample alone, when their per-question
    outcomes correlate with ``rho``: ``sqrt(2 p (1 - p) (1 - rho) / questions)``."""
    return math.sqrt(2.0 * p * (1.0 - p) * (1.0 - rho) / questions)


def seeds_for_power(sd: float, delta: float, *, power_z: float = Z80, max_seeds: int = 1000) -> int:
    """Seeds needed for a paired t-test at two-sided 5% to detect a mean difference ``delta`` with
    80% power (``power_z``), when one seed's difference has standard deviation ``sd``: the smallest
    n >= 2 with ``(t_{0.975, n-1} + z_power) sd / sqrt(n) <= delta`` (the normal approximation of
    the t-test's power, with the t quantile for the interval; ``max_seeds`` + 1 when none is).

    With the z quantile for both terms and n the sample size of a half-width ``delta`` interval
    (``(1.96 sd / delta)^2``) one gets a number about half as large: that interval's half-width,
    not power (a true difference of ``delta`` would then be seen half of the time)."""
    for n in range(2, max_seeds + 1):
        if (_t975(n - 1) + power_z) * sd / math.sqrt(n) <= delta:
            return n
    return max_seeds + 1


def seeds_for_half_width(sd: float, half_width: float, max_seeds: int = 1000) -> int:
    """Seeds for a 95% t interval of half-width ``half_width`` (no power: see :func:`seeds_for_power`)."""
    for n in range(2, max_seeds + 1):
        if _t975(n - 1) * sd / math.sqrt(n) <= half_width:
            return n
    return max_seeds + 1


def _t975(df: int) -> float:
    """Two-sided 95% Student t quantile: the table of :data:`bench.heldout._T975` for df <= 30, the
    Cornish-Fisher expansion around the normal quantile beyond (within 0.001 of the exact value)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3
