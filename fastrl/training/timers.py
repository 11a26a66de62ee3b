"""Wall-clock time per phase of a training step (gen, reward, prune, old, ref, update, refit, save)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator


class PhaseTimer:
    """Accumulates seconds per named phase; :meth:`pop` returns and resets them.

    Args:
        sync: called before reading the clock (e.g. ``torch.cuda.synchronize`` on GPUs so
            asynchronous kernels are charged to the right phase); None on CPU.
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self._sync = sync
        self._totals: dict[str, float] = {}

    @classmethod
    def for_device(cls, device: Any) -> "PhaseTimer":
        """The timer of a rank on ``device``: on a GPU it waits for the device
        (``torch.cuda.synchronize``) before each reading of the clock, so that queued kernels are
        charged to the phase that launched them; on the CPU it never waits."""
        import torch

        if torch.device(device).type != "cuda":
            return cls()
        return cls(sync=lambda: torch.cuda.synchronize(device))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self._sync:
            self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self._sync:
                self._sync()
            self._totals[name] = self._totals.get(name, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        """Seconds per phase since the last pop, plus ``step`` = their sum."""
        totals, self._totals = self._totals, {}
        totals["step"] = sum(totals.values())
        return totals
