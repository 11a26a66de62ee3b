"""Saving and resuming a run exactly: the actor (megatron distributed checkpoint) + the train state.

A checkpoint (published atomically by :class:`~fastrl.checkpoint.manager.CheckpointManager`; file
names in :mod:`fastrl.checkpoint.layout`) holds the actor and, unless
``checkpoint.save_optimizer=false``, its optimizer state (:mod:`fastrl.checkpoint.actor_state`);
``train_state.pt`` with the :class:`~fastrl.checkpoint.train_state.TrainState`, the config it was
written with, the layout and the Adam step count; and each rank's RNG states. Per-step sampling
and pruning seeds derive from the step number, so a resumed run draws the same rollouts as an
uninterrupted one.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import torch

from fastrl.checkpoint.actor_state import load_actor, rng_state, save_actor, set_rng_state
from fastrl.checkpoint.layout import ACTOR_DIR, RNG_DIR, TRAIN_STATE, rng_file_name, step_dir_name
from fastrl.checkpoint.manager import CheckpointError, CheckpointManager
from fastrl.checkpoint.train_state import TrainState
from fastrl.compat.megatron_optimizer import (
    adam_steps,
    ensure_optimizer_state,
    restore_adam_steps,
    torch_adam_step_tolerated,
)
from fastrl.config import RunConfig
from fastrl.distributed import world

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.distributed.parallel_state import ParallelContext

logger = logging.getLogger("fastrl.checkpoint")

# Sections of the config that must match to resume (the model).
_STRUCTURAL = ("model",)


class CheckpointIO:
    """Save / resume of one run's actor and :class:`TrainState`.

    Args:
        config: the run's config (checkpoint settings; stored in every checkpoint).
        ctx: the parallel context (ranks and layout).
        root: checkpoint root (default ``checkpoint.dir`` or ``run_dir/checkpoints``).
        phase: a context-manager factory charging the save time to a timing phase (``timer.phase``).
    """

    def __init__(
        self, config: RunConfig, ctx: "ParallelContext", *, run_dir: Path,
        phase: Callable[[str], ContextManager[Any]] | None = None,
    ) -> None:
        self.cfg = config
        self.ctx = ctx
        self.root = Path(config.checkpoint.dir) if config.checkpoint.dir else Path(run_dir) / "checkpoints"
        self.manager = CheckpointManager(self.root, keep_last=config.checkpoint.keep_last)
        self.phase = phase or (lambda name: contextlib.nullcontext())
        self.last_saved_step: int | None = None
        #: After a resume: " (resharded from TP=.. PP=.. DP=.. to ...)" when the layout changed, else "".
        self.reshard_note = ""

    # ---- save -----------------------------------------------------------------------------

    def save(self, state: TrainState, actor: Any, *, best: bool = False) -> Path:
        """Write a complete checkpoint of ``state.step`` (every rank takes part).

        ``actor``: has ``policy.chunks`` (megatron model chunks) and ``optimizer`` (megatron).
        """
        ctx, ck = self.ctx, self.cfg.checkpoint
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.manager.root / f".tmp-{step_dir_name(state.step)}"
        if ctx.rank == 0:
            staging = self.manager.staging_dir(state.step)
        world.barrier()
        with self.phase("save"):
            (staging / ACTOR_DIR).mkdir(exist_ok=True, parents=True)
            (staging / RNG_DIR).mkdir(exist_ok=True)
            save_actor(
                actor.policy.chunks, actor.optimizer if ck.save_optimizer else None, staging / ACTOR_DIR,
                optimizer_format=ck.optimizer_format,
            )
            torch.save(rng_state(), staging / RNG_DIR / rng_file_name(ctx.rank))
            if ctx.rank == 0:
                torch.save(self._train_state(state, actor), staging / TRAIN_STATE)
            world.barrier()
            if ctx.rank == 0:
                self.manager.publish(state.step, staging, extra={"recipe": self.cfg.recipe})
                if best:
                    self.manager.mark_best(state.step)
            world.barrier()
        path = self.root / step_dir_name(state.step)
        self.last_saved_step = state.step
        if ctx.is_logging_rank:
            logger.info("checkpoint saved: %s%s", path, " (best)" if best else "")
        return path

    def _train_state(self, state: TrainState, actor: Any) -> dict[str, Any]:
        ctx = self.ctx
        return {
            **state.state_dict(),
            "config": self.cfg.to_dict(),
            "world_size": ctx.world_size,
            "adam_step": max(adam_steps(actor.optimizer), default=0.0),
            "optimizer_format": self.cfg.checkpoint.optimizer_format,
            "parallel": {"tp": ctx.tp_size, "pp": ctx.pp_size, "dp": ctx.dp_size},
        }

    # ---- resume ---------------------------------------------------------------------------

    def resume(self, state: TrainState, actor: Any) -> Path | None:
        """Load the checkpoint named by ``checkpoint.resume`` into ``state`` and ``actor``;
        returns its path, or None when there is nothing to resume."""
        spec = self.cfg.checkpoint.resume
        if spec == "none":
            return None
        if spec == "auto":
            latest = self.manager.find_latest()
            if latest is None:
                return None
            path = latest.path
        else:
            path = Path(spec)
            CheckpointManager.verify(path)
        self.load(path, state, actor)
        return path

    def load(self, path: Path, state: TrainState, actor: Any) -> None:
        """Restore actor, optimizer, train state and this rank's RNG from ``path``.

        Raises:
            CheckpointError: incomplete checkpoint, one written for another model, or a
                ``dp_reshardable`` optimizer state at another TP/PP layout.
        """
        ctx = self.ctx
        CheckpointManager.verify(path)
        saved = torch.load(path / TRAIN_STATE, weights_only=False)
        saved_cfg, here_cfg = saved["config"], self.cfg.to_dict()
        for key in _STRUCTURAL:
            if saved_cfg.get(key) != here_cfg.get(key):
                raise CheckpointError(
                    f"checkpoint {path} was written for a different {key} section "
                    f"({saved_cfg.get(key)} vs {here_cfg.get(key)}); it cannot be loaded into this run"
                )
        with_opt = self.cfg.checkpoint.save_optimizer
        optimizer_format = saved.get("optimizer_format", "dp_reshardable")
        saved_layout = saved.get("parallel")
        here = {"tp": ctx.tp_size, "pp": ctx.pp_size, "dp": ctx.dp_size}
        if with_opt and optimizer_format == "dp_reshardable" and saved_layout is not None and (
            (saved_layout["tp"], saved_layout["pp"]) != (here["tp"], here["pp"])
        ):
            raise CheckpointError(
                f"checkpoint {path} stores its optimizer state as 'dp_reshardable', written at TP={saved_layout['tp']} "
                f"PP={saved_layout['pp']}; this run uses TP={here['tp']} PP={here['pp']}. Resume at the saved TP/PP "
                "sizes (the DP size may change), or write checkpoints with checkpoint.optimizer_format=fully_reshardable "
                "(the default) to change TP/PP on resume"
            )
        optimizer = actor.optimizer if with_opt else None
        if optimizer is not None:
            ensure_optimizer_state(optimizer)
        loaded = load_actor(actor.policy.chunks, optimizer, path / ACTOR_DIR, optimizer_format=optimizer_format)
        if optimizer is not None:
            with torch.no_grad(), torch_adam_step_tolerated(optimizer):
                optimizer.load_state_dict(loaded["optimizer"])
            restore_adam_steps(optimizer, saved["adam_step"])
        state.load_state_dict(saved)
        rng_file = path / RNG_DIR / rng_file_name(ctx.rank)
        if rng_file.exists() and saved.get("world_size") == ctx.world_size:
            set_rng_state(torch.load(rng_file, weights_only=False))
        self.reshard_note = "" if saved_layout in (None, here) else (
            f" (resharded from TP={saved_layout['tp']} PP={saved_layout['pp']} DP={saved_layout['dp']} "
            f"to TP={here['tp']} PP={here['pp']} DP={here['dp']})"
        )
