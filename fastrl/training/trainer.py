"""The trainer: builds a run's parts and its train state from the config, and runs the loop.

Parts (:mod:`fastrl.training.parts`): data and prompts, the policy directory the recipe chose,
the actor and the frozen reference policy (megatron-core), the rollout engine, the reward scorer.
State (:class:`~fastrl.checkpoint.train_state.TrainState`): step, data sampler, adaptive rollout
sampler, LR scheduler (built here over the actor's optimizer; the update hands it to the actor),
best validation, train time, invalid-reward counts, the GRESO skipper's history; owned by the
loop, saved by the checkpoint code. The parts hold no run state. :func:`fastrl.training.step.train_step` is the step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fastrl.algorithms.adaptive_sampling import AdaptiveRolloutSampler
from fastrl.checkpoint.config_diff import images_fingerprint, records_fingerprint
from fastrl.checkpoint.signals import StopRequest, trainer_signals
from fastrl.checkpoint.train_state import TrainState
from fastrl.config import RunConfig
from fastrl.data import ResumableSampler
from fastrl.distributed.parallel_state import ParallelContext
from fastrl.training.eval_plan import log_evaluation_plan
from fastrl.training.geometry import updates_per_step_estimate
from fastrl.training.parts import RunParts, build_parts, total_steps
from fastrl.training.prompt_skip import build_prompt_skipper
from fastrl.training.reward_health import RewardHealth
from fastrl.training.run_data import RunData


class Trainer:
    """A FastRL run. Build with a validated :class:`RunConfig` and the initialized parallel
    context; call :meth:`fit`, then :meth:`close`.

    Args:
        config: the run configuration.
        ctx: from :func:`fastrl.distributed.parallel_state.initialize` (the launch's world size
            is checked against the batch layout here).
        run_dir: where metrics, plots and checkpoints go (default ``logging.output_dir/<run name>``).

    Raises:
        ConfigError: the update geometry does not fit the world size.

    The stop signals (``stage.exit_signal``, TERM and INT, i.e. Ctrl-C; a second INT exits at once)
    are caught from the start of the constructor
    (a signal while the parts are built, e.g. during a long warm start, is honoured by
    :meth:`fit` before its first step instead of killing the process) until :meth:`fit` returns.
    """

    def __init__(
        self, config: RunConfig, ctx: ParallelContext, *, run_dir: str | Path | None = None, data: RunData | None = None,
    ) -> None:
        self.cfg = config
        self.ctx = ctx
        self.run_dir = Path(run_dir or config.run_dir)
        config.check_layout(ctx.world_size)
        self.stop = StopRequest(trainer_signals(config.stage.exit_signal), notify=ctx.rank == 0).install()
        try:
            self.parts: RunParts = build_parts(config, ctx, self.run_dir, data)
        except BaseException:
            self.stop.uninstall()
            raise
        from fastrl.training.actor import build_lr_scheduler

        records = self.parts.prompts.records
        steps = total_steps(config, len(records))
        self.state = TrainState(
            sampler=ResumableSampler(len(records), seed=config.data.shuffle_seed),
            ars=AdaptiveRolloutSampler(config.rollout.n, n_min=config.adaptive_sampling.n_min),
            scheduler=build_lr_scheduler(
                self.parts.actor.optimizer, config.optimizer, steps * updates_per_step_estimate(config)
            ),
            total_steps=steps,
            data_fingerprint=records_fingerprint((r.question_id, r.problem, r.answer) for r in records),
            images_fingerprint=images_fingerprint(r.images for r in records),
            reward_health=RewardHealth(config.reward),
            prompt_skipper=build_prompt_skipper(config),
        )
        if ctx.is_logging_rank:  # before any evaluation: how much of the run it will take
            log_evaluation_plan(config, steps=self.state.total_steps, val_questions=len(self.parts.val),
                                test_questions=len(self.parts.test))

    def fit(self) -> dict[str, Any]:
        """Train until the run (or this Slurm stage) ends; returns a summary."""
        from fastrl.training.loop import run_loop

        try:
            return run_loop(self.parts, self.state, self.stop)
        finally:
            self.stop.uninstall()

    def close(self) -> None:
        """Stop the grading workers (and restore the signal handlers if :meth:`fit` did not run)."""
        self.stop.uninstall()
        self.parts.close()


def set_torch_threads(config: RunConfig) -> None:
    """``trainer.torch_threads`` intra-op threads for this process."""
    torch.set_num_threads(config.trainer.torch_threads)
