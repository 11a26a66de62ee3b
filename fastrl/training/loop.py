"""The step loop: validation, metrics, checkpoints, stage limits and stop signals around
:func:`fastrl.training.step.train_step`."""

from __future__ import annotations

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
from fastrl.training.generation import group_size
from fastrl.training.metrics import MetricsLogger
from fastrl.training.parts import RunParts
from fastrl.training.step import train_step
from fastrl.training.update_phase import refit
from fastrl.training.validation import validate_policy

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
    if not (due and state.ars.num_recorded > 0):
        return {}
    new_n = state.ars.end_period(state.step / max(state.total_steps, 1))
    if run.ctx.is_logging_rank:
        logger.info("step %d: adaptive sampling period ended, n -> %d", state.step, new_n)
    return {"ars/new_n": float(new_n), **_ars_decision(state)}


def resume(run: RunParts, state: TrainState, io: CheckpointIO) -> str | None:
    """Continue from the checkpoint ``checkpoint.resume`` names (the engine gets its weights)."""
    path = io.resume(state, run.actor)
    if path is None:
        return None
    refit(run.engine, run.actor)
    if run.ctx.is_logging_rank:
        logger.info("resumed from %s at step %d (n=%d)%s", path, state.step, group_size(run.cfg, state.ars), io.reshard_note)
    return str(path)


def run_loop(run: RunParts, state: TrainState, stop: "StopRequest") -> dict[str, Any]:
    cfg, ctx = run.cfg, run.ctx
    io = CheckpointIO(cfg, ctx, run_dir=run.run_dir, phase=run.timer.phase)
    resumed = resume(run, state, io)
    log = MetricsLogger(
        run.run_dir, tensorboard=cfg.logging.tensorboard, wandb_project=cfg.logging.wandb_project,
        run_name=cfg.logging.run_name or cfg.recipe, config=cfg.to_dict(), enabled=ctx.is_logging_rank,
    )
    summary: dict[str, Any] = {"resumed_from": resumed, "run_dir": str(run.run_dir)}
    if cfg.trainer.val_only:
        if run.start_metrics:
            log.log(state.step, run.start_metrics, kind="start")
        val = validate_policy(run)
        log.log(state.step, val, kind="val")
        _print_val(run, state.step, val)
        log.close()
        summary.update({"step": state.step, "val_only": True, "val_end": val})
        return summary
    if (run.run_dir / FINISHED_FILE).exists() or state.step >= state.total_steps:
        logger.info("training already complete at step %d (of %d); nothing to do", state.step, state.total_steps)
        summary["already_complete"] = True
        return summary
    if state.step == 0:
        if run.start_metrics or run.data_metrics:
            log.log(0, {**run.start_metrics, **run.data_metrics}, kind="start")
        if cfg.trainer.val_before_train:
            val = validate_policy(run)
            state.best_val = val["val/accuracy"]
            log.log(0, val, kind="val")
            summary["val_start"] = val
            _print_val(run, 0, val)
    stage_start, stage_steps = time.monotonic(), 0
    bar = _progress(run, state)
    last_val: dict[str, float] | None = None
    while state.step < state.total_steps:
        if world.any_rank(stop.requested):
            logger.info("stop requested (%s): saving and exiting", stop.reason or "signal on another rank")
            summary["stopped_by"] = stop.reason or "signal"
            break
        if cfg.stage.max_steps is not None and stage_steps >= cfg.stage.max_steps:
            summary["stopped_by"] = "stage.max_steps"
            break
        if cfg.stage.time_limit_s is not None and time.monotonic() - stage_start >= cfg.stage.time_limit_s:
            summary["stopped_by"] = "stage.time_limit_s"
            break
        state.step += 1
        stage_steps += 1
        out = train_step(run, state, state.step)
        m = dict(out.metrics)
        m.update({f"time/{k}": v for k, v in run.timer.pop().items()})
        state.train_seconds += m["time/step"]
        m["time/train_elapsed"] = state.train_seconds
        m.update(end_period_if_due(run, state, out.epochs_completed))
        log.log(state.step, m)
        if bar is not None:
            bar.set_postfix(reward=f"{m['reward/mean']:.3f}", kept=f"{m.get('prune/kept_fraction', 1.0):.2f}", n=int(m["rollout/n"]))
            bar.update(1)
        if cfg.trainer.val_every and state.step % cfg.trainer.val_every == 0 and state.step < state.total_steps:
            last_val = _validate_and_track(run, state, log, io)
        if cfg.checkpoint.save_every and state.step % cfg.checkpoint.save_every == 0 and state.step < state.total_steps:
            if io.last_saved_step != state.step:  # a new best at this step was just saved
                io.save(state, run.actor)
    if bar is not None:
        bar.close()
    finished = state.step >= state.total_steps
    a = cfg.adaptive_sampling
    if a.enabled and a.period == "stage" and cfg.stage.end_period_at_stage_end and not finished and state.ars.num_recorded:
        new_n = state.ars.end_period(state.step / max(state.total_steps, 1))
        logger.info("stage ended at step %d: adaptive sampling n -> %d for the next stage", state.step, new_n)
        log.log(state.step, {"ars/new_n": float(new_n), **_ars_decision(state)}, kind="stage_end")
    if finished:
        last_val = _validate_and_track(run, state, log, io)
    if io.last_saved_step != state.step:  # the final step may just have been saved as the best
        io.save(state, run.actor)
    if finished and ctx.is_logging_rank:
        write_finished(run.run_dir, state.step)
    log.close()
    summary.update({"step": state.step, "finished": finished, "val_end": last_val, "train_seconds": state.train_seconds})
    return summary


def _print_val(run: RunParts, step: int, val: dict[str, float]) -> None:
    if run.ctx.is_logging_rank:
        types = "  ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in sorted(val.items()) if k.startswith("val/accuracy/"))
        logger.info(
            "validation @ step %d: accuracy %.4f (+-%.4f) format %.3f  [%s]  (%d questions, %.1f s)",
            step, val["val/accuracy"], val["val/accuracy_stderr"], val["val/format_rate"], types,
            int(val["val/questions"]), val["val/time_s"],
        )


def _validate_and_track(run: RunParts, state: TrainState, log: MetricsLogger, io: CheckpointIO) -> dict[str, float]:
    val = validate_policy(run)
    log.log(state.step, {**val, "time/train_elapsed": state.train_seconds}, kind="val")
    _print_val(run, state.step, val)
    if state.best_val is None or val["val/accuracy"] > state.best_val:
        state.best_val = val["val/accuracy"]
        state.best_step = state.step
        io.save(state, run.actor, best=True)
    return val
