"""The result of grading one response: :class:`RewardResult`."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

NAN = math.nan
_EXCEPTION_PREFIX = re.compile(r"^([A-Za-z_][\w.]*):")


@dataclass(frozen=True)
class RewardResult:
    """Reward of one response.

    Fields (floats are Python floats, unitless):
        overall: the scalar reward used for advantages (e.g. ``accuracy + format`` for ``geo3k``).
        format: the format part of the reward (``0.5`` or ``0.0`` for the built-in rewards).
        accuracy: answer correctness in ``[0, 1]``; DAPO dynamic sampling and accuracy metrics use
            this field, never ``overall`` (spec section 4).
        valid: ``False`` when the grader raised or timed out. Invalid results carry ``nan`` in the
            three float fields so that a consumer that forgets to mask them fails loudly instead of
            scoring them as wrong; they must be excluded from advantage statistics (spec section 5).
        error: why the result is invalid (exception type and message, or ``"timeout after 10s"``).
        timed_out: the grader exceeded its time limit (a subset of ``valid=False``).
    """

    overall: float
    format: float
    accuracy: float
    valid: bool = True
    error: str | None = None
    timed_out: bool = False

    @property
    def error_kind(self) -> str | None:
        """What kind of failure made this result invalid (None for a valid one): ``"timeout"``, the
        exception type (``"ValueError"``), or the error text up to its first parenthesis
        (``"grading worker process exited"``)."""
        if self.valid:
            return None
        if self.timed_out:
            return "timeout"
        text = (self.error or "unknown error").strip()
        match = _EXCEPTION_PREFIX.match(text)
        return match.group(1) if match else text.split(" (")[0][:80]

    @classmethod
    def invalid(cls, error: str, *, timed_out: bool = False) -> "RewardResult":
        """An invalid result (grader exception or timeout) with ``nan`` scores."""
        return cls(overall=NAN, format=NAN, accuracy=NAN, valid=False, error=error, timed_out=timed_out)
