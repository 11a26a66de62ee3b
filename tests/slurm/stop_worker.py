"""A stand-in rank for the stop-signal tests: the trainer's real StopRequest, steps of 0.2 s.

Started by mpirun, srun or torchrun (rank from OMPI_COMM_WORLD_RANK, SLURM_PROCID or RANK). It
installs ``StopRequest(trainer_signals("USR1"))`` (USR1, TERM and INT) as the trainer does, writes ``OUT/progress.rank<R>``
(the last finished step) after each step, and when a stop is requested finishes the step it is in,
"saves" for 2.5 s (writes ``OUT/saved.rank<R>.json`` with the step and the signal) and exits 0.
Ranks do not agree on the step by an all-reduce here (the real trainer does); the tests check
which ranks saved and why, and the real-trainer test checks that they saved the same step.

Usage: python stop_worker.py OUT [MAX_STEPS]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from fastrl.checkpoint.signals import StopRequest, trainer_signals


def main() -> int:
    out = Path(sys.argv[1])
    max_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    rank = next((os.environ[k] for k in ("OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "RANK") if k in os.environ), "0")
    stop = StopRequest(trainer_signals("USR1")).install()
    for step in range(1, max_steps + 1):
        time.sleep(0.2)  # the step's work; a stop during it does not interrupt it
        (out / f"progress.rank{rank}").write_text(str(step))
        if stop.requested:
            time.sleep(2.5)  # the "save": longer than mpirun's 1 s from TERM to KILL, as a real save is
            (out / f"saved.rank{rank}.json").write_text(json.dumps({"step": step, "reason": stop.reason}))
            return 0
    return 3  # never stopped: the test's signal did not arrive


if __name__ == "__main__":
    sys.exit(main())
