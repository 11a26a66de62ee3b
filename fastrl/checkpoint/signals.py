"""Save-and-exit on a signal: the handler only records the request; the trainer acts on it.

Slurm announces the end of a job's time (``sbatch --signal=B:USR1@<grace>``, forwarded to the
tasks by slurm/train.sbatch), a preemption (``SIGTERM``, then ``SIGKILL`` after ``KillWait``) or a
manual ``scancel --signal=USR1``. A Python signal handler runs between bytecodes of the main thread,
so doing real work there (collectives, checkpoint writes) would interleave with whatever the step
was doing. :class:`StopRequest` therefore only sets a flag; the trainer polls
:attr:`StopRequest.requested` before every step and before every chunk of a validation, finishes
the step in flight (abandons a validation in flight), saves a complete checkpoint (unless no step
was trained since the last one) and exits 0 (docs/slurm.md, contract item 3).

SIGINT (Ctrl-C on a terminal, ``python -m fastrl.train`` or ``make run``) asks for the same stop
when it is among the signals (the trainer installs USR1, TERM and INT); a second SIGINT raises
:class:`KeyboardInterrupt` in the main thread, as Python's default handler does: the process exits
at once, without a checkpoint.

All ranks must agree on stopping at the same step (a rank that leaves early would hang the others
in a collective): the trainer reduces :meth:`StopRequest.as_int` with a MAX all-reduce over the
world group before acting on it.

Usage::

    stop = StopRequest(("USR1", "TERM")).install()
    for step in ...:
        train_step()
        if stop.requested:          # or any-rank agreement, see above
            save_checkpoint(); break
    stop.uninstall()
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType
from typing import Callable, Iterable

SignalName = str
#: Written to stderr on the first SIGINT (``notify``): the interactive stop and how to skip the save.
_INT_NOTICE = (
    b"fastrl.train: stop requested (SIGINT): the step in flight finishes, the run saves a checkpoint (unless "
    b"nothing was trained since the last one) and exits 0; press Ctrl-C again to exit at once without saving\n"
)
_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


def parse_signal(name: SignalName | int | signal.Signals) -> signal.Signals:
    """``"USR1"``, ``"SIGUSR1"``, ``10`` or ``signal.SIGUSR1`` -> ``signal.SIGUSR1``.

    Raises:
        ValueError: not a signal of this platform.
    """
    if isinstance(name, signal.Signals):
        return name
    if isinstance(name, int):
        return signal.Signals(name)
    key = name.strip().upper()
    key = key if key.startswith("SIG") else f"SIG{key}"
    try:
        return signal.Signals[key]
    except KeyError:
        raise ValueError(f"unknown signal {name!r}; use a name such as USR1 or TERM") from None


def trainer_signals(exit_signal: SignalName | int | signal.Signals) -> tuple[SignalName | int | signal.Signals, ...]:
    """The signals the trainer treats as a stop request: ``stage.exit_signal``, TERM (Slurm's
    preemption, ``scancel``) and INT (Ctrl-C on a terminal)."""
    return (exit_signal, "TERM", "INT")


class StopRequest:
    """Records the first of ``signals`` received after :meth:`install`; never raises in the handler.

    Args:
        signals: names or numbers of the signals that ask for save-and-exit (default USR1 and TERM,
            matching ``stage.exit_signal`` and Slurm's preemption signal). With INT among them, a
            second INT raises :class:`KeyboardInterrupt` (exit at once).
        notify: on the first INT, write one line to stderr saying what happens next (the process
            that talks to the terminal: the trainer's global rank 0).

    Raises:
        ValueError: an unknown signal name.
        RuntimeError: :meth:`install` outside the main thread (Python only delivers signals there).
    """

    def __init__(self, signals: Iterable[SignalName | int | signal.Signals] = ("USR1", "TERM"), *, notify: bool = False) -> None:
        self.signals: tuple[signal.Signals, ...] = tuple(dict.fromkeys(parse_signal(s) for s in signals))
        if not self.signals:
            raise ValueError("StopRequest needs at least one signal")
        self._reason: str | None = None
        self._received_at: float | None = None
        self._count = 0
        self._interrupts = 0
        self.notify = notify
        self._previous: dict[signal.Signals, _Handler] = {}

    # ---- installation -----------------------------------------------------------------------

    def install(self) -> "StopRequest":
        """Install the handlers (remembering the previous ones); returns ``self``."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("StopRequest.install() must run in the main thread (Python delivers signals there)")
        for sig in self.signals:
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were installed before :meth:`install`."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> "StopRequest":
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._count += 1
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:  # a second Ctrl-C: stop now, as Python's default handler would
                raise KeyboardInterrupt
            if self.notify:
                try:
                    os.write(2, _INT_NOTICE)
                except OSError:  # no stderr: the loop's "stop requested" line still follows
                    pass
        if self._reason is None:
            self._reason = signal.Signals(signum).name
            self._received_at = time.time()

    # ---- queries ----------------------------------------------------------------------------

    @property
    def requested(self) -> bool:
        """True once a stop was asked for, by one of the signals or :meth:`request` (stays true)."""
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """What asked first: a signal name (``"SIGUSR1"``), the text given to :meth:`request`, or None."""
        return self._reason

    @property
    def received_at(self) -> float | None:
        """Unix time (seconds) of the first stop request, or None."""
        return self._received_at

    @property
    def signal_count(self) -> int:
        """How many of the signals arrived (later ones do not change :attr:`reason`)."""
        return self._count

    def as_int(self) -> int:
        """1 when requested, else 0: the value ranks reduce with MAX to agree on stopping."""
        return int(self.requested)

    def request(self, reason: str) -> None:
        """Ask for a stop without a signal, e.g. ``request("stage time budget")``."""
        if self._reason is None:
            self._reason = reason
            self._received_at = time.time()
