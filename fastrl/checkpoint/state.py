"""Saving and resuming a run exactly: actor (megatron distributed checkpoint) + train state.

A checkpoint directory (published atomically by :class:`CheckpointManager`) holds:

- ``actor/``: megatron-core ``dist_checkpointing`` of the actor's model chunks and (unless
  ``checkpoint.save_optimizer=false``) its optimizer state, sharded by TP/PP/DP as megatron does
  (the DistributedOptimizer in megatron's ``fully_reshardable`` format by default, so a run resumes
  at another TP/PP/DP layout; ``checkpoint.optimizer_format=dp_reshardable`` reshards over DP only);
- ``train_state.pt``: step, data sampler, adaptive sampler, LR scheduler, best validation, wall
  time, and the config it was written with;
- ``rng/rank_XXXXX.pt``: each rank's RNG states (torch CPU/CUDA, Python, numpy, megatron's tracker).

Per-step sampling and pruning seeds are derived from the step number, so a resumed run draws the
same rollouts as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fastrl.checkpoint.manager import CheckpointError, CheckpointManager
from fastrl.distributed import world

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.training.trainer import Trainer

logger = logging.getLogger("fastrl.checkpoint")

TRAIN_STATE = "train_state.pt"
# Keys of the config that must match to resume (the model and its parallel layout).
_STRUCTURAL = ("model",)


def rng_state() -> dict[str, Any]:
    from megatron.core import tensor_parallel

    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _dist_checkpointing():
    """megatron's dist_checkpointing, with the CPU adaptation reaching its modules when active."""
    import importlib

    from megatron.core import dist_checkpointing

    from fastrl.distributed import cpu_compat

    if cpu_compat.applied():
        for name in (
            "megatron.core.dist_checkpointing.strategies.filesystem_async",
            "megatron.core.dist_checkpointing.strategies.torch",
            "megatron.core.dist_checkpointing.strategies.async_utils",
            "megatron.core.dist_checkpointing.exchange_utils",
            "megatron.core.dist_checkpointing.serialization",
        ):
            importlib.import_module(name)
        cpu_compat.apply()
    return dist_checkpointing


def _unwrapped(chunks):
    from megatron.core.utils import unwrap_model

    return unwrap_model(list(chunks))


def actor_sharded_state_dict(
    actor, *, with_optimizer: bool, is_loading: bool, optimizer_format: str = "fully_reshardable"
) -> dict[str, Any]:
    """megatron sharded state dict of the actor's model chunks (+ optimizer in ``optimizer_format``,
    a megatron ``distrib_optim_sharding_type``)."""
    models = _unwrapped(actor.policy.chunks)
    if len(models) == 1:
        model_sd = models[0].sharded_state_dict()
        state = {"model": model_sd}
    else:
        state = {f"model{i}": m.sharded_state_dict() for i, m in enumerate(models)}
        model_sd = {k: v for k, v in state.items()}
    if with_optimizer:
        state["optimizer"] = actor.optimizer.sharded_state_dict(
            model_sd, is_loading=is_loading, metadata={"distrib_optim_sharding_type": optimizer_format}
        )
    return state


def _ensure_optimizer_state(optimizer) -> None:
    """Give a fresh megatron optimizer state tensors to load into (its state is created lazily by
    the first step; the checkpoint's values replace these placeholders in place)."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if len(opt.optimizer.state) > 0:
            continue
        if hasattr(opt, "_init_optimizer_states_with_dummy_values"):
            opt._init_optimizer_states_with_dummy_values()
        else:
            opt.init_state_fn(opt.optimizer, opt.config)


def adam_steps(optimizer) -> list[float]:
    """The Adam ``step`` count of every parameter state (all equal in a healthy optimizer)."""
    out = []
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in opt.optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                out.append(float(state["step"]))
    return out


@contextlib.contextmanager
def _torch_adam_step_tolerated(optimizer):
    """Let megatron's ``fully_reshardable`` loader fill a torch Adam state that has ``step``.

    megatron-core 0.16 copies every key of the destination state (``param``, ``exp_avg``,
    ``exp_avg_sq`` and, with torch's Adam -- no Apex / Transformer Engine -- the per-parameter
    ``step``) from the checkpoint, whose per-parameter entries never hold ``step``: a KeyError.
    Within this block the loader is handed the destination's own ``step`` for that key (a no-op
    copy); :func:`_restore_adam_steps` then sets the count from the train state. With Apex or
    Transformer Engine (``step`` kept per group) nothing changes.
    """
    patched = []
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if not hasattr(opt, "_set_main_param_and_optimizer_states"):
            continue
        original = opt._set_main_param_and_optimizer_states

        def setter(model_param, tensors, _opt=opt, _original=original):
            current = _opt._get_main_param_and_optimizer_states(model_param)
            if "step" in current and "step" not in tensors:
                tensors = {**tensors, "step": current["step"]}
            _original(model_param, tensors)

        opt._set_main_param_and_optimizer_states = setter
        patched.append(opt)
    try:
        yield
    finally:
        for opt in patched:
            del opt._set_main_param_and_optimizer_states


def _restore_adam_steps(optimizer, step: float) -> None:
    """Set every parameter's Adam ``step`` to ``step``, each in its own tensor.

    Without Apex / Transformer Engine, megatron-core 0.16's DistributedOptimizer does not restore
    torch Adam's per-parameter ``step`` from a checkpoint in either format (``dp_reshardable``
    keeps the placeholder's and assigns one shared tensor that torch's Adam then increments once
    per parameter; ``fully_reshardable`` skips it), so the bias correction of a resumed run would
    drift from an uninterrupted one. The count is saved in the train state instead. The
    exact-resume test catches both.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in opt.optimizer.state.values():
            if "exp_avg" in state:
                state["step"] = torch.tensor(float(step), dtype=torch.float32)


class CheckpointIO:
    """Save / resume for a :class:`~fastrl.training.trainer.Trainer`."""

    def __init__(self, trainer: "Trainer") -> None:
        self.t = trainer
        cfg = trainer.cfg.checkpoint
        self.root = Path(cfg.dir) if cfg.dir else trainer.run_dir / "checkpoints"
        self.manager = CheckpointManager(self.root, keep_last=cfg.keep_last)
        self.last_saved_step: int | None = None

    # ---- save -----------------------------------------------------------------------------

    def save(self, *, best: bool = False) -> Path:
        """Write a complete checkpoint of the current step (every rank takes part)."""
        dist_checkpointing = _dist_checkpointing()
        t = self.t
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.manager.root / f".tmp-step_{t.step:08d}"
        if t.ctx.rank == 0:
            staging = self.manager.staging_dir(t.step)
        world.barrier()
        with t.timer.phase("save"):
            (staging / "actor").mkdir(exist_ok=True, parents=True)
            (staging / "rng").mkdir(exist_ok=True)
            state = actor_sharded_state_dict(
                t.actor, with_optimizer=t.cfg.checkpoint.save_optimizer, is_loading=False,
                optimizer_format=t.cfg.checkpoint.optimizer_format,
            )
            dist_checkpointing.save(state, str(staging / "actor"))
            torch.save(rng_state(), staging / "rng" / f"rank_{t.ctx.rank:05d}.pt")
            if t.ctx.rank == 0:
                torch.save(self._train_state(), staging / TRAIN_STATE)
            world.barrier()
            info = None
            if t.ctx.rank == 0:
                info = self.manager.publish(t.step, staging, extra={"recipe": t.cfg.recipe})
                if best:
                    self.manager.mark_best(t.step)
            world.barrier()
        path = self.root / f"step_{t.step:08d}"
        self.last_saved_step = t.step
        if t.ctx.is_logging_rank:
            logger.info("checkpoint saved: %s%s", path, " (best)" if best else "")
        del info
        return path

    def _train_state(self) -> dict[str, Any]:
        t = self.t
        return {
            "step": t.step,
            "sampler": t.sampler.state_dict(),
            "ars": t.ars.state_dict(),
            "scheduler": t.actor.scheduler.state_dict(),
            "best_val": t.best_val,
            "best_step": t.best_step,
            "train_seconds": t.train_seconds,
            "total_steps": t.total_steps,
            "config": t.cfg.to_dict(),
            "world_size": t.ctx.world_size,
            "adam_step": max(adam_steps(t.actor.optimizer), default=0.0),
            "optimizer_format": t.cfg.checkpoint.optimizer_format,
            "parallel": {"tp": t.ctx.tp_size, "pp": t.ctx.pp_size, "dp": t.ctx.dp_size},
        }

    # ---- resume ---------------------------------------------------------------------------

    def resume(self) -> str | None:
        """Load the checkpoint named by ``checkpoint.resume``; returns its path or None."""
        spec = self.t.cfg.checkpoint.resume
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
        self.load(path)
        return str(path)

    def load(self, path: Path) -> None:
        """Restore actor, optimizer, scheduler, samplers, RNG and counters from ``path``.

        Raises:
            CheckpointError: incomplete checkpoint, or one written for another model.
        """
        dist_checkpointing = _dist_checkpointing()
        t = self.t
        CheckpointManager.verify(path)
        state = torch.load(path / TRAIN_STATE, weights_only=False)
        saved_cfg = state["config"]
        for key in _STRUCTURAL:
            if saved_cfg.get(key) != t.cfg.to_dict().get(key):
                raise CheckpointError(
                    f"checkpoint {path} was written for a different {key} section "
                    f"({saved_cfg.get(key)} vs {t.cfg.to_dict().get(key)}); it cannot be loaded into this run"
                )
        with_opt = t.cfg.checkpoint.save_optimizer
        optimizer_format = state.get("optimizer_format", "dp_reshardable")
        saved_layout = state.get("parallel")
        here = {"tp": t.ctx.tp_size, "pp": t.ctx.pp_size, "dp": t.ctx.dp_size}
        if with_opt and optimizer_format == "dp_reshardable" and saved_layout is not None and (
            (saved_layout["tp"], saved_layout["pp"]) != (here["tp"], here["pp"])
        ):
            raise CheckpointError(
                f"checkpoint {path} stores its optimizer state as 'dp_reshardable', written at TP={saved_layout['tp']} "
                f"PP={saved_layout['pp']}; this run uses TP={here['tp']} PP={here['pp']}. Resume at the saved TP/PP "
                "sizes (the DP size may change), or write checkpoints with checkpoint.optimizer_format=fully_reshardable "
                "(the default) to change TP/PP on resume"
            )
        if with_opt:
            _ensure_optimizer_state(t.actor.optimizer)
        sharded = actor_sharded_state_dict(
            t.actor, with_optimizer=with_opt, is_loading=True, optimizer_format=optimizer_format
        )
        try:
            with torch.no_grad():
                loaded = dist_checkpointing.load(sharded, str(path / "actor"))
        except Exception as err:  # megatron raises many kinds; name the checkpoint and the cause
            raise CheckpointError(
                f"cannot load the actor from {path / 'actor'}: {type(err).__name__}: {err}. The checkpoint's "
                f"model or parallel layout does not fit this run (TP/PP resharding is supported; other "
                f"architectures or sizes are not)"
            ) from err
        models = _unwrapped(t.actor.policy.chunks)
        if len(models) == 1:
            models[0].load_state_dict(loaded["model"])
        else:
            for i, m in enumerate(models):
                m.load_state_dict(loaded[f"model{i}"])
        if with_opt:
            with torch.no_grad(), _torch_adam_step_tolerated(t.actor.optimizer):
                t.actor.optimizer.load_state_dict(loaded["optimizer"])
            _restore_adam_steps(t.actor.optimizer, state["adam_step"])
        t.actor.scheduler.load_state_dict(state["scheduler"])
        t.step = int(state["step"])
        t.sampler.load_state_dict(state["sampler"])
        t.ars.load_state_dict(state["ars"])
        t.best_val, t.best_step = state["best_val"], state["best_step"]
        t.train_seconds = float(state["train_seconds"])
        rng_file = path / "rng" / f"rank_{t.ctx.rank:05d}.pt"
        if rng_file.exists() and state.get("world_size") == t.ctx.world_size:
            set_rng_state(torch.load(rng_file, weights_only=False))
        t.refit({})
        if t.ctx.is_logging_rank:
            moved = "" if saved_layout in (None, here) else (
                f" (resharded from TP={saved_layout['tp']} PP={saved_layout['pp']} DP={saved_layout['dp']} "
                f"to TP={here['tp']} PP={here['pp']} DP={here['dp']})"
            )
            logger.info("resumed from %s at step %d (n=%d)%s", path, t.step, t.group_size(), moved)
