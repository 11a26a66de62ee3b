"""Issue 33, item 3: a refit that silently does not reach the engine is stopped at the first stale
step, before the update trains on the stale rollouts; a healthy run with the guard on is not.

Tiny fp32 runs of the default recipe with the Hugging Face engine; the broken refits are the test
doubles of tests/functional/stale_refit.py.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.functional.conftest import REPO, TINY, read_jsonl, run_train

pytestmark = pytest.mark.functional

RECIPE = "easyvqa_tiny_fastrl_grpo_cpu"
#: Every step trains for real: the untrained tiny policy is never right, so with its own reward every
#: GRPO advantage of the first steps is 0 and an update barely moves the weights (a dropped refit
#: then leaves the engine only ~1e-5 behind); coin rewards give informative groups from step 1.
REAL_UPDATES = ("reward.name=tests/functional/coin_rewards.py:one_in_two", "trainer.val_before_train=false")
FP32_AUTO = 1e-4  # rollout.mismatch_tolerance='auto' at precision.mode=fp32 (MISMATCH_TOLERANCE_AUTO)


def _broken_run(out_dir, mode: str, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(REPO / "tests" / "functional" / "stale_refit.py"), mode, "--recipe", RECIPE, *TINY,
           f"logging.output_dir={out_dir}", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("fastrl.train: error:")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stdout[-3000:] + proc.stderr[-5000:]
    return errors[0]


def test_healthy_fp32_run_is_not_stopped_by_the_guard(tmp_path):
    # Catches a guard that fires on healthy numerics (a tolerance below fp32's ~1e-7, a guard that
    # compares the wrong quantity, or one that fires on every step): the run must finish.
    run_train(tmp_path, "trainer.max_steps=3", "rollout.mismatch_tolerance=auto", *REAL_UPDATES)
    records = read_jsonl(tmp_path / RECIPE / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        assert r["actor/grad_norm"] > 1e-3, r  # real updates, refit after each
        assert r["mismatch/abs_diff_mean"] <= FP32_AUTO / 100, r  # healthy fp32: ~1e-7, far below the bound
    assert json.loads((tmp_path / RECIPE / "summary.json").read_text())["finished"] is True


def test_refit_that_drops_the_weights_is_stopped_at_the_first_stale_step(tmp_path):
    # Catches the build of issue 33: without the per-step guard this run trains all 3 steps on
    # rollouts of the step-0 weights (exit 0); the engine's weight version advances, so only the
    # measured mismatch can tell. Step 1's rollouts come from the initial weights (the engine's
    # own); the first refit is dropped, so step 2 is the first stale step.
    proc = _broken_run(tmp_path, "drop", "trainer.max_steps=3", "checkpoint.save_every=1",
                       "rollout.mismatch_tolerance=auto", *REAL_UPDATES)
    line = _error_line(proc)
    assert "RolloutMismatchError: step 2:" in line, line
    assert "mismatch/abs_diff_mean = " in line and "> rollout.mismatch_tolerance = 0.0001 ('auto' for precision.mode=fp32)" in line
    assert "stopped before its policy update" in line and "rollout.verify_refit_every=1" in line
    measured = float(line.split("mismatch/abs_diff_mean = ")[1].split()[0])
    assert measured > 100 * FP32_AUTO  # one update of the tiny model moves its log-probs far more
    run_dir = tmp_path / RECIPE
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1]  # step 1 healthy and logged; step 2 never trained
    assert train[0]["mismatch/abs_diff_mean"] <= FP32_AUTO / 100 and train[0]["actor/grad_norm"] > 1e-3
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert ckpts == ["step_00000001"]  # what was saved before the stale step is kept
    assert not (run_dir / "FINISHED").exists()


def test_refit_that_never_arrives_is_refused_at_generate(tmp_path):
    # Catches the build where generate() takes no weight version (or an engine that does not check
    # it): the engine's loaded version stays 0 while the trainer's is 1 after step 1, so step 2's
    # generate request is refused before anything is generated. The mismatch guard is off here to
    # show that the version check stands on its own.
    proc = _broken_run(tmp_path, "lose", "trainer.max_steps=3", "rollout.mismatch_tolerance=none", *REAL_UPDATES)
    line = _error_line(proc)
    assert "StaleWeightsError" in line and "holds weight version 0" in line and "policy version 1" in line, line
    assert "nothing was generated" in line
    train = [r for r in read_jsonl(tmp_path / RECIPE / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1]
