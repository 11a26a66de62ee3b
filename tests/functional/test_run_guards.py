"""What guards a run directory and its history end to end: the run-directory lock, Ctrl-C as a stop
request, and updates that diverge (skipped, then the run stops naming the step)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from fastrl.checkpoint.run_lock import LOCK_FILE, _proc_start
from tests.functional.conftest import COIN_REWARD, REPO, TINY, read_jsonl, train_process

pytestmark = pytest.mark.functional

RECIPE = "easyvqa_tiny_fastrl_grpo_cpu"


def test_a_second_trainer_on_a_held_run_directory_is_refused_in_one_line(tmp_path):
    """catches: run() not taking the lock (on main the second trainer moved the first's records to
    metrics.superseded.jsonl and shared its checkpoint staging folder); the refused trainer writing
    its start-up lines or its traceback into the holder's train.log."""
    run_dir = tmp_path / RECIPE
    run_dir.mkdir()
    history = json.dumps({"step": 1, "kind": "train"}) + "\n"
    (run_dir / "metrics.jsonl").write_text(history)
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": "2026-12-07T08:00:00+00:00",
              "proc_start": _proc_start(os.getpid()), "slurm_job_id": None, "token": "first"}
    (run_dir / LOCK_FILE).write_text(json.dumps(holder))  # this (live) process holds it
    (run_dir / "train.log").write_text("the holder's log\n")
    proc = train_process(tmp_path, "trainer.max_steps=1", recipe=RECIPE)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert (run_dir / "train.log").read_text() == "the holder's log\n"  # the holder's log is left alone
    assert lines[-1] == (
        f"fastrl.train: error: RunDirLocked: run directory {run_dir} is in use by another trainer: pid {os.getpid()} "
        f"on host {socket.gethostname()}, started 2026-12-07T08:00:00+00:00 ({run_dir / LOCK_FILE}); stop it first, "
        "or train into another directory (logging.output_dir / logging.run_name)"
    )
    assert (run_dir / "metrics.jsonl").read_text() == history
    assert not (run_dir / "metrics.superseded.jsonl").exists()
    assert json.loads((run_dir / LOCK_FILE).read_text())["token"] == "first"  # the holder's lock stays


def test_ctrl_c_finishes_the_step_saves_and_exits_0(tmp_path):
    """catches: the trainer not handling SIGINT (on main Ctrl-C killed the run within a second with a
    KeyboardInterrupt traceback: no checkpoint, every step since the last save lost)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "fastrl.train", "--recipe", RECIPE, *TINY, f"logging.output_dir={tmp_path}",
           "data.val_size=4", "trainer.max_steps=3", "trainer.val_every=1"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    timer = threading.Timer(600, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if "validating 4 questions @ step 1" in line:  # step 1 is trained (a stop may abandon this validation)
                os.kill(proc.pid, signal.SIGINT)
        rc = proc.wait()
    finally:
        timer.cancel()
    log = "".join(lines)
    assert rc == 0, log[-4000:]
    assert "fastrl.train: stop requested (SIGINT): the step in flight finishes" in log
    assert "stop requested (SIGINT) before step 2" in log and "KeyboardInterrupt" not in log
    run_dir = tmp_path / RECIPE
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"] == [1]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_00000001"]
    assert not (run_dir / LOCK_FILE).exists()  # released at exit


def test_a_diverging_learning_rate_skips_updates_and_stops_naming_the_step(tmp_path):
    """catches: non-finite updates applied (on main, optimizer.lr=1e4 wrote NaN weights as a complete
    checkpoint, and the run died later in sampling naming neither the step nor the cause)."""
    proc = train_process(tmp_path, COIN_REWARD, "optimizer.lr=1e4", "checkpoint.save_every=1", "trainer.max_steps=6",
                         recipe=RECIPE)
    assert proc.returncode == 1, proc.stderr[-3000:]
    error = next(line for line in proc.stderr.splitlines() if line.startswith("fastrl.train: error:"))
    assert "NonFiniteUpdatesError: step " in error and "the last 3 optimizer updates were skipped" in error
    assert "probability tensor" not in proc.stderr
    run_dir = tmp_path / RECIPE
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert any(r["actor/update_skipped"] > 0 for r in train)
    assert train[-1]["actor/skipped_updates_total"] >= 3
    assert f"step {train[-1]['step']}: the last 3" in error
    assert not (run_dir / LOCK_FILE).exists()  # released on the error path too
