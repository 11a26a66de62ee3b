"""A run stopped by its training-time budget, with a grid checkpoint kept for good, evaluated
afterwards by ``bench/eval_checkpoints.py`` on the held-out test split (per-question outcomes)."""

import json
import os

import pytest

from bench.eval_checkpoints import evaluate_run
from tests.functional.conftest import REPO, TINY, read_jsonl, run_train
from tests.trainer_fork import run_trainer

pytestmark = pytest.mark.functional


def test_time_budget_stop_grid_checkpoint_and_evaluation_after_training(tmp_path):
    """catches: the loop ignoring trainer.max_train_time_s (it trains 4 steps), a grid checkpoint
    saved without ``keep`` (or its keep lost when the final validation re-saves the step as best),
    no per-question file for the test evaluation, and the evaluation tool not passing its
    --test-size (the trainer's 8 questions instead of 4); and a finished run started again that does
    not see its budget spent (it validates and evaluates again)."""
    overrides = ["trainer.max_steps=4", "checkpoint.save_at_steps=[1]", "checkpoint.keep_last=1",
                 "trainer.max_train_time_s=0.001", "data.test_size=8"]
    run_train(tmp_path, *overrides)
    run_dir = tmp_path / "easyvqa_tiny_fastrl_grpo_cpu"
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "train"] == [1]  # the budget is spent by step 1
    assert json.loads((run_dir / "FINISHED").read_text())["step"] == 1
    assert json.loads((run_dir / "summary.json").read_text()).get("stopped_by") == "trainer.max_train_time_s"
    marker = json.loads((run_dir / "checkpoints" / "step_00000001" / "COMPLETE").read_text())
    assert marker["keep"] is True and marker["train_seconds"] > 0.001
    rows = read_jsonl(run_dir / "evaluations" / "test_step00000001.jsonl")
    assert len(rows) == 8 and all(set(r) >= {"id", "correct", "answer"} for r in rows)
    # started again: the budget is spent, so nothing is trained or evaluated again
    again = run_train(tmp_path, *overrides)
    assert "reached trainer.max_train_time_s=0.001" in again.stdout + again.stderr
    assert read_jsonl(run_dir / "metrics.jsonl") == records

    # the evaluation after training, as the benchmark runs it (the run's arguments beside it)
    (tmp_path / "easyvqa_tiny_fastrl_grpo_cpu.args.json").write_text(json.dumps(
        ["--recipe", "easyvqa_tiny_fastrl_grpo_cpu", *TINY, *overrides]))

    def runner(argv, log):
        proc = run_trainer(argv, env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"), cwd=REPO, timeout=600)
        log.write_text(proc.stdout + proc.stderr)
        return proc.returncode

    curve = evaluate_run(run_dir, test_path=None, test_size=4, runner=runner)
    assert [(e["step"], e["test_questions"], e["kept"]) for e in curve] == [(1, 4, True)]
    assert curve[0]["train_seconds"] == marker["train_seconds"]
    per_question = read_jsonl(run_dir / curve[0]["per_question"])
    assert [r["id"] for r in per_question] == [r["id"] for r in rows[:4]]
    # evaluated once: a second call finds it in curve.json and runs nothing
    assert evaluate_run(run_dir, test_path=None, test_size=4, runner=lambda *a: 1) == curve
