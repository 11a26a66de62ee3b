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


def run(config: RunConfig) -> int:
    """Train ``config`` to completion (or to the end of this Slurm stage); return an exit code."""
    import os

    _setup_logging(int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))))
    from fastrl.distributed import parallel_state
    from fastrl.training.trainer import Trainer

    start = time.time()
    trainer = Trainer(config)
    try:
        summary = trainer.fit()
    finally:
        trainer.close()
        parallel_state.destroy()
    if trainer.ctx.is_logging_rank:
        log = logging.getLogger("fastrl.train")
        summary["wall_seconds"] = time.time() - start
        (trainer.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        log.info("run directory: %s", trainer.run_dir)
        log.info("metrics: %s", trainer.run_dir / "metrics.jsonl")
        log.info("checkpoints: %s", trainer.run_dir / "checkpoints")
        start_acc = (summary.get("val_start") or {}).get("val/accuracy")
        end_acc = (summary.get("val_end") or {}).get("val/accuracy")
        if start_acc is not None and end_acc is not None:
            log.info("validation accuracy: %.4f before RL -> %.4f after (%+.2f points)", start_acc, end_acc, 100 * (end_acc - start_acc))
    return 0
