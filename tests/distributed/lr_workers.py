"""Worker of tests/distributed/test_lr_horizon.py (importable by spawned processes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from workers import make_train_batch

from fastrl.config import OptimizerConfig, ParallelConfig, PrecisionConfig, RunConfig


def lr_horizon_worker(hf_dir: Path, *, refill_to: str, prompts_per_step: int, mini_batch_prompts: int, n: int,
                      kept_per_step: list[int], lr: float = 1e-4, min_lr: float = 1e-5) -> dict[str, Any]:
    """A cosine-LR run of ``len(kept_per_step)`` RL steps through the trainer's
    :func:`~fastrl.training.update_phase.update_policy`, step ``s`` updating on
    ``kept_per_step[s - 1]`` kept rollouts (split evenly over the DP ranks), with the LR horizon
    the trainer gives the train state's schedule (``steps x updates_per_step_estimate``).

    Returns the updates each step made, the schedule position after each step, the LR after the
    last update, the scheduler's horizon and final position.
    """
    from fastrl.distributed import parallel_state
    from fastrl.models.provider import build_policy
    from fastrl.training.actor import Actor, build_lr_scheduler
    from fastrl.training.geometry import step_geometry, updates_per_step_estimate
    from fastrl.training.update_phase import update_policy

    parallel = ParallelConfig(backend="gloo", micro_batch_size=1)
    ctx = parallel_state.initialize(parallel, seed=1)
    base = RunConfig()
    cfg = dataclasses.replace(
        base,
        parallel=parallel,
        rollout=dataclasses.replace(base.rollout, prompts_per_step=prompts_per_step, n=n),
        pruning=dataclasses.replace(base.pruning, refill_to=refill_to),
        trainer=dataclasses.replace(base.trainer, mini_batch_prompts=mini_batch_prompts),
        optimizer=OptimizerConfig(lr=lr, min_lr=min_lr, lr_decay_style="cosine", weight_decay=0.0),
    )
    policy = build_policy(hf_dir, parallel=parallel, precision=PrecisionConfig(mode="fp32"), trainable=True)
    actor = Actor(
        policy, algorithm=cfg.algorithm, optimizer=cfg.optimizer, parallel=parallel, precision=cfg.precision,
    )  # fmt: skip
    scheduler = build_lr_scheduler(actor.optimizer, cfg.optimizer, len(kept_per_step) * updates_per_step_estimate(cfg))
    updates, positions = [], []
    for step, kept in enumerate(kept_per_step, start=1):
        batch = make_train_batch(hf_dir, n=kept)
        share = kept // ctx.dp_size
        mine = batch.select(range(ctx.dp_rank * share, (ctx.dp_rank + 1) * share))
        plan = step_geometry(cfg, ctx.dp_size, n).plan_update(mine.lengths, step=step)
        m = update_policy(mine, actor, plan, scheduler=scheduler)
        updates.append(int(m["actor/updates"]))
        positions.append(scheduler.num_steps)
    return {
        "updates": updates,
        "positions": positions,
        "final_lr": float(actor.optimizer.param_groups[0]["lr"]),
        "horizon": scheduler.lr_decay_steps,
        "final_position": scheduler.num_steps,
        "per_step": updates_per_step_estimate(cfg),
    }
