"""Resume rules (README, "Checkpoints and exact resume"): every config change since the checkpoint is
logged; optimizer / schedule changes act; changes that would silently make another run (data,
rollout, algorithm, ...) are refused unless ``checkpoint.allow_changed`` names them; a finished run
can be extended; a stop before the first step, or during validation, exits 0 with nothing lost.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from tests.functional.conftest import REPO, TINY, read_jsonl, run_train, train_process

pytestmark = pytest.mark.functional

RECIPE = "easyvqa_tiny_fastrl_grpo_cpu"
QUICK = ["trainer.val_before_train=false"]


def _train(out_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The trainer in its own process, whatever its exit code."""
    return train_process(out_dir, *overrides, recipe=RECIPE)


def _train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def _checkpoints(run_dir: Path) -> list[str]:
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) if root.exists() else []


@pytest.fixture(scope="module")
def finished_two_steps(tmp_path_factory) -> Path:
    """A finished 2-step run (checkpoint at step 2, RUN_DIR/FINISHED), copied by each test."""
    root = tmp_path_factory.mktemp("two_steps")
    run_train(root, "trainer.max_steps=2", *QUICK)
    assert (root / RECIPE / "FINISHED").exists()
    return root


def _copy(src: Path, tmp_path: Path) -> tuple[Path, Path]:
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    return dst, dst / RECIPE


def test_resume_with_a_changed_lr_trains_with_it(finished_two_steps, tmp_path):
    root, run_dir = _copy(finished_two_steps, tmp_path)
    old_lr = next(r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train" and r["step"] == 2)["actor/lr"]
    new_lr = 2 * old_lr
    proc = run_train(root, "trainer.max_steps=3", f"optimizer.lr={new_lr}", *QUICK)
    log = proc.stdout + proc.stderr
    assert f"config change: optimizer.lr: {old_lr!r} -> {new_lr!r} (schedule: applied" in log
    assert "config change: trainer.max_steps: 2 -> 3 (schedule: applied" in log
    assert "LR schedule applied from the new config" in log
    # logging.plots=false (the suite's default, tests/functional/conftest.py TINY) draws nothing
    assert "no plots (logging.plots=false)" in log and not (run_dir / "plots").exists()
    step3 = next(r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train" and r["step"] == 3)
    assert step3["actor/lr"] == pytest.approx(new_lr)  # megatron's default would have kept old_lr


def test_a_changed_data_key_is_refused_unless_allowed(finished_two_steps, tmp_path):
    root, run_dir = _copy(finished_two_steps, tmp_path)
    refused = _train(root, "trainer.max_steps=3", "data.max_train_samples=48", *QUICK)
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "config change: data.max_train_samples: 64 -> 48 (REFUSED" in out
    # fewer records: other questions and other images
    assert "cannot resume from" in out
    assert "checkpoint.allow_changed=[data.fingerprint,data.images_fingerprint,data.max_train_samples]" in out
    assert _train_steps(run_dir) == [1, 2] and _checkpoints(run_dir)[-1] == "step_00000002"

    accepted = run_train(root, "trainer.max_steps=3", "data.max_train_samples=48", "checkpoint.allow_changed=[data]", *QUICK)
    log = accepted.stdout + accepted.stderr
    assert "data.max_train_samples: 64 -> 48 (refused by default, allowed by checkpoint.allow_changed)" in log
    assert "the prompt sampler continues epoch 0 at prompt 6 of 48" in log  # 8 of 64 prompts were used
    assert _train_steps(run_dir) == [1, 2, 3]


def test_another_data_file_with_the_same_size_and_settings_is_refused(tmp_path):
    from fastrl.data import load_records, write_canonical

    train = load_records("easy_vqa", split="train", limit=128).records
    val = load_records("easy_vqa", split="val", limit=16).records
    data = tmp_path / "data"
    write_canonical(train[:64], data / "train.parquet")
    write_canonical(val, data / "val.parquet")
    overrides = [
        "data.dataset=canonical", f"data.train_path={data / 'train.parquet'}", f"data.val_path={data / 'val.parquet'}",
        "trainer.max_steps=3", *QUICK,
    ]
    run_train(tmp_path, *overrides, "stage.max_steps=1")
    # Same questions and answers, each with the next record's image. Breakage caught: a data
    # fingerprint that leaves the images out resumes silently on other images (issue 33, item 6).
    swapped = [replace(r, images=train[(i + 1) % 64].images) for i, r in enumerate(train[:64])]
    write_canonical(swapped, data / "train.parquet")
    proc = _train(tmp_path, *overrides)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config change: data.images_fingerprint:" in out and "the training images differ" in out
    assert "config change: data.fingerprint:" not in out  # the text is the same
    assert "checkpoint.allow_changed=[data.images_fingerprint]" in out
    assert _train_steps(tmp_path / RECIPE) == [1]

    write_canonical(train[64:], data / "train.parquet")  # same path, same size, other questions
    proc = _train(tmp_path, *overrides)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config change: data.fingerprint:" in out and "the training records differ" in out
    assert "checkpoint.allow_changed=[data.fingerprint,data.images_fingerprint]" in out  # other questions, other images
    assert _train_steps(tmp_path / RECIPE) == [1]


def test_a_re_done_step_has_one_record(finished_two_steps, tmp_path):
    # A crash during step 2's save (its checkpoint incomplete, no FINISHED): the rerun starts from
    # nothing and trains steps 1-2 again. Breakage caught: appending to metrics.jsonl, which then
    # holds two records of each step for plots and the benchmark (issue 33, item 7).
    root, run_dir = _copy(finished_two_steps, tmp_path)
    before = read_jsonl(run_dir / "metrics.jsonl")
    (run_dir / "checkpoints" / "step_00000002" / "COMPLETE").unlink()
    (run_dir / "FINISHED").unlink()
    proc = run_train(root, "trainer.max_steps=2", *QUICK)
    log = proc.stdout + proc.stderr
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [(r["step"], r["kind"]) for r in records] == [(r["step"], r["kind"]) for r in before]
    assert _train_steps(run_dir) == [1, 2]
    assert read_jsonl(run_dir / "metrics.superseded.jsonl") == before  # the first attempt's records, kept aside
    assert f"metrics.jsonl: {len(before)} record(s) after step 0, which this run trains again, moved to" in log


def test_resume_without_optimizer_state_says_adam_restarts(tmp_path):
    # Breakage caught: a checkpoint written with checkpoint.save_optimizer=false resumes with Adam's
    # moments at zero and no word about it (issue 33, item 10).
    overrides = ["trainer.max_steps=2", "checkpoint.save_optimizer=false", *QUICK]
    run_train(tmp_path, *overrides, "stage.max_steps=1")
    proc = run_train(tmp_path, *overrides)
    log = proc.stdout + proc.stderr
    assert "holds no optimizer state (written with checkpoint.save_optimizer=false): Adam restarts from zero " \
           "moments at step 1, so this resume is not exact" in log
    assert _train_steps(tmp_path / RECIPE) == [1, 2]


def test_extending_a_finished_run(finished_two_steps, tmp_path):
    root, run_dir = _copy(finished_two_steps, tmp_path)
    same = run_train(root, "trainer.max_steps=2", *QUICK)
    log = same.stdout + same.stderr
    assert "training already complete at step 2 (of 2)" in log
    assert "trainer.max_steps=4 (now 2)" in log  # says exactly what to change

    # a stage stopped before its first new step loses nothing: no save, the run stays finished
    stopped = run_train(root, "trainer.max_steps=4", "stage.time_limit_s=1e-6", *QUICK)
    log = stopped.stdout + stopped.stderr
    assert "extending a finished run" in log
    assert "no training step in this stage: the checkpoint of step 2 holds this state; nothing to save" in log
    assert (run_dir / "FINISHED").exists() and _checkpoints(run_dir)[-1] == "step_00000002"

    extended = run_train(root, "trainer.max_steps=4", *QUICK)
    log = extended.stdout + extended.stderr
    assert "config change: trainer.max_steps: 2 -> 4 (schedule: applied" in log
    assert f"removed {run_dir / 'FINISHED'}: the run continues past step 2" in log
    assert _train_steps(run_dir) == [1, 2, 3, 4]
    assert json.loads((run_dir / "FINISHED").read_text())["step"] == 4
    assert _checkpoints(run_dir)[-1] == "step_00000004"


def test_time_limit_before_the_first_step_exits_0_and_saves_nothing(tmp_path):
    proc = run_train(tmp_path, "trainer.max_steps=2", "stage.time_limit_s=1e-6")  # used to crash in the save
    log = proc.stdout + proc.stderr
    run_dir = tmp_path / RECIPE
    assert "validation @ step 0 stopped (stage.time_limit_s) after 0 of 16 questions" in log
    assert "stopped before the first training step: nothing was trained and no checkpoint is written" in log
    assert _checkpoints(run_dir) == [] and not (run_dir / "FINISHED").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "stage.time_limit_s" and summary["nothing_trained"] is True
    # the next stage starts the run from the beginning
    nxt = run_train(tmp_path, "trainer.max_steps=1", *QUICK)
    assert "resumed from" not in nxt.stdout + nxt.stderr
    assert _train_steps(run_dir) == [1] and _checkpoints(run_dir) == ["step_00000001"]


def test_stop_signal_during_validation_is_honoured(tmp_path):
    """SIGUSR1 sent when the start-up validation of 2,000 questions (8 chunks) begins: the
    validation stops at the next chunk instead of running to its end, and the trainer exits 0."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "fastrl.train", "--recipe", RECIPE, *TINY, f"logging.output_dir={tmp_path}",
           "data.val_size=2000", "trainer.max_steps=2"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    timer = threading.Timer(600, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if "validating 2000 questions @ step 0" in line:
                os.kill(proc.pid, signal.SIGUSR1)
        rc = proc.wait()
    finally:
        timer.cancel()
    log = "".join(lines)
    assert rc == 0, log[-4000:]
    assert "validation @ step 0 stopped (SIGUSR1) after" in log
    done = int(log.split("validation @ step 0 stopped (SIGUSR1) after ")[1].split(" ")[0])
    assert done < 2000
    assert "stop requested (SIGUSR1) before step 1" in log
    assert "stopped before the first training step: nothing was trained" in log
    run_dir = tmp_path / RECIPE
    assert not [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "val"]  # the partial result is not logged
    assert _checkpoints(run_dir) == []
