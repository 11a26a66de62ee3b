"""Invalid rewards of a run: counted every step, their errors shown once, the run stopped when
grading keeps failing.

A reward is invalid when its grader raised, timed out or crashed (:class:`RewardResult.valid` is
false); it is excluded from the advantages, so a step whose rewards are mostly invalid learns from
little, and one whose rewards are all invalid learns from nothing. :class:`RewardHealth` is fed
the results of every :func:`fastrl.training.scoring.score` call of a step (DAPO rounds included)
and closed with :meth:`RewardHealth.end_step`, which

- returns ``reward/invalid_fraction`` (DP-global) for the step's metrics (the first error
  message of each kind is logged by the scorer, :class:`fastrl.rewards.RewardScorer`, once per
  run, validation included);
- raises :class:`RewardHealthError` (one line, naming the reward and the first error) when more
  than ``reward.max_invalid_fraction`` of the rewards were invalid for ``reward.max_invalid_steps``
  consecutive steps, or when the run's last step ends (with counts that go back to step 1:
  trained in this process, or restored from a checkpoint that saved them) and every step was over
  that fraction or every reward was invalid: a run that learned from nothing never exits 0.

The decision is taken from DP-global counts, so every rank raises at the same step. The counts
(:meth:`RewardHealth.state_dict`) are saved in the checkpoint's ``train_state.pt``, so a resumed
run (the next stage of a Slurm chain) continues the consecutive count and the whole-run check
instead of starting them again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fastrl.config import RewardConfig
from fastrl.rewards import RewardResult

_MAX_ERROR_CHARS = 300


class RewardHealthError(RuntimeError):
    """Grading failed for too many rewards: the run stops (one-line message)."""


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


def _dp_sum(values: torch.Tensor) -> torch.Tensor:
    from fastrl.distributed import collectives

    return collectives.all_reduce_sum_dp(values)


class RewardHealth:
    """Bookkeeping of invalid rewards over a run (module docstring).

    Args:
        reward: the run's ``reward`` section (name, ``max_invalid_fraction``, ``max_invalid_steps``).
        reduce: sums a float64 tensor over the DP ranks (default: the DP all-reduce).
    """

    def __init__(self, reward: RewardConfig, *, reduce: Callable[[torch.Tensor], torch.Tensor] = _dp_sum) -> None:
        self.reward = reward
        self._reduce = reduce
        self._scored = 0
        self._invalid = 0
        self.first_errors: dict[str, str] = {}
        """Kind -> first error text of that kind seen on this rank (in order of appearance)."""
        self.consecutive_bad_steps = 0
        self.first_step: int | None = None
        self.steps = 0
        self.bad_steps = 0
        self.run_scored = 0
        self.run_invalid = 0

    #: The run-level counts a checkpoint saves (the per-step counts are zero at a step boundary).
    _SAVED = ("consecutive_bad_steps", "first_step", "steps", "bad_steps", "run_scored", "run_invalid")

    def state_dict(self) -> dict[str, int | None]:
        """The run-level counts (DP-global, equal on every rank) at a step boundary."""
        return {name: getattr(self, name) for name in self._SAVED}

    def load_state_dict(self, state: dict[str, int | None]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            KeyError: a count is missing from ``state`` (names it).
        """
        missing = [name for name in self._SAVED if name not in state]
        if missing:
            raise KeyError(f"reward health state lacks {', '.join(missing)}; saved keys: {sorted(state)}")
        for name in self._SAVED:
            value = state[name]
            setattr(self, name, None if value is None else int(value))

    def observe(self, results: Sequence[RewardResult]) -> None:
        """Count one batch of grading results of the current step (remembering the first error of
        each kind for the stop message)."""
        self._scored += len(results)
        for r in results:
            kind = r.error_kind
            if kind is None:
                continue
            self._invalid += 1
            self.first_errors.setdefault(kind, _short(r.error or "unknown error"))

    def end_step(self, step: int, *, final: bool = False) -> dict[str, float]:
        """Close step ``step`` (collective over DP): its metrics, or raise when grading keeps failing.

        Args:
            final: this is the run's last step: when the counts cover every step of the run
                (trained here from step 1, or restored with :meth:`load_state_dict`), the
                whole-run check applies.

        Raises:
            RewardHealthError: see the module docstring.
        """
        counts = self._reduce(torch.tensor([float(self._scored), float(self._invalid)], dtype=torch.float64))
        scored, invalid = int(counts[0]), int(counts[1])
        self._scored = self._invalid = 0
        fraction = invalid / scored if scored else 0.0
        self.steps += 1
        if self.first_step is None:
            self.first_step = step
        self.run_scored += scored
        self.run_invalid += invalid
        limit = self.reward.max_invalid_fraction
        if fraction > limit:
            self.consecutive_bad_steps += 1
            self.bad_steps += 1
        else:
            self.consecutive_bad_steps = 0
        what = f"step {step}: {invalid} of {scored} rewards invalid"
        if self.consecutive_bad_steps >= self.reward.max_invalid_steps:
            raise RewardHealthError(
                f"{self._subject()} {self.consecutive_bad_steps} consecutive steps had more than "
                f"reward.max_invalid_fraction={limit:g} of their rewards invalid ({what}); "
                f"{self._first_error()}; fix the reward, or raise reward.max_invalid_fraction / "
                f"reward.max_invalid_steps"
            )
        whole_run = final and self.first_step == 1 and self.run_scored > 0
        if whole_run and (self.bad_steps == self.steps or self.run_invalid == self.run_scored):
            raise RewardHealthError(
                f"{self._subject()} the run ends having learned from almost nothing: "
                + (f"all {self.run_invalid} rewards of its {self.steps} step(s) were invalid"
                   if self.run_invalid == self.run_scored
                   else f"each of its {self.steps} step(s) had more than reward.max_invalid_fraction={limit:g} "
                        f"of its rewards invalid ({what})")
                + f"; {self._first_error()}"
            )
        return {"reward/invalid_fraction": fraction}

    def _subject(self) -> str:
        return f"reward {self.reward.name!r}:"

    def _first_error(self) -> str:
        if not self.first_errors:
            return "first error: none seen on this rank (see the other ranks' logs)"
        kind, text = next(iter(self.first_errors.items()))
        others = [k for k in self.first_errors if k != kind]
        more = f" (other kinds: {', '.join(others)})" if others else ""
        return f"first error: {text}{more}"
