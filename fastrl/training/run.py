"""``run(config)``: what ``python -m fastrl.train`` does after parsing the config."""

from __future__ import annotations

import json
import logging
import sys
import time

from fastrl.config import RunConfig


def _setup_logging(rank: int) -> None:
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(
        level=level, format=f"%(asctime)s [rank {rank}] %(name)s: %(message)s", datefmt="%H:%M:%S", stream=sys.stdout
    )
    for noisy in ("megatron", "transformers", "megatron.bridge", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _export_launch_env() -> None:
    """Under srun or mpirun, set the ``env://`` variables torch.distributed reads (torchrun sets them)."""
    from fastrl.distributed.launch import export_torch_env, launch_info_from_env

    info = launch_info_from_env()
    if info.launcher in ("slurm", "mpi"):
        export_torch_env(info)


def run(config: RunConfig) -> int:
    """Train ``config`` to completion (or to the end of this Slurm stage); return an exit code.

    Exit code 0: finished, the stage budget was reached, or a stop signal was honoured after a
    save. Errors propagate (non-zero exit), so a chained Slurm run stops.
    """
    import os

    _export_launch_env()
    _setup_logging(int(os.environ.get("RANK", "0")))
    from fastrl.distributed import parallel_state
    from fastrl.distributed.launch import finalize_mpi
    from fastrl.training.trainer import Trainer, set_torch_threads

    start = time.time()
    set_torch_threads(config)
    ctx = parallel_state.initialize(config.parallel, seed=config.trainer.seed)
    trainer = Trainer(config, ctx)
    try:
        summary = trainer.fit()
    finally:
        trainer.close()
    parallel_state.destroy()
    finalize_mpi()
    if trainer.ctx.is_logging_rank:
        log = logging.getLogger("fastrl.train")
        summary["wall_seconds"] = time.time() - start
        (trainer.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        log.info("run directory: %s", trainer.run_dir)
        log.info("metrics: %s", trainer.run_dir / "metrics.jsonl")
        if summary.get("val_only"):
            return 0
        log.info("checkpoints: %s", trainer.run_dir / "checkpoints")
        try:
            from fastrl.training.plots import plot

            plots = plot(trainer.run_dir, trainer.run_dir / "plots")
            log.info("plots: %s", ", ".join(str(p) for p in plots))
        except ValueError as err:  # no training step in this stage
            log.info("no plots: %s", err)
        start_acc = (summary.get("val_start") or {}).get("val/accuracy")
        end_acc = (summary.get("val_end") or {}).get("val/accuracy")
        if start_acc is not None and end_acc is not None:
            log.info("validation accuracy: %.4f before RL -> %.4f after (%+.2f points)", start_acc, end_acc, 100 * (end_acc - start_acc))
    return 0
