"""``run(config)``: what ``python -m fastrl.train`` does after parsing the config."""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fastrl.config import RunConfig

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.checkpoint.run_lock import RunDirLock


def log_file(config: RunConfig) -> Path:
    """This process's log file: ``RUN_DIR/train.log`` on rank 0 (everything it prints),
    ``RUN_DIR/train.rank<R>.log`` on the others (their warnings and errors). ``fastrl.train``
    appends the traceback of an error after start-up to it."""
    rank = int(os.environ.get("RANK", "0"))
    return config.run_dir / ("train.log" if rank == 0 else f"train.rank{rank}.log")


def _setup_logging(rank: int, file: Path | None = None, *, hold: bool = False) -> None:
    """Console logging, and the run's log ``file`` (appended: a chained run's stages share it).
    ``hold``: the file's records are held in memory until :func:`open_run_log` (after the run
    directory's lock is taken), so a trainer refused by the lock writes nothing into the log of
    the trainer that holds it."""
    level = logging.INFO if rank == 0 else logging.WARNING
    fmt = f"%(asctime)s [rank {rank}] %(name)s: %(message)s"
    logging.basicConfig(level=level, format=fmt, datefmt="%H:%M:%S", stream=sys.stdout)
    for noisy in ("megatron", "transformers", "megatron.bridge", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if file is None:
        return
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_fastrl_run_log", False)]:
        root.removeHandler(old)
        old.close()
    if hold:
        handler: logging.Handler = logging.handlers.MemoryHandler(capacity=1 << 30, flushLevel=logging.CRITICAL + 1)
        handler._fastrl_held_log = (file, level, fmt)  # type: ignore[attr-defined]
    else:
        file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(file, mode="a", encoding="utf-8")
        handler.setFormatter(logging.Formatter(fmt, datefmt="%Y-%m-%d %H:%M:%S"))
    handler.setLevel(level)
    handler._fastrl_run_log = True  # type: ignore[attr-defined]
    root.addHandler(handler)


def open_run_log() -> None:
    """Write the records :func:`_setup_logging` held to the run's log file and log there from now on."""
    root = logging.getLogger()
    for held in [h for h in root.handlers if getattr(h, "_fastrl_held_log", None)]:
        file, level, fmt = held._fastrl_held_log  # type: ignore[attr-defined]
        file.parent.mkdir(parents=True, exist_ok=True)
        target = logging.FileHandler(file, mode="a", encoding="utf-8")
        target.setLevel(level)
        target.setFormatter(logging.Formatter(fmt, datefmt="%Y-%m-%d %H:%M:%S"))
        target._fastrl_run_log = True  # type: ignore[attr-defined]
        held.setTarget(target)
        held.flush()
        root.removeHandler(held)
        held.close()
        root.addHandler(target)


def source_wait_timeout_s(config: RunConfig) -> float:
    """Seconds the peers of a model-parallel group may wait for its first rank working alone (the
    wait group's timeout, :func:`fastrl.distributed.parallel_state.model_parallel_wait_group`): its
    engine's start and one engine request, again for each restart ``rollout.engine_restart_retries``
    allows, plus 10 minutes for scoring and saving."""
    ro = config.rollout
    return (1 + ro.engine_restart_retries) * (ro.engine_startup_timeout_s + ro.engine_timeout_s) + 600.0


def lock_run_dir(run_dir: Path, rank: int) -> "RunDirLock | None":
    """Global rank 0 takes ``run_dir``'s lock (:mod:`fastrl.checkpoint.run_lock`) before anything in
    it is read or moved; every rank learns whether it could (one MAX all-reduce), so all stop together.

    Returns:
        the lock on rank 0 (release it at exit), None on the other ranks.

    Raises:
        RunDirLocked: another trainer holds ``run_dir`` (rank 0: the holder's pid, host and start
            time; the other ranks: that rank 0 was refused).
    """
    from fastrl.checkpoint.run_lock import RunDirLock, RunDirLocked
    from fastrl.distributed import world

    lock, refused = None, None
    if rank == 0:
        try:
            lock = RunDirLock(run_dir).acquire()
        except RunDirLocked as err:
            refused = err
    if world.any_rank(refused is not None):
        if lock is not None:
            lock.release()
        raise refused or RunDirLocked(f"rank 0 could not lock the run directory {run_dir} (its log says why)")
    return lock


def run(config: RunConfig) -> int:
    """Train ``config`` to completion (or to the end of this Slurm stage); return an exit code.

    Exit code 0: finished, the stage budget was reached, or a stop signal was honoured after a
    save. Errors propagate (non-zero exit), so a chained Slurm run stops; among them
    :class:`~fastrl.checkpoint.run_lock.RunDirLocked` when another trainer holds the run directory
    (:func:`lock_run_dir`; the lock is held until the trainer is closed).
    """
    from fastrl.compat.upstream_warnings import filter_benign_upstream_warnings

    filter_benign_upstream_warnings()  # before the upstream imports that issue them
    from fastrl.distributed.session import distributed_session, export_launch_env

    export_launch_env()
    _setup_logging(int(os.environ.get("RANK", "0")), log_file(config), hold=True)  # written once the lock is ours
    from fastrl.training.run_data import load_run_data

    data = load_run_data(config)  # data-file errors first: before the heavy imports and the model build
    from fastrl.training.trainer import Trainer, set_torch_threads

    start = time.time()
    set_torch_threads(config)
    lock = None
    try:
        with distributed_session(config.parallel, seed=config.trainer.seed, wait_timeout_s=source_wait_timeout_s(config)) as ctx:
            lock = lock_run_dir(config.run_dir, ctx.rank)
            open_run_log()
            trainer = Trainer(config, ctx, data=data)
            try:
                summary = trainer.fit()
            finally:
                trainer.close()
        if trainer.ctx.is_logging_rank:
            _report(config, trainer.run_dir, summary, start)
    finally:
        if lock is not None:
            lock.release()
    return 0


def _report(config: RunConfig, run_dir: Path, summary: dict, start: float) -> None:
    """Write ``run_dir/summary.json`` (with the wall time since ``start``), log where things are, plot."""
    log = logging.getLogger("fastrl.train")
    summary["wall_seconds"] = time.time() - start
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    log.info("run directory: %s", run_dir)
    log.info("metrics: %s", run_dir / "metrics.jsonl")
    if summary.get("val_only"):
        return
    log.info("checkpoints: %s", run_dir / "checkpoints")
    _plot(config, run_dir, log)
    start_acc = (summary.get("val_start") or {}).get("val/accuracy")
    end_acc = (summary.get("val_end") or {}).get("val/accuracy")
    if start_acc is not None and end_acc is not None:
        log.info("validation accuracy: %.4f before RL -> %.4f after (%+.2f points)", start_acc, end_acc, 100 * (end_acc - start_acc))


def _plot(config: RunConfig, run_dir: Path, log: logging.Logger) -> None:
    """Draw ``run_dir``'s metrics to ``run_dir/plots`` unless ``logging.plots`` is false."""
    if not config.logging.plots:
        log.info("no plots (logging.plots=false)")
        return
    try:
        from fastrl.training.plots import plot

        plots = plot(run_dir, run_dir / "plots")
        log.info("plots: %s", ", ".join(str(p) for p in plots))
    except ValueError as err:  # no training step in this stage
        log.info("no plots: %s", err)
