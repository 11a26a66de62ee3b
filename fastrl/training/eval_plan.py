"""How much of a run's generation its evaluations take, said in one line at start-up.

Validation decodes ``data.val_size`` questions x ``rollout.val_n`` responses at step 0
(``trainer.val_before_train``), every ``trainer.val_every`` steps and at the end; the held-out test
decodes ``data.test_size`` questions x ``rollout.val_n`` every ``trainer.test_every`` steps and at
the end. Training generates ``rollout.prompts_per_step`` x ``rollout.n`` rollouts per step. All of
them are capped at ``rollout.max_response_length`` tokens, so the response counts compare the
generation work (a training step also runs its update passes, which evaluation does not). A
2-step run of the SmolLM2 recipe validates 150 questions twice and tests 300 once -- 600
responses against 128 rollouts -- and spent 785 s of its 1,163 in evaluation: the line says so
before any of it starts, with the settings that shorten it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fastrl.config import RunConfig

logger = logging.getLogger("fastrl.trainer")

#: Above this share of the run's responses the line is a warning.
WARN_SHARE = 0.5


@dataclass(frozen=True)
class EvaluationPlan:
    """Response counts of a whole run (from step 0).

    Attributes:
        steps: training steps.
        train_responses: ``steps x rollout.prompts_per_step x rollout.n`` (before ARS shrinks ``n``).
        val_questions / validations: questions per validation, validations in the run.
        test_questions / tests: questions per held-out test evaluation, evaluations in the run.
        val_n: responses per evaluated question.
    """

    steps: int
    train_responses: int
    val_questions: int
    validations: int
    test_questions: int
    tests: int
    val_n: int

    @property
    def eval_responses(self) -> int:
        return (self.val_questions * self.validations + self.test_questions * self.tests) * self.val_n

    @property
    def eval_share(self) -> float:
        """Evaluation responses over all responses of the run (0 when there are none)."""
        total = self.eval_responses + self.train_responses
        return self.eval_responses / total if total else 0.0

    def line(self, cfg: RunConfig) -> str:
        """The start-up line (module docstring)."""
        t = cfg.trainer
        when = ", ".join(w for w in (
            "step 0" if t.val_before_train else "",
            f"every {t.val_every} steps" if t.val_every and t.val_every < self.steps else "",
            "the end",
        ) if w)
        test = (f" + held-out test: {self.test_questions} question(s) x {self.val_n}, {self.tests} time(s)"
                if self.tests else "")
        text = (
            f"evaluation plan: validation: {self.val_questions} question(s) x {self.val_n} response(s), "
            f"{self.validations} time(s) ({when}){test} = {self.eval_responses} responses; training: {self.steps} "
            f"step(s) x {cfg.rollout.prompts_per_step} prompts x {cfg.rollout.n} = {self.train_responses} rollouts: "
            f"evaluation is {100 * self.eval_share:.0f}% of the responses this run generates"
        )
        if self.eval_share > WARN_SHARE:
            text += (
                " -- most of its generation time; to shorten it lower data.val_size"
                + (" / data.test_size" if self.tests else "")
                + (", set trainer.val_before_train=false" if t.val_before_train else "")
                + (", or raise trainer.val_every" if t.val_every and t.val_every < self.steps else "")
            )
        return text


def evaluation_plan(cfg: RunConfig, *, steps: int, val_questions: int, test_questions: int) -> EvaluationPlan:
    """The evaluation plan of a run of ``steps`` steps from step 0, with the validation and test
    splits as loaded (after the prompt-length filter). ``trainer.val_only`` runs evaluate once."""
    t = cfg.trainer
    if t.val_only:
        return EvaluationPlan(0, 0, val_questions, 1, test_questions, 1 if test_questions else 0, cfg.rollout.val_n)
    periodic_val = (steps - 1) // t.val_every if t.val_every and steps > 0 else 0  # steps < the last
    periodic_test = (steps - 1) // t.test_every if t.test_every and steps > 0 else 0
    return EvaluationPlan(
        steps=steps,
        train_responses=steps * cfg.rollout.prompts_per_step * cfg.rollout.n,
        val_questions=val_questions,
        validations=int(t.val_before_train) + periodic_val + 1,
        test_questions=test_questions,
        tests=(periodic_test + 1) if test_questions else 0,
        val_n=cfg.rollout.val_n,
    )


def log_evaluation_plan(cfg: RunConfig, *, steps: int, val_questions: int, test_questions: int) -> EvaluationPlan:
    """Log :meth:`EvaluationPlan.line` (a warning when evaluation is more than :data:`WARN_SHARE` of
    the responses); returns the plan."""
    plan = evaluation_plan(cfg, steps=steps, val_questions=val_questions, test_questions=test_questions)
    logger.log(logging.WARNING if plan.eval_share > WARN_SHARE else logging.INFO, "%s", plan.line(cfg))
    return plan
