"""The run-directory lock at DP=2 (fastrl/training/run.py::lock_run_dir): global rank 0 alone takes
it, and when it cannot, every rank stops (none goes on into the model build's collectives)."""

from __future__ import annotations

import json
import os
import socket

import pytest
from launcher import run_distributed
from lock_workers import lock_worker

from fastrl.checkpoint.run_lock import LOCK_FILE, _proc_start

pytestmark = pytest.mark.distributed


def test_only_rank_0_locks_and_every_rank_stops_when_it_cannot(tmp_path):
    """catches: the ranks other than 0 not told that rank 0 was refused (they would go on and wait
    in a collective), or every rank trying the lock (rank 1 would name the holder itself). The
    lock's own behaviour is in tests/unit/checkpoint/test_run_lock.py."""
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": "2026-12-07T08:00:00+00:00",
              "proc_start": _proc_start(os.getpid()), "slurm_job_id": None, "token": "first"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(holder))  # this test process holds the directory
    rank0, rank1 = run_distributed(lock_worker, 2, tmp_path)
    assert rank0.startswith(f"refused: run directory {tmp_path} is in use by another trainer: pid {os.getpid()}")
    assert rank1 == f"refused: rank 0 could not lock the run directory {tmp_path} (its log says why)"
