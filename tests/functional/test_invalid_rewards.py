"""A run whose rewards are all invalid stops with a non-zero exit and one line naming the reward and
the grader's first error (it used to exit 0 with reward/mean 0.0 and accuracy nan)."""

import os
import subprocess
import sys

import pytest

from tests.functional.conftest import REPO, TINY, read_jsonl

pytestmark = pytest.mark.functional

RAISING_REWARD = """
def grade(response, ground_truth):
    raise ValueError(f"cannot grade {len(response)} characters")
"""


def test_a_reward_that_always_raises_stops_the_run(tmp_path):
    reward = tmp_path / "raising_reward.py"
    reward.write_text(RAISING_REWARD)
    spec = f"{reward}:grade"
    cmd = [
        sys.executable, "-m", "fastrl.train", "--recipe", "easyvqa_tiny_fastrl_grpo_cpu", *TINY,
        f"logging.output_dir={tmp_path}", "logging.run_name=run", f"reward.name={spec}",
        "reward.max_invalid_steps=2", "trainer.max_steps=4", "trainer.val_before_train=false",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fastrl.train: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert f"reward '{spec}'" in errors[0] and "2 consecutive steps" in errors[0]
    assert "first error: ValueError: cannot grade" in errors[0]
    assert "Traceback" not in proc.stderr  # the traceback is in the log file (and with --debug)
    run_dir = tmp_path / "run"
    assert "Traceback (most recent call last)" in (run_dir / "train.log").read_text()
    assert f"the full log with the traceback: {run_dir / 'train.log'}" in proc.stderr
    # the grader's error text reached the log, once
    assert proc.stdout.count("ValueError: cannot grade") == 1
    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1] and steps[0]["reward/invalid_fraction"] == 1.0
    assert not (run_dir / "FINISHED").exists()
