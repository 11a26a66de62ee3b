"""The run-directory lock (fastrl/checkpoint/run_lock.py) and the trainer's use of it
(fastrl/training/run.py::lock_run_dir): one trainer per run directory, stale locks taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from fastrl.checkpoint import run_lock
from fastrl.checkpoint.run_lock import LOCK_FILE, RunDirLock, RunDirLocked, read_holder


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_lock(run_dir, **fields) -> None:
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": "2026-01-01T00:00:00+00:00",
              "proc_start": None, "slurm_job_id": None, "token": "other", **fields}
    (run_dir / LOCK_FILE).write_text(json.dumps(holder))


def test_a_second_trainer_is_refused_naming_the_holder_and_release_frees_it(tmp_path):
    """catches: a lock file created without O_EXCL (the second open succeeds), a live holder judged stale."""
    first = RunDirLock(tmp_path).acquire()
    holder = read_holder(tmp_path / LOCK_FILE)
    assert holder is not None and holder.pid == os.getpid() and holder.host == socket.gethostname()
    with pytest.raises(RunDirLocked) as refused:
        RunDirLock(tmp_path).acquire()
    message = str(refused.value)
    assert "\n" not in message and "in use by another trainer" in message
    assert f"pid {os.getpid()} on host {socket.gethostname()}, started {holder.started_at}" in message
    first.release()
    assert not (tmp_path / LOCK_FILE).exists()
    RunDirLock(tmp_path).acquire().release()  # free again


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path, caplog):
    """catches: process_alive ignoring a ProcessLookupError (every lock looks live: a killed run blocks the next)."""
    dead = _dead_pid()
    _write_lock(tmp_path, pid=dead)
    with caplog.at_level("WARNING", logger="fastrl.checkpoint"):
        lock = RunDirLock(tmp_path).acquire()
    assert read_holder(tmp_path / LOCK_FILE).pid == os.getpid()
    assert f"removed the stale lock {tmp_path / LOCK_FILE} of pid {dead}" in caplog.text
    lock.release()


def test_a_reused_pid_is_told_from_the_holder_by_its_start_time(tmp_path):
    """catches: liveness by pid alone (a container restart reuses the dead trainer's pid)."""
    if run_lock._proc_start(os.getpid()) is None:
        pytest.skip("no /proc on this machine")
    _write_lock(tmp_path, proc_start="1")  # this pid, but a process that started at another time
    RunDirLock(tmp_path).acquire().release()


def test_a_lock_of_another_host_is_refused_with_the_file_to_remove(tmp_path):
    """catches: a foreign host's lock judged by a local pid check (taken over while that trainer runs)."""
    _write_lock(tmp_path, pid=_dead_pid(), host="other-node-17", slurm_job_id="4242")
    with pytest.raises(RunDirLocked) as refused:
        RunDirLock(tmp_path).acquire()
    message = str(refused.value)
    assert "on host other-node-17" in message and "Slurm job 4242" in message
    assert f"rm {tmp_path / LOCK_FILE}" in message
    assert read_holder(tmp_path / LOCK_FILE).host == "other-node-17"  # left in place


def test_a_lock_of_an_earlier_run_of_this_requeued_slurm_job_is_taken_over(tmp_path, monkeypatch, caplog):
    """catches: a requeued job (same SLURM_JOB_ID, SLURM_RESTART_COUNT one higher) on another node
    refused by the lock its own killed first run left behind."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _write_lock(tmp_path, host="other-node-17", slurm_job_id="4242", slurm_restart_count=None)
    with caplog.at_level("WARNING", logger="fastrl.checkpoint"):
        RunDirLock(tmp_path).acquire().release()
    assert "an earlier run of this Slurm job, which was requeued" in caplog.text
    _write_lock(tmp_path, host="other-node-17", slurm_job_id="4242", slurm_restart_count="1")  # this very run: refused
    with pytest.raises(RunDirLocked, match="other-node-17"):
        RunDirLock(tmp_path).acquire()


def test_a_requeued_stage_beside_its_live_earlier_run_on_this_host_is_refused(tmp_path, monkeypatch):
    """catches: a requeue taken as proof that the earlier run is dead on this very host too (a requeued
    stage beside a still-running one would take its lock over and both would write the run)."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _write_lock(tmp_path, slurm_job_id="4242", slurm_restart_count=None,
                proc_start=run_lock._proc_start(os.getpid()))  # this host, a live process
    with pytest.raises(RunDirLocked, match="in use by another trainer"):
        RunDirLock(tmp_path).acquire()
    assert read_holder(tmp_path / LOCK_FILE).token == "other"  # left in place


def test_release_leaves_another_process_lock_alone(tmp_path):
    """catches: release() unlinking whatever lock file is there."""
    lock = RunDirLock(tmp_path).acquire()
    _write_lock(tmp_path, token="someone-else")  # e.g. the file was removed by hand and another trainer took it
    lock.release()
    assert read_holder(tmp_path / LOCK_FILE).token == "someone-else"


def test_lock_run_dir_rank0_takes_it_and_every_rank_stops_when_refused(tmp_path, monkeypatch):
    """catches: ranks other than 0 going on (into the model build's collectives) after rank 0 was refused,
    or every rank taking the lock."""
    from fastrl.distributed import world
    from fastrl.training.run import lock_run_dir

    lock = lock_run_dir(tmp_path, 0)
    assert lock is not None and (tmp_path / LOCK_FILE).exists()
    with pytest.raises(RunDirLocked, match="in use by another trainer"):
        lock_run_dir(tmp_path, 0)
    lock.release()
    assert lock_run_dir(tmp_path, 1) is None and not (tmp_path / LOCK_FILE).exists()  # only rank 0 locks
    monkeypatch.setattr(world, "any_rank", lambda flag: True)  # rank 0 reported a refusal
    with pytest.raises(RunDirLocked, match="rank 0 could not lock the run directory"):
        lock_run_dir(tmp_path, 1)
