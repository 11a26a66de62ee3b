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

from fastrl.distributed import world

from fastrl.training.metrics import MetricsLogger
from fastrl.training.step import train_step

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.checkpoint.signals import StopRequest
    from fastrl.training.trainer import Trainer

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


def _progress(t: "Trainer"):
    if not (t.cfg.logging.progress_bar and t.ctx.is_logging_rank):
        return None
    from tqdm import tqdm

    return tqdm(total=t.total_steps, initial=t.step, desc="train", dynamic_ncols=True, mininterval=1.0)


def run_loop(t: "Trainer", stop: "StopRequest") -> dict[str, Any]:
    from fastrl.checkpoint.state import CheckpointIO

    cfg = t.cfg
    io = CheckpointIO(t)
    resumed = io.resume()
    log = MetricsLogger(
        t.run_dir, tensorboard=cfg.logging.tensorboard, wandb_project=cfg.logging.wandb_project,
        run_name=cfg.logging.run_name or cfg.recipe, config=cfg.to_dict(), enabled=t.ctx.is_logging_rank,
    )
    summary: dict[str, Any] = {"resumed_from": resumed, "run_dir": str(t.run_dir)}
    if cfg.trainer.val_only:
        if t.start_metrics:
            log.log(t.step, t.start_metrics, kind="start")
        val = t.validate()
        log.log(t.step, val, kind="val")
        _print_val(t, t.step, val)
        log.close()
        summary.update({"step": t.step, "val_only": True, "val_end": val})
        return summary
    if (t.run_dir / FINISHED_FILE).exists() or t.step >= t.total_steps:
        logger.info("training already complete at step %d (of %d); nothing to do", t.step, t.total_steps)
        summary["already_complete"] = True
        return summary
    if t.step == 0:
        if t.start_metrics or t.data_metrics:
            log.log(0, {**t.start_metrics, **t.data_metrics}, kind="start")
        if cfg.trainer.val_before_train:
            val = t.validate()
            t.best_val = val["val/accuracy"]
            log.log(0, val, kind="val")
            summary["val_start"] = val
            _print_val(t, 0, val)
    stage_start, stage_steps = time.monotonic(), 0
    bar = _progress(t)
    last_val: dict[str, float] | None = None
    while t.step < t.total_steps:
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
        t.step += 1
        stage_steps += 1
        m = train_step(t, t.step)
        m.update({f"time/{k}": v for k, v in t.timer.pop().items()})
        t.train_seconds += m["time/step"]
        m["time/train_elapsed"] = t.train_seconds
        t.end_period_if_due(m)
        log.log(t.step, m)
        if bar is not None:
            bar.set_postfix(reward=f"{m['reward/mean']:.3f}", kept=f"{m.get('prune/kept_fraction', 1.0):.2f}", n=int(m["rollout/n"]))
            bar.update(1)
        if cfg.trainer.val_every and t.step % cfg.trainer.val_every == 0 and t.step < t.total_steps:
            last_val = _validate_and_track(t, log, io)
        if cfg.checkpoint.save_every and t.step % cfg.checkpoint.save_every == 0 and t.step < t.total_steps:
            if io.last_saved_step != t.step:  # a new best at this step was just saved
                io.save()
    if bar is not None:
        bar.close()
    finished = t.step >= t.total_steps
    a = cfg.adaptive_sampling
    if a.enabled and a.period == "stage" and cfg.stage.end_period_at_stage_end and not finished and t.ars.num_recorded:
        new_n = t.ars.end_period(t.step / max(t.total_steps, 1))
        logger.info("stage ended at step %d: adaptive sampling n -> %d for the next stage", t.step, new_n)
        decision = {f"ars/{k}": float(v) for k, v in t.ars.last_decision.items() if isinstance(v, (int, float))}
        log.log(t.step, {"ars/new_n": float(new_n), **decision}, kind="stage_end")
    if finished:
        last_val = _validate_and_track(t, log, io, final=True)
    if io.last_saved_step != t.step:  # the final step may just have been saved as the best
        io.save()
    if finished and t.ctx.is_logging_rank:
        write_finished(t.run_dir, t.step)
    log.close()
    summary.update({"step": t.step, "finished": finished, "val_end": last_val, "train_seconds": t.train_seconds})
    return summary


def _print_val(t: "Trainer", step: int, val: dict[str, float]) -> None:
    if t.ctx.is_logging_rank:
        types = "  ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in sorted(val.items()) if k.startswith("val/accuracy/"))
        logger.info(
            "validation @ step %d: accuracy %.4f (+-%.4f) format %.3f  [%s]  (%d questions, %.1f s)",
            step, val["val/accuracy"], val["val/accuracy_stderr"], val["val/format_rate"], types,
            int(val["val/questions"]), val["val/time_s"],
        )


def _validate_and_track(t: "Trainer", log: MetricsLogger, io, *, final: bool = False) -> dict[str, float]:
    val = t.validate()
    log.log(t.step, {**val, "time/train_elapsed": t.train_seconds}, kind="val")
    _print_val(t, t.step, val)
    if t.best_val is None or val["val/accuracy"] > t.best_val:
        t.best_val = val["val/accuracy"]
        t.best_step = t.step
        io.save(best=True)
    return val
