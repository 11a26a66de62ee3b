"""Lost checkpoints trained again (bench/recover_checkpoints.py) and read back into the equal-time
report at the original run's training times (bench/word_arith_time.py)."""

import json
import subprocess
from pathlib import Path

import pytest

from bench import recover_checkpoints, word_arith_time
from bench.recover_checkpoints import check_checkout, control_step, recovery_arguments, verify

ORIGINAL = ["--recipe", "smollm2_135m_fastrl_paper_grpo_wordarith_vllm_cpu", "checkpoint.keep_last=1",
            "checkpoint.save_at_train_s=[300,600,1494.8,2400]", "checkpoint.save_at_steps=[5,10,15,20]",
            "trainer.max_steps=80", "trainer.epochs=2", "trainer.max_train_time_s=2400", "trainer.seed=1",
            "logging.output_dir=/runs/seed1", "trainer.torch_threads=2"]


def test_the_run_again_keeps_every_setting_that_shapes_a_step():
    """catches: the step horizon changed to stop the run (trainer.max_steps: another LR schedule and
    ARS horizon, other weights), the original's time grid or budget kept (other steps saved, or a
    stop before the last lost step), or the seed dropped."""
    args = recovery_arguments(ORIGINAL, [24, 7, 33], Path("/runs/seed1/recovered"))
    assert args == ["--recipe", "smollm2_135m_fastrl_paper_grpo_wordarith_vllm_cpu", "checkpoint.keep_last=1",
                    "trainer.max_steps=80", "trainer.epochs=2", "trainer.seed=1", "trainer.torch_threads=2",
                    "checkpoint.save_at_steps=[7,24,33]", "checkpoint.save_optimizer=false", "stage.max_steps=33",
                    "logging.output_dir=/runs/seed1/recovered"]
    with pytest.raises(ValueError, match="positive"):
        recovery_arguments(ORIGINAL, [], Path("/x"))


def _metrics(run_dir: Path, steps: int, reward=lambda s: s / 10, time=lambda s: 40.0 * s) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    records = [{"kind": "start", "step": 0, "wall_time": 1.0}]
    records += [{"kind": "train", "step": s, "reward/mean": reward(s), "loss": -reward(s), "time/step": 40.0,
                 "time/train_elapsed": time(s), "wall_time": 100.0 + s} for s in range(1, steps + 1)]
    records += [{"kind": "val", "step": steps, "val/accuracy": 0.4, "time/train_elapsed": time(steps)}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_verify_compares_every_step_the_run_again_trained(tmp_path):
    """catches: a comparison of the first step only, of times, of the refit check's schedule (a
    resumed original has it at other steps: seed 2's row would never verify), or a run again with no
    step accepted."""
    _metrics(tmp_path / "a", 6)
    lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    lines[3] = json.dumps({**json.loads(lines[3]), "refit_verify/abs_diff_max": 0.0})  # the original's step 3
    (tmp_path / "a" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    _metrics(tmp_path / "b", 4, time=lambda s: 55.0 * s)  # slower, stopped at 4: the same computation
    assert verify(tmp_path / "a", tmp_path / "b") is None
    _metrics(tmp_path / "c", 4, reward=lambda s: s / 10 + (0.01 if s == 4 else 0))
    assert "step 4" in verify(tmp_path / "a", tmp_path / "c")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "metrics.jsonl").write_text("")
    assert "no train step" in verify(tmp_path / "a", tmp_path / "d")


def _budget_run(run_dir: Path, seconds: dict[int, float]) -> None:
    _metrics(run_dir, max(seconds), time=lambda s: seconds.get(s, 40.0 * s))
    (run_dir / "train.log").write_text("".join(
        f"x [rank 0] fastrl.checkpoint: checkpoint saved: {run_dir}/checkpoints/step_{s:08d}\n" for s in seconds))


def _evaluated(run_dir: Path, steps: dict[int, int], seconds: dict[int, float]) -> None:
    """``evals/curve.json`` with one evaluation per step: ``correct`` of 10 questions right."""
    (run_dir / "evals").mkdir(parents=True, exist_ok=True)
    curve = []
    for step, correct in steps.items():
        q = run_dir / "evals" / f"q{step}.jsonl"
        q.write_text("".join(json.dumps({"id": i, "correct": int(i < correct)}) + "\n" for i in range(10)))
        curve.append({"step": step, "train_seconds": seconds[step], "test_path": word_arith_time.TEST_PATH,
                      "test_size": word_arith_time.TEST_SIZE, "per_question": f"evals/q{step}.jsonl"})
    (run_dir / "evals" / "curve.json").write_text(json.dumps(curve))


def test_a_recovered_checkpoint_stands_at_the_original_runs_time(tmp_path):
    """catches: a recovered evaluation placed at the run again's own training time (its timing is
    not the original's), its outcomes read from the original's directory, or a run again that
    computed other values used."""
    seconds = {20: 800.0, 24: 980.0, 33: 1290.0, 48: 1740.0}
    run = tmp_path / "seed1" / "row"
    _budget_run(run, seconds)
    _evaluated(run, {20: 3, 48: 6}, seconds)
    again = recover_checkpoints.recovered_dir(run)
    assert again == tmp_path / "seed1" / "recovered" / "row"
    _metrics(again, 33, time=lambda s: 70.0 * s)
    _evaluated(again, {20: 3, 24: 4, 33: 5}, {20: 1400.0, 24: 24 * 70.0, 33: 33 * 70.0})  # 20: the control
    curve = word_arith_time.load_curve(run, 1745.0, budget=True)
    got = [(e["step"], e["train_seconds"], sum(e["outcomes"].values()), e.get("recovered", False)) for e in curve]
    assert got == [(20, 800.0, 3, False), (24, 980.0, 4, True), (33, 1290.0, 5, True), (48, 1740.0, 6, False)]
    _evaluated(again, {20: 4, 24: 4, 33: 5}, {20: 1400.0, 24: 24 * 70.0, 33: 33 * 70.0})
    with pytest.raises(SystemExit, match="step 20 answers other test questions"):
        word_arith_time.load_curve(run, 1745.0, budget=True)
    _evaluated(again, {24: 4, 33: 5}, {24: 24 * 70.0, 33: 33 * 70.0})
    with pytest.raises(SystemExit, match="control step 20 is not evaluated"):
        word_arith_time.load_curve(run, 1745.0, budget=True)
    _evaluated(again, {20: 3, 24: 4, 33: 5}, {20: 1400.0, 24: 24 * 70.0, 33: 33 * 70.0})
    _metrics(again, 33, reward=lambda s: 0.0)
    with pytest.raises(SystemExit, match="did not compute what"):
        word_arith_time.load_curve(run, 1745.0, budget=True)


def _recoverable_run(tmp_path: Path, seconds: dict[int, float], monkeypatch) -> Path:
    """A finished run ``seed1/row`` saved at ``seconds``, its step 20 evaluated, with its records and
    a checkout whose trainer check passes."""
    run = tmp_path / "seed1" / "row"
    _budget_run(run, seconds)
    _evaluated(run, {20: 3}, seconds)
    (tmp_path / "seed1" / "row.bench_run.json").write_text(json.dumps({"commit": "abc"}))
    (tmp_path / "seed1" / "row.args.json").write_text(json.dumps(ORIGINAL))
    monkeypatch.setattr(recover_checkpoints, "check_checkout", lambda checkout, commit: None)
    (tmp_path / "checkout" / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / "checkout" / ".venv" / "bin" / "python").write_text("")
    return run


def test_recover_trains_the_lost_steps_and_the_control_once(tmp_path, monkeypatch):
    """catches: the control step left out of the run again, the lost steps not all saved, or a partial
    run again resumed (it would train past the last step, since stage.max_steps counts from the resume)."""
    seconds = {20: 800.0, 24: 980.0, 33: 1290.0}
    run = _recoverable_run(tmp_path, seconds, monkeypatch)
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if "fastrl.train" in cmd:
            _metrics(recover_checkpoints.recovered_dir(run), 33)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(recover_checkpoints.subprocess, "run", fake_run)
    split = {"test_path": word_arith_time.TEST_PATH, "test_size": word_arith_time.TEST_SIZE}
    recover_checkpoints.recover(run, [33, 24], tmp_path / "checkout", **split, threads=2, timeout=9)
    train = next(c for c in calls if "fastrl.train" in c)
    assert "checkpoint.save_at_steps=[20,24,33]" in train and "stage.max_steps=33" in train
    assert any("eval_checkpoints.py" in " ".join(c) for c in calls)
    _metrics(recover_checkpoints.recovered_dir(run), 30)  # a run again stopped part-way
    with pytest.raises(SystemExit, match="partial run again"):
        recover_checkpoints.recover(run, [24, 33], tmp_path / "checkout", **split, threads=2, timeout=9)


def test_a_run_again_that_computed_other_values_is_not_evaluated(tmp_path, monkeypatch):
    """catches: recover() evaluating a run again without checking its metrics first (an hour of
    evaluations of checkpoints that are not the original's, found only when the report reads them)."""
    seconds = {20: 800.0, 24: 980.0}
    run = _recoverable_run(tmp_path, seconds, monkeypatch)
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if "fastrl.train" in cmd:
            _metrics(recover_checkpoints.recovered_dir(run), 24, reward=lambda s: 0.5)  # other rewards
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(recover_checkpoints.subprocess, "run", fake_run)
    with pytest.raises(SystemExit, match="computed other values"):
        recover_checkpoints.recover(run, [24], tmp_path / "checkout", test_path=word_arith_time.TEST_PATH,
                                    test_size=word_arith_time.TEST_SIZE, threads=2, timeout=9)
    assert not any("eval_checkpoints.py" in " ".join(c) for c in calls)


def test_the_control_is_the_latest_evaluated_step_a_run_again_passes(tmp_path):
    """catches: the first evaluated checkpoint taken as the control when a later one lies within the
    run again (the steps between them then checked by their metrics only), or a control past the
    last lost step when one before it exists (training longer than needed)."""
    run = tmp_path / "row"
    seconds = {20: 800.0, 30: 1100.0, 48: 1740.0}
    _budget_run(run, seconds)
    _evaluated(run, {20: 3, 30: 4, 48: 6}, seconds)
    split = (word_arith_time.TEST_PATH, word_arith_time.TEST_SIZE)
    assert [control_step(run, *split, last) for last in (10, 20, 33, 48, 68)] == [20, 20, 30, 48, 48]


def test_recover_refuses_what_it_cannot_check(tmp_path, monkeypatch):
    """catches: a run again trained into a folder holding an earlier one's evaluations (they would be
    paired with the new metrics), or a missing run record / checkout environment met with a
    traceback instead of what to do."""
    seconds = {20: 800.0, 24: 980.0}
    run = tmp_path / "seed1" / "row"
    _budget_run(run, seconds)
    _evaluated(run, {20: 3}, seconds)
    split = {"test_path": word_arith_time.TEST_PATH, "test_size": word_arith_time.TEST_SIZE}
    checkout = tmp_path / "checkout"
    with pytest.raises(SystemExit, match="row.bench_run.json not found"):
        recover_checkpoints.recover(run, [24], checkout, **split, threads=2, timeout=9)
    (tmp_path / "seed1" / "row.bench_run.json").write_text(json.dumps({"commit": "abc"}))
    monkeypatch.setattr(recover_checkpoints, "check_checkout", lambda checkout, commit: None)
    with pytest.raises(SystemExit, match="make setup vllm-venv"):
        recover_checkpoints.recover(run, [24], checkout, **split, threads=2, timeout=9)
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "python").write_text("")
    _evaluated(recover_checkpoints.recovered_dir(run), {24: 4}, {24: 980.0})  # evaluations, no metrics
    monkeypatch.setattr(recover_checkpoints.subprocess, "run", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(SystemExit, match="holds files but no trained step"):
        recover_checkpoints.recover(run, [24], checkout, **split, threads=2, timeout=9)


def test_the_checkout_must_hold_the_trainer_that_trained_the_run(tmp_path):
    """catches: a checkout whose fastrl/ differs from the run's commit accepted (the run again would
    compute other values, found only after its hour of training), or a dirty commit accepted."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "fastrl").mkdir()
    (tmp_path / "fastrl" / "x.py").write_text("a = 1\n")
    (tmp_path / "README").write_text("r\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    commit = git("rev-parse", "HEAD")
    (tmp_path / "README").write_text("changed outside the trainer\n")
    check_checkout(tmp_path, commit)
    with pytest.raises(SystemExit, match="dirty"):
        check_checkout(tmp_path, commit + "+dirty")
    (tmp_path / "fastrl" / "x.py").write_text("a = 2\n")
    with pytest.raises(SystemExit, match="not those of"):
        check_checkout(tmp_path, commit)


def test_recover_needs_a_checkout_and_a_row():
    with pytest.raises(SystemExit):
        word_arith_time.parse_args(["--recover", "1:fastrl_paper_grpo"])
    with pytest.raises(SystemExit):
        word_arith_time.parse_args(["--recover", "1:nope", "--checkout", "/x"])
    with pytest.raises(SystemExit):
        word_arith_time.parse_args(["--checkout", "/x"])
    assert word_arith_time.parse_args(["--recover", "2:fastrl_paper_grpo", "--checkout", "/x"]).recover == (
        2, "fastrl_paper_grpo")
    for ignored in (["trainer.max_steps=2"], ["--keep-checkpoints"], ["--rows", "grpo"], ["--seeds", "1"]):
        with pytest.raises(SystemExit):  # settings a recovery would not apply, or a seed the report leaves out
            word_arith_time.parse_args(["--recover", "2:fastrl_paper_grpo", "--checkout", "/x", *ignored])
