"""The step loop: validation, metrics, checkpoints, stage limits and stop signals around
:func:`fastrl.training.step.train_step`.

Stopping (docs/slurm.md, "Contract between the Slurm scripts and the trainer"): a stop request
(``stage.exit_signal`` / TERM, or ``stage.time_limit_s`` running out, which counts from the start
of the loop) is checked, with every rank agreeing, before each training step and before each
chunk of a validation; a stopped validation is abandoned (not logged). The loop then saves a
checkpoint unless nothing changed since the last one: a stage that trained no step keeps the
checkpoint it resumed from, and a run stopped before its first step writes none (nothing was
trained; the next stage starts the run from the beginning).

Training-time budget (``trainer.max_train_time_s``): the run completes (final validation, checkpoint,
test evaluation, ``FINISHED``) after the step at which its training time reaches the budget, and a
run started again with its budget spent trains nothing. Grid checkpoints
(``checkpoint.save_at_train_s`` / ``save_at_steps``, :mod:`fastrl.training.time_grid`) are saved
after the step that reaches each grid point and kept for good.

Finished runs: a run whose checkpoint is at its last step says exactly which key to raise to
train further; a finished run (``RUN_DIR/FINISHED``) resumed with more steps continues, and the
marker is removed when its first new step starts. The records of the steps a run trains again move
to ``metrics.superseded.jsonl`` only after that decision (a run with nothing to do moves none).

Non-finite updates: the actor skips an optimizer update whose loss or gradient is not finite
(:meth:`fastrl.training.actor.Actor.step`); the loop counts them over the run
(``actor/skipped_updates_total``) and stops with :class:`NonFiniteUpdatesError` naming the step
after ``trainer.max_skipped_updates`` in a row.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastrl.checkpoint.io import CheckpointIO
from fastrl.checkpoint.train_state import TrainState
from fastrl.distributed import world
from fastrl.training.generation import group_size, sleep_engine
from fastrl.training.metrics import MetricsLogger, supersede_records_after
from fastrl.training.parts import RunParts, total_steps
from fastrl.training.rollout_log import rollout_files, write_rollouts
from fastrl.training.step import train_step
from fastrl.training.time_grid import grid_save_due, time_budget_spent
from fastrl.training.update_phase import refit, release_cached_memory
from fastrl.training.validation import ValidationStopped, validate_policy

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.checkpoint.signals import StopRequest

logger = logging.getLogger("fastrl.trainer")

#: Written into the run directory when training is complete (slurm/submit.sh and train.sbatch read
#: it; docs/slurm.md, "Contract between the Slurm scripts and the trainer").
FINISHED_FILE = "FINISHED"


def write_finished(run_dir: Path, step: int) -> None:
    """Atomically write ``RUN_DIR/FINISHED`` as JSON ``{step, finished_at, slurm_job_id}``."""
    payload = {
        "step": step,
        "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
    tmp = run_dir / f".{FINISHED_FILE}.tmp"
    tmp.write_text(json.dumps(payload) + "\n")
    os.replace(tmp, run_dir / FINISHED_FILE)


def _progress(run: RunParts, state: TrainState):
    if not (run.cfg.logging.progress_bar and run.ctx.is_logging_rank):
        return None
    from tqdm import tqdm

    return tqdm(total=state.total_steps, initial=state.step, desc="train", dynamic_ncols=True, mininterval=1.0)


def _ars_decision(state: TrainState) -> dict[str, float]:
    return {f"ars/{k}": float(v) for k, v in state.ars.last_decision.items() if isinstance(v, (int, float))}


def end_period_if_due(run: RunParts, state: TrainState, epochs_completed: int) -> dict[str, float]:
    """End the adaptive sampler's period when ``adaptive_sampling.period`` says so; its metrics."""
    a = run.cfg.adaptive_sampling
    if not a.enabled:
        return {}
    due = (a.period == "steps" and state.step % a.period_steps == 0) or (a.period == "epoch" and epochs_completed > 0)
    # A boundary at the final step would choose an n that no step uses (and log it as if it acted):
    # the run's last period ends with the run; its per-step ars/f1, ars/f2 are in the step metrics.
    due = due and state.step < state.total_steps
    if not (due and state.ars.num_recorded > 0):
        return {}
    new_n = state.ars.end_period(state.step / max(state.total_steps, 1))
    if run.ctx.is_logging_rank:
        logger.info("step %d: adaptive sampling period ended, n -> %d", state.step, new_n)
    return {"ars/new_n": float(new_n), **_ars_decision(state)}


def resume(run: RunParts, state: TrainState, io: CheckpointIO) -> str | None:
    """Continue from the checkpoint ``checkpoint.resume`` names (the engine gets its weights: put to
    sleep first, so that on a GPU the refit wakes the weights alone, not the KV cache the freshly
    started engine holds beside the loaded optimizer state)."""
    path = io.resume(state, run.actor)
    if path is None:
        return None
    release_cached_memory(run.ctx.device)
    sleep_engine(run.engine)
    refit(run.engine, run.actor)
    if run.ctx.is_logging_rank:
        logger.info("resumed from %s at step %d (n=%d)%s", path, state.step, group_size(run.cfg, state.ars), io.reshard_note)
    return str(path)


def _extend_hint(run: RunParts, step: int) -> str:
    """What to set to train past ``step``: e.g. ``trainer.max_steps=4 (now 2)``."""
    t = run.cfg.trainer
    per_epoch = total_steps(dataclasses.replace(run.cfg, trainer=dataclasses.replace(t, epochs=1, max_steps=None)), len(run.prompts.records))
    target = step + max(step, 1)
    parts = []
    if t.max_steps is not None and t.max_steps < target:
        parts.append(f"trainer.max_steps={target} (now {t.max_steps})")
    if t.epochs * per_epoch < target:
        parts.append(f"trainer.epochs={-(-target // per_epoch)} (now {t.epochs}, {per_epoch} steps per epoch)")
    return " and ".join(parts)


def _already_complete(run: RunParts, state: TrainState, resumed: str | None) -> bool:
    """True (after saying why, and what to change to train further) when there is nothing to train."""
    marker = run.run_dir / FINISHED_FILE
    if state.step < state.total_steps and not time_budget_spent(run.cfg.trainer.max_train_time_s, state.train_seconds):
        no_checkpoint = marker.exists() and resumed is None
        if no_checkpoint and run.ctx.is_logging_rank:
            logger.info(
                "training already complete (%s exists) but no checkpoint was found to continue from; nothing to do. "
                "Remove %s to train this run again from the start", marker, marker,
            )
        return no_checkpoint
    budget = run.cfg.trainer.max_train_time_s
    if state.step < state.total_steps and run.ctx.is_logging_rank:  # stopped by its training-time budget
        logger.info(
            "training already complete at step %d: its training time, %.0f s, reached trainer.max_train_time_s=%g; "
            "nothing to do. To train further, raise trainer.max_train_time_s (and delete %s under Slurm)",
            state.step, state.train_seconds, budget, marker,
        )
        if not marker.exists():
            write_finished(run.run_dir, state.step)
        return True
    if run.ctx.is_logging_rank:
        past = f"; the checkpoint is past this config's total of {state.total_steps} steps" if state.step > state.total_steps else ""
        logger.info(
            "training already complete at step %d (of %d)%s; nothing to do. To train further, raise the run length: "
            "%s (the run resumes at step %d, and the LR schedule's decay horizon follows the new total). Under Slurm, "
            "also delete %s first: slurm/submit.sh and train.sbatch stop at it",
            state.step, state.total_steps, past, _extend_hint(run, state.step), state.step, marker,
        )
        if not marker.exists():
            write_finished(run.run_dir, state.step)
    return True


class NonFiniteUpdatesError(RuntimeError):
    """``trainer.max_skipped_updates`` optimizer updates in a row were skipped (non-finite loss or gradient)."""


def count_skipped_updates(run: RunParts, state: TrainState, m: dict[str, float]) -> dict[str, float]:
    """Add the step's skipped optimizer updates (``actor/update_skipped`` is their fraction of the
    step's ``actor/updates``) to ``state.skipped_updates``; returns ``actor/skipped_updates_total``
    (the run's running count, as megatron-LM's skipped-iterations counter). Logs a warning for a
    step that skipped any."""
    skipped = round(m.get("actor/update_skipped", 0.0) * m.get("actor/updates", 0.0))
    state.skipped_updates += skipped
    if skipped and run.ctx.is_logging_rank:
        logger.warning(
            "step %d: %d of %d optimizer update(s) skipped: the loss (actor/loss=%s) or a gradient is not finite; "
            "the weights are unchanged by them (%d skipped in a row, the run stops at trainer.max_skipped_updates=%d)",
            state.step, skipped, int(m.get("actor/updates", 0)), m.get("actor/loss"), run.actor.skipped_in_a_row,
            run.cfg.trainer.max_skipped_updates,
        )
    return {"actor/skipped_updates_total": float(state.skipped_updates)}


def stop_if_updates_keep_failing(run: RunParts, state: TrainState, m: dict[str, float]) -> None:
    """Raise when the last ``trainer.max_skipped_updates`` optimizer updates were all skipped.

    Raises:
        NonFiniteUpdatesError: naming the step and the loss; the newest checkpoint holds the last
            finite state (a checkpoint is never written from non-finite weights, :mod:`fastrl.checkpoint.io`).
    """
    limit = run.cfg.trainer.max_skipped_updates
    in_a_row = run.actor.skipped_in_a_row
    if in_a_row >= limit:
        raise NonFiniteUpdatesError(
            f"step {state.step}: the last {in_a_row} optimizer updates were skipped because the loss (actor/loss="
            f"{m.get('actor/loss')}) or a gradient was not finite (trainer.max_skipped_updates={limit}); training "
            "diverged: lower optimizer.lr, set optimizer.clip_grad, or check the rewards and data of these steps"
        )


def _metrics_logger(run: RunParts) -> MetricsLogger:
    cfg = run.cfg
    return MetricsLogger(
        run.run_dir, tensorboard=cfg.logging.tensorboard, wandb_project=cfg.logging.wandb_project,
        run_name=cfg.logging.run_name or cfg.recipe, config=cfg.to_dict(), enabled=run.ctx.is_logging_rank,
    )


def set_aside_records(run: RunParts, step: int) -> None:
    """Move the metrics and rollout records after ``step`` (which this run trains again) to their
    ``.superseded.jsonl`` files. Called once the run has decided to train (never for a run that is
    already complete or only validates); rank 0 sets aside every rank's records (also of DP ranks a
    resume at a smaller DP size lacks), and every rank stops when it fails."""
    failed: Exception | None = None
    own = [run.run_dir / "metrics.jsonl", *rollout_files(run.run_dir)] if run.ctx.is_logging_rank else []
    try:
        for path in own:
            moved, superseded = supersede_records_after(path, step)
            if moved:
                logger.info(
                    "%s: %d record(s) after step %d, which this run trains again, moved to %s",
                    path.name, moved, step, superseded,
                )
    except (OSError, ValueError) as err:
        failed = err
    if world.any_rank(failed is not None):  # every rank stops, none waits in a collective
        raise failed or RuntimeError("another rank could not set aside its records of the steps trained again")


def run_loop(run: RunParts, state: TrainState, stop: "StopRequest") -> dict[str, Any]:
    cfg, ctx = run.cfg, run.ctx
    stage_start = time.monotonic()

    def stop_due() -> bool:
        """True on every rank once a stop signal arrived on any rank or this stage's time is up."""
        if cfg.stage.time_limit_s is not None and time.monotonic() - stage_start >= cfg.stage.time_limit_s:
            stop.request("stage.time_limit_s")
        return world.any_rank(stop.requested)

    io = CheckpointIO(cfg, ctx, run_dir=run.run_dir, phase=run.timer.phase)
    resumed = resume(run, state, io)
    summary: dict[str, Any] = {"resumed_from": resumed, "run_dir": str(run.run_dir)}
    if io.config_changes:
        summary["config_changes"] = [c.describe() for c in io.config_changes]
    if cfg.trainer.val_only:
        log = _metrics_logger(run)
        if run.start_metrics:
            log.log(state.step, run.start_metrics, kind="start")
        val = _validate(run, state, stop, stop_due)
        if val is not None:
            log.log(state.step, val, kind="val")
            _print_val(run, state.step, val)
        else:
            summary["stopped_by"] = stop.reason or "signal"
        test = _test(run, state, log, stop, stop_due) if val is not None and run.test else None
        log.close()
        summary.update({"step": state.step, "val_only": True, "val_end": val, "test_end": test})
        return summary
    if _already_complete(run, state, resumed):  # decided before any record is moved or written
        summary["already_complete"] = True
        return summary
    set_aside_records(run, state.step)
    log = _metrics_logger(run)
    extending = (run.run_dir / FINISHED_FILE).exists()  # a finished run resumed with a longer run length
    if extending and ctx.is_logging_rank:
        logger.info(
            "extending a finished run: %s says training ended at step %d; this config trains to step %d "
            "(the marker is removed when step %d starts)", run.run_dir / FINISHED_FILE, state.step, state.total_steps,
            state.step + 1,
        )
    if state.step == 0:
        if run.start_metrics or run.data_metrics:
            log.log(0, {**run.start_metrics, **run.data_metrics}, kind="start")
        if cfg.trainer.val_before_train:
            val = _validate(run, state, stop, stop_due)
            if val is not None:
                state.best_val = val["val/accuracy"]
                log.log(0, val, kind="val")
                summary["val_start"] = val
                _print_val(run, 0, val)
    stage_steps, period_ended = 0, False
    bar = _progress(run, state)
    last_val: dict[str, float] | None = None
    budget_spent = time_budget_spent(cfg.trainer.max_train_time_s, state.train_seconds)
    while state.step < state.total_steps and not budget_spent:
        if stop_due():
            logger.info("stop requested (%s) before step %d", stop.reason or "signal on another rank", state.step + 1)
            summary["stopped_by"] = stop.reason or "signal"
            break
        if cfg.stage.max_steps is not None and stage_steps >= cfg.stage.max_steps:
            summary["stopped_by"] = "stage.max_steps"
            break
        if extending:
            if ctx.is_logging_rank:
                (run.run_dir / FINISHED_FILE).unlink(missing_ok=True)
                logger.info("removed %s: the run continues past step %d", run.run_dir / FINISHED_FILE, state.step)
            extending = False
        state.step += 1
        stage_steps += 1
        out = train_step(run, state, state.step)
        before_s = state.train_seconds
        if out.rollouts:
            write_rollouts(run.run_dir, ctx.dp_rank, list(out.rollouts), pruning=dataclasses.asdict(cfg.pruning))
        m = dict(out.metrics)
        m.update(count_skipped_updates(run, state, m))
        m.update({f"time/{k}": v for k, v in run.timer.pop().items()})
        # the slowest rank's step time on every rank: the budget and the grid below decide alike everywhere
        m["time/step"] = world.max_over_ranks(m["time/step"])
        state.train_seconds += m["time/step"]
        m["time/train_elapsed"] = state.train_seconds
        budget_spent = time_budget_spent(cfg.trainer.max_train_time_s, state.train_seconds)
        last = state.step >= state.total_steps or budget_spent  # the final step: its validation and test follow the loop
        m.update(end_period_if_due(run, state, out.epochs_completed))
        if bar is not None:
            bar.set_postfix(reward=f"{m['reward/mean']:.3f}", kept=f"{m.get('prune/kept_fraction', 1.0):.2f}", n=int(m["rollout/n"]))
            bar.update(1)
        if cfg.trainer.val_every and state.step % cfg.trainer.val_every == 0 and not last:
            last_val = _validate_and_track(run, state, log, io, stop, stop_due)
        if cfg.trainer.test_every and state.step % cfg.trainer.test_every == 0 and not last:
            _test(run, state, log, stop, stop_due)  # the final one follows the final validation
        if cfg.checkpoint.save_every and state.step % cfg.checkpoint.save_every == 0 and state.step < state.total_steps:
            if io.last_saved_step != state.step:  # a new best at this step was just saved
                io.save(state, run.actor)
        ck = cfg.checkpoint
        if grid_save_due(ck.save_at_train_s, ck.save_at_steps, step=state.step, before_s=before_s,
                         after_s=state.train_seconds):
            io.save(state, run.actor, keep=True)  # kept for good (a save of this step just made is replaced)
        # checkpoint saves (time/save) are charged to the step that saved, outside its time/step
        m.update({f"time/{k}": v for k, v in run.timer.pop().items() if k != "step"})
        log.log(state.step, m)
        stop_if_updates_keep_failing(run, state, m)
    if bar is not None:
        bar.close()
    finished = state.step >= state.total_steps or budget_spent
    if budget_spent:
        summary["stopped_by"] = "trainer.max_train_time_s"
    a = cfg.adaptive_sampling
    if a.enabled and a.period == "stage" and cfg.stage.end_period_at_stage_end and not finished and state.ars.num_recorded:
        new_n = state.ars.end_period(state.step / max(state.total_steps, 1))
        logger.info("stage ended at step %d: adaptive sampling n -> %d for the next stage", state.step, new_n)
        log.log(state.step, {"ars/new_n": float(new_n), **_ars_decision(state)}, kind="stage_end")
        period_ended = True
    if finished:
        last_val = _validate_and_track(run, state, log, io, stop, stop_due)
        if last_val is None and ctx.is_logging_rank:
            logger.info("the final validation was stopped; validate the final checkpoint with trainer.val_only=true")
    if stage_steps == 0 and not period_ended:
        # Nothing changed since the checkpoint this stage resumed from (or, at step 0, nothing was
        # trained): no save (a save before the first optimizer step would also fail in megatron's
        # DistributedOptimizer, whose state does not exist yet).
        if ctx.is_logging_rank:
            if state.step == 0:
                logger.info(
                    "stopped before the first training step: nothing was trained and no checkpoint is written; "
                    "the next stage starts this run from the beginning"
                )
            else:
                logger.info("no training step in this stage: the checkpoint of step %d holds this state; nothing to save", state.step)
        summary["nothing_trained"] = True
    elif io.last_saved_step != state.step:  # the final step may just have been saved as the best
        io.save(state, run.actor)
    test = None
    if finished and run.test and last_val is not None:
        # once, on the final policy, after its checkpoint is saved (a stop here loses no training)
        test = _test(run, state, log, stop, stop_due)
        if test is None and ctx.is_logging_rank:
            logger.info("the held-out test evaluation was stopped; evaluate the final checkpoint with trainer.val_only=true")
    if finished and ctx.is_logging_rank:
        write_finished(run.run_dir, state.step)
    log.close()
    summary.update({"step": state.step, "finished": finished, "val_end": last_val, "test_end": test,
                    "train_seconds": state.train_seconds})
    return summary


def _print_val(run: RunParts, step: int, val: dict[str, float], split: str = "val") -> None:
    if run.ctx.is_logging_rank:
        p = f"{split}/"
        types = "  ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in sorted(val.items()) if k.startswith(p + "accuracy/"))
        logger.info(
            "%s @ step %d: accuracy %.4f (+-%.4f) format %.3f  [%s]  (%d questions, %.1f s)",
            "validation" if split == "val" else "held-out test", step, val[p + "accuracy"],
            val[p + "accuracy_stderr"], val[p + "format_rate"], types, int(val[p + "questions"]), val[p + "time_s"],
        )


def _validate(
    run: RunParts, state: TrainState, stop: "StopRequest", should_stop, split: str = "val"
) -> dict[str, float] | None:
    """:func:`validate_policy` on ``split``, or None (logged) when a stop request abandons it."""
    if run.ctx.is_logging_rank:
        logger.info("%s %d questions @ step %d", "validating" if split == "val" else "held-out test: evaluating",
                    len(run.val if split == "val" else run.test), state.step)
    try:
        return validate_policy(run, should_stop=should_stop, split=split, step=state.step)
    except ValidationStopped as stopped:
        if run.ctx.is_logging_rank:
            logger.info(
                "%s @ step %d stopped (%s) after %d of %d questions; its partial result is not logged",
                "validation" if split == "val" else "held-out test evaluation", state.step,
                stop.reason or "signal on another rank", stopped.done, stopped.total,
            )
        return None


def _test(run: RunParts, state: TrainState, log: MetricsLogger, stop: "StopRequest", should_stop) -> dict[str, float] | None:
    """The held-out test evaluation of the current policy (``data.test_size``), logged as kind
    ``test``; never a checkpoint decision (nothing is chosen on the test split)."""
    test = _validate(run, state, stop, should_stop, split="test")
    if test is not None:
        log.log(state.step, {**test, "time/train_elapsed": state.train_seconds}, kind="test")
        _print_val(run, state.step, test, split="test")
    return test


def _validate_and_track(
    run: RunParts, state: TrainState, log: MetricsLogger, io: CheckpointIO, stop: "StopRequest", should_stop
) -> dict[str, float] | None:
    val = _validate(run, state, stop, should_stop)
    if val is None:
        return None
    log.log(state.step, {**val, "time/train_elapsed": state.train_seconds}, kind="val")
    _print_val(run, state.step, val)
    if state.best_val is None or val["val/accuracy"] > state.best_val:
        state.best_val = val["val/accuracy"]
        state.best_step = state.step
        io.save(state, run.actor, best=True)
    return val
