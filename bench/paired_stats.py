"""Paired statistics for two policies evaluated on the same questions: McNemar's exact test, a
seed x question bootstrap, Holm's step-down correction, and the power arithmetic that sizes a
comparison (seeds needed to see a difference).

Inputs are per-question outcomes (``1`` correct, ``0`` not), as the trainer writes them for every
evaluation (``<run dir>/evaluations/<split>_step<N>.jsonl``, ``fastrl/training/validation.py``),
one list per seed in question order, the same questions for both policies. Accuracies and
differences are fractions (0.03 = 3 points).
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Mapping, Sequence

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


@functools.lru_cache(maxsize=None)
def _t975(df: int) -> float:
    """Two-sided 95% Student t quantile (:func:`t_quantile`)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return t_quantile(0.975, df)


def t_cdf(t: float, df: float) -> float:
    """Student t distribution function, ``P[T <= t]`` with ``df`` degrees of freedom, from the
    regularized incomplete beta function: ``P[|T| > |t|] = I_{df / (df + t^2)}(df / 2, 1 / 2)``."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`).

    Raises:
        ValueError: ``q`` outside (0, 1)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {q}")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return 0.5 * (lo + hi)


def one_sample_t(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float, float, float]:
    """Mean of ``values`` (per-seed differences or log ratios), its two-sided Student t interval at
    ``level`` and the two-sided p-value of mean 0: ``(mean, lo, hi, p)`` (NaN but the mean with
    fewer than two values; p 1.0 and a zero-width interval when they are all equal)."""
    if not values:
        return math.nan, math.nan, math.nan, math.nan
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan, math.nan
    df = len(values) - 1
    se = statistics.stdev(values) / math.sqrt(len(values))
    if se == 0.0:
        return mean, mean, mean, 1.0 if mean == 0.0 else 0.0
    half = t_quantile(0.5 + level / 2.0, df) * se
    return mean, mean - half, mean + half, 2.0 * (1.0 - t_cdf(abs(mean) / se, df))


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)`` (continued fraction, Numerical Recipes 6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300

    def guard(v: float) -> float:
        return v if abs(v) > tiny else tiny

    c, d = 1.0, 1.0 / guard(1.0 - (a + b) * x / (a + 1.0))
    h = d
    for m in range(1, 500):
        aa = m * (b - m) * x / ((a - 1.0 + 2 * m) * (a + 2 * m))
        d, c = 1.0 / guard(1.0 + aa * d), guard(1.0 + aa / c)
        h *= d * c
        aa = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1.0 + 2 * m))
        d, c = 1.0 / guard(1.0 + aa * d), guard(1.0 + aa / c)
        h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h
