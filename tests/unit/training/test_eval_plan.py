"""The start-up line that says how much of a run its evaluations take (issue 45, item 8d)."""

from __future__ import annotations

import logging
from dataclasses import replace

from fastrl.training.eval_plan import evaluation_plan, log_evaluation_plan
from recipes.registry import get_recipe


def test_smollm2_two_step_run_is_told_evaluation_dominates(caplog):
    """catches: the silent start of the issue's run -- 2 steps of the SmolLM2 recipe spent 62% of
    their time validating 150 questions twice and testing 300 with no word of it up front."""
    cfg = get_recipe("smollm2_135m_grpo_wordarith_vllm_cpu")
    cfg = replace(cfg, trainer=replace(cfg.trainer, max_steps=2))
    with caplog.at_level(logging.INFO, logger="fastrl.trainer"):
        plan = log_evaluation_plan(cfg, steps=2, val_questions=150, test_questions=300)
    assert (plan.validations, plan.tests, plan.eval_responses, plan.train_responses) == (2, 1, 600, 128)
    (record,) = [r for r in caplog.records if r.getMessage().startswith("evaluation plan:")]
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert "validation: 150 question(s) x 1 response(s), 2 time(s) (step 0, the end)" in text
    assert "held-out test: 300 question(s) x 1, 1 time(s) = 600 responses" in text
    assert "evaluation is 82% of the responses" in text
    assert "lower data.val_size / data.test_size, set trainer.val_before_train=false" in text


def test_counts_follow_the_schedule_and_a_training_heavy_run_is_info():
    """catches: validations miscounted (the final one twice when val_every divides the run, or
    step 0 without trainer.val_before_train), or every run warned about."""
    cfg = get_recipe("qwen2_tiny_text_fastrl_grpo_vllm_cpu")  # 30 steps, val_every=0, val_size=16
    plan = evaluation_plan(cfg, steps=30, val_questions=16, test_questions=0)
    assert (plan.validations, plan.tests, plan.eval_responses, plan.train_responses) == (2, 0, 32, 1920)
    assert plan.eval_share < 0.5 and "most of its generation" not in plan.line(cfg)
    periodic = replace(cfg, data=replace(cfg.data, test_size=8, test_path="unused.jsonl"),
                       trainer=replace(cfg.trainer, val_every=10, test_every=15, val_before_train=False))
    plan = evaluation_plan(periodic, steps=30, val_questions=16, test_questions=8)
    assert (plan.validations, plan.tests) == (3, 2)  # steps 10, 20, end; steps 15, end
