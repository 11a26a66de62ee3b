"""Adaptive rollout sampling (ARS): choose the group size ``n`` from how many rollouts MDAP keeps.

Spec section 3 (FastRL paper, section 3.3). Per step the sampler records, after pruning,
``f1 = mean_g kept[g]`` and ``f2 = max_g kept[g]``. At a period boundary with training progress
``alpha = global_step / total_steps``:

    f3 = alpha * mean(f1) + (1 - alpha) * mean(f2)
    g1 = (mean(f1) + mean(f2)) / 2                      (first boundary only)
    n  = clamp(round_half_even(n_max - (g1 - f3)), n_min, n_max)   if f3 < g1
    n  = n_max                                                      otherwise

The whole state (including the values recorded in an unfinished period) is in
:meth:`AdaptiveRolloutSampler.state_dict`, so a run restored mid-period takes exactly the
decisions of an uninterrupted one. Decisions are logged on the ``fastrl.algorithms.adaptive_sampling``
logger at INFO level.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["AdaptiveRolloutSampler"]

logger = logging.getLogger(__name__)

_STATE_VERSION = 1


class AdaptiveRolloutSampler:
    """Group-size controller of FastRL's adaptive rollout sampling.

    Args:
        n_max: configured group size (responses per prompt), the starting and maximal ``n``.
        n_min: smallest ``n`` (a group needs two members for a relative advantage).

    Raises:
        ValueError: ``n_min < 2`` or ``n_max < n_min``.
    """

    def __init__(self, n_max: int, n_min: int = 2):
        for name, value in (("n_max", n_max), ("n_min", n_min)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"`{name}` must be an integer, got {value!r}")
        if n_min < 2:
            raise ValueError(f"`n_min` must be >= 2 (a group needs two members), got {n_min}")
        if n_max < n_min:
            raise ValueError(f"`n_max` ({n_max}) must be >= `n_min` ({n_min})")
        self.n_max = n_max
        self.n_min = n_min
        self._n = n_max
        self._g1: float | None = None
        self._f3: float | None = None
        self._f1: list[float] = []
        self._f2: list[float] = []
        self._num_boundaries = 0
        self._last_decision: dict[str, float] = {}

    @property
    def n(self) -> int:
        """Group size to use for the next rollout."""
        return self._n

    @property
    def g1(self) -> float | None:
        """Reference level set at the first boundary (None before it)."""
        return self._g1

    @property
    def f3(self) -> float | None:
        """Last computed ``f3`` (None before the first boundary)."""
        return self._f3

    @property
    def num_recorded(self) -> int:
        """Steps recorded in the current (unfinished) period."""
        return len(self._f1)

    @property
    def last_decision(self) -> dict[str, float]:
        """Values of the last boundary (empty before the first): ``alpha, f1_mean, f2_mean, f3, g1, n_before, n``."""
        return dict(self._last_decision)

    def record(self, kept_per_group: Sequence[int]) -> tuple[float, float]:
        """Record one step's final kept count per group (after Phase 2 refill); returns ``(f1, f2)``.

        Raises:
            ValueError: empty sequence, or a count that is not an integer >= 0.
        """
        counts = list(kept_per_group.values()) if isinstance(kept_per_group, dict) else list(kept_per_group)
        if not counts:
            raise ValueError("`kept_per_group` is empty: record the kept count of every group of the step")
        for i, c in enumerate(counts):
            if isinstance(c, bool) or not float(c).is_integer() or c < 0:
                raise ValueError(f"`kept_per_group[{i}]` is {c!r}; kept counts are integers >= 0")
        f1 = float(sum(int(c) for c in counts)) / len(counts)
        f2 = float(max(int(c) for c in counts))
        self._f1.append(f1)
        self._f2.append(f2)
        return f1, f2

    def end_period(self, progress: float) -> int:
        """Close the current period and decide the group size for the next one.

        Args:
            progress: ``alpha = global_step / total_steps`` at the boundary, in [0, 1].

        Returns:
            The new ``n`` (also available as :attr:`n`).

        Raises:
            ValueError: ``progress`` outside [0, 1] or not finite; no step recorded in the period.
        """
        alpha = float(progress)
        if not math.isfinite(alpha) or not 0.0 <= alpha <= 1.0:
            raise ValueError(f"`progress` must be global_step / total_steps in [0, 1], got {progress!r}")
        if not self._f1:
            raise ValueError(
                "end_period() called with no step recorded in the period; call record() after every "
                "pruned step (the kept counts of MDAP's PruneResult.kept_per_group)"
            )
        f1_mean = sum(self._f1) / len(self._f1)
        f2_mean = sum(self._f2) / len(self._f2)
        f3 = alpha * f1_mean + (1.0 - alpha) * f2_mean
        if self._g1 is None:
            self._g1 = (f1_mean + f2_mean) / 2.0
        n_before = self._n
        if f3 < self._g1:
            n_new = round(self.n_max - (self._g1 - f3))
            n_new = max(self.n_min, min(self.n_max, n_new))
        else:
            n_new = self.n_max
        self._f3 = f3
        self._n = int(n_new)
        self._f1.clear()
        self._f2.clear()
        self._num_boundaries += 1
        self._last_decision = {
            "alpha": alpha,
            "f1_mean": f1_mean,
            "f2_mean": f2_mean,
            "f3": f3,
            "g1": self._g1,
            "n_before": float(n_before),
            "n": float(self._n),
        }
        logger.info(
            "adaptive rollout sampling, boundary %d: alpha=%.4f f1_mean=%.4f f2_mean=%.4f f3=%.4f g1=%.4f "
            "-> n %d -> %d",
            self._num_boundaries,
            alpha,
            f1_mean,
            f2_mean,
            f3,
            self._g1,
            n_before,
            self._n,
        )
        return self._n

    def state_dict(self) -> dict[str, Any]:
        """The complete state as plain Python values (JSON-serializable)."""
        return {
            "version": _STATE_VERSION,
            "n_max": self.n_max,
            "n_min": self.n_min,
            "n": self._n,
            "g1": self._g1,
            "f3": self._f3,
            "f1_recorded": list(self._f1),
            "f2_recorded": list(self._f2),
            "num_boundaries": self._num_boundaries,
            "last_decision": dict(self._last_decision),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Raises:
            ValueError: missing keys, unknown version, or ``n_max`` / ``n_min`` differ from this
                sampler's (the configured group size changed between runs).
        """
        required = ("version", "n_max", "n_min", "n", "g1", "f3", "f1_recorded", "f2_recorded", "num_boundaries")
        missing = [k for k in required if k not in state]
        if missing:
            raise ValueError(f"adaptive sampler state is missing keys {missing}")
        if state["version"] != _STATE_VERSION:
            raise ValueError(f"adaptive sampler state version {state['version']!r} is not {_STATE_VERSION}")
        if state["n_max"] != self.n_max or state["n_min"] != self.n_min:
            raise ValueError(
                f"checkpointed sampler has n_max={state['n_max']}, n_min={state['n_min']} but this run has "
                f"n_max={self.n_max}, n_min={self.n_min}; keep the group size of the run you resume"
            )
        if len(state["f1_recorded"]) != len(state["f2_recorded"]):
            raise ValueError("adaptive sampler state has different numbers of recorded f1 and f2 values")
        self._n = int(state["n"])
        self._g1 = None if state["g1"] is None else float(state["g1"])
        self._f3 = None if state["f3"] is None else float(state["f3"])
        self._f1 = [float(x) for x in state["f1_recorded"]]
        self._f2 = [float(x) for x in state["f2_recorded"]]
        self._num_boundaries = int(state["num_boundaries"])
        self._last_decision = dict(state.get("last_decision", {}))

    @staticmethod
    def prompts_for_constant_budget(prompts_per_step: int, n_max: int, n: int) -> int:
        """Prompts per step that keep the rollout budget ``prompts_per_step * n_max`` when the group
        size is ``n`` (an option beyond the paper, off by default): ``ceil(prompts * n_max / n)``."""
        if n <= 0 or prompts_per_step <= 0 or n_max <= 0:
            raise ValueError(f"need positive prompts_per_step, n_max, n; got {prompts_per_step}, {n_max}, {n}")
        return -(-prompts_per_step * n_max // n)
