"""Saving and resuming a run exactly: the actor (megatron distributed checkpoint) + the train state.

A checkpoint (published atomically by :class:`~fastrl.checkpoint.manager.CheckpointManager`; file
names in :mod:`fastrl.checkpoint.layout`) holds the actor and, unless
``checkpoint.save_optimizer=false``, its optimizer state (:mod:`fastrl.checkpoint.actor_state`);
``train_state.pt`` with the :class:`~fastrl.checkpoint.train_state.TrainState`, the config it was
written with, the layout and the Adam step count; and each rank's RNG states. Per-step sampling
and pruning seeds derive from the step number, so a resumed run draws the same rollouts as an
uninterrupted one.

Resuming compares the checkpoint's config with this run's and logs every changed key
(:mod:`fastrl.checkpoint.config_diff` classifies them): harmless and layout changes are accepted,
optimizer / schedule / run-length changes are applied (the LR scheduler keeps only the
checkpoint's step count; the Adam hyper-parameters of the restored param groups are reset from the
config), and any other change, or training data whose content digest differs, is refused with a
:class:`CheckpointError` unless ``checkpoint.allow_changed`` names it.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import torch

from fastrl.checkpoint import config_diff
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
    from fastrl.config import OptimizerConfig
    from fastrl.distributed.parallel_state import ParallelContext

logger = logging.getLogger("fastrl.checkpoint")

#: A save is refused when its filesystem has less free space than the newest checkpoint took times this.
SPACE_MARGIN = 1.1


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
        # rank 0 deletes old checkpoints in the background: the other ranks wait at the save's barrier
        self.manager = CheckpointManager(self.root, keep_last=config.checkpoint.keep_last,
                                         background_delete=ctx.rank == 0)
        self.phase = phase or (lambda name: contextlib.nullcontext())
        self.last_saved_step: int | None = None
        #: After a resume: " (resharded from TP=.. PP=.. DP=.. to ...)" when the layout changed, else "".
        self.reshard_note = ""
        #: After a resume: the config keys that changed since the checkpoint (all accepted).
        self.config_changes: list[config_diff.ConfigChange] = []

    # ---- save -----------------------------------------------------------------------------

    def save(self, state: TrainState, actor: Any, *, best: bool = False, keep: bool = False) -> Path:
        """Write a complete checkpoint of ``state.step`` (every rank takes part); its marker records
        the run's training seconds (``train_seconds``).

        ``actor``: has ``policy.chunks`` (megatron model chunks) and ``optimizer`` (megatron).
        ``keep``: keep it for good (a grid checkpoint, ``checkpoint.save_at_train_s`` /
        ``save_at_steps``): ``keep_last`` never deletes it.
        """
        ctx = self.ctx
        self._refuse_non_finite(state.step, actor)
        self._refuse_short_of_space(state.step)
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.manager.root / f".tmp-{step_dir_name(state.step)}"
        if ctx.rank == 0:
            staging = self.manager.staging_dir(state.step)
        try:
            self._write(state, actor, staging, best=best, keep=keep)
        except BaseException:
            if ctx.rank == 0:  # a failed save (full disk, an interrupt) leaves no partial staging folder
                shutil.rmtree(staging, ignore_errors=True)
            raise
        path = self.root / step_dir_name(state.step)
        self.last_saved_step = state.step
        if ctx.is_logging_rank:
            logger.info("checkpoint saved: %s%s", path, " (best)" if best else "")
        return path

    def _refuse_non_finite(self, step: int, actor: Any) -> None:
        """Raise (on every rank) when any rank's model weights hold a NaN or an infinity.

        Raises:
            CheckpointError: naming ``step``; nothing is written, ``latest`` keeps its checkpoint.
        """
        local_bad = any(not bool(torch.isfinite(p.detach()).all()) for chunk in actor.policy.chunks for p in chunk.parameters())
        if world.any_rank(local_bad):
            latest = self.manager.find_latest() if self.ctx.rank == 0 else None
            keep = f"; the newest checkpoint, {latest.path}, is unchanged" if latest is not None else ""
            raise CheckpointError(
                f"step {step}: the policy's weights hold non-finite values (NaN or inf), so no checkpoint is written "
                f"(a resume would load them){keep}. The updates diverged: lower optimizer.lr or set optimizer.clip_grad"
            )

    def _refuse_short_of_space(self, step: int) -> None:
        """Raise (on every rank) when the checkpoint root's filesystem has less free space than the
        newest checkpoint took times :data:`SPACE_MARGIN` (the same model and optimizer: about the
        size of the next one), after making room when it is short (:meth:`CheckpointManager.make_room`:
        the background deletions finished and retention applied, so a lowered ``keep_last`` takes
        effect). Without an earlier checkpoint there is nothing to go by and nothing is checked; a
        save that then fills the disk still leaves no partial folder. Rank 0's filesystem is
        checked: the checkpoint root is one shared directory.

        Raises:
            CheckpointError: naming the step, the bytes needed and free, and the root; nothing is
                written and the newest checkpoint is unchanged.
        """
        def check() -> None:
            latest = self.manager.find_latest()
            if latest is None:
                return
            took = self.manager.checkpoint_bytes(latest)
            free = self.manager.free_bytes()
            if free < took * SPACE_MARGIN:  # deletions still running, a lowered keep_last, stale folders
                self.manager.make_room()
                free = self.manager.free_bytes()
            if free < took * SPACE_MARGIN:
                raise CheckpointError(
                    f"step {step}: the filesystem of {self.root} has {free / 2**30:.2f} GiB free and a checkpoint "
                    f"takes about {took / 2**30:.2f} GiB (the newest, {latest.path}), so none is written; that one "
                    f"is unchanged. Free space there, lower checkpoint.keep_last or save fewer checkpoints for good "
                    f"(checkpoint.save_at_steps / save_at_train_s), or set checkpoint.dir to a larger filesystem; "
                    f"then resume"
                )

        world.computed_on_rank0(check, what=f"checking the free space for the checkpoint of step {step}")

    def _write(self, state: TrainState, actor: Any, staging: Path, *, best: bool, keep: bool) -> None:
        """Every rank writes its part into ``staging``; rank 0 publishes it (``keep``: for good)."""
        ctx, ck = self.ctx, self.cfg.checkpoint
        world.barrier()
        with self.phase("save"):
            (staging / ACTOR_DIR).mkdir(exist_ok=True, parents=True)
            (staging / RNG_DIR).mkdir(exist_ok=True)
            save_actor(
                actor.policy.chunks, actor.optimizer if ck.save_optimizer else None, staging / ACTOR_DIR,
                optimizer_format=ck.optimizer_format, parallel_group=ctx.dp_group if ck.fully_parallel_save else None,
            )
            torch.save(rng_state(), staging / RNG_DIR / rng_file_name(ctx.rank))
            world.barrier()  # every rank's part is written

            def publish() -> None:
                torch.save(self._train_state(state, actor), staging / TRAIN_STATE)
                self.manager.publish(state.step, staging, keep=keep,
                                     extra={"recipe": self.cfg.recipe, "train_seconds": state.train_seconds})
                if best:
                    self.manager.mark_best(state.step)

            world.computed_on_rank0(publish, what=f"publishing the checkpoint of step {state.step}")

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
        allow = self.cfg.checkpoint.allow_changed
        unknown = config_diff.unknown_patterns(allow, config_diff.flatten(self.cfg.to_dict()))
        if unknown:
            raise CheckpointError(
                f"checkpoint.allow_changed names {unknown}, which are neither config keys nor sections "
                f"(use dotted keys such as data.train_path, sections such as data, or {' / '.join(config_diff.FINGERPRINT_KEYS)})"
            )
        if spec == "none":
            return None
        if spec == "auto":
            latest = self.manager.find_latest()
            if self.ctx.is_logging_rank:
                for damaged, why in self.manager.damaged_after(latest.step if latest is not None else -1):
                    logger.warning(
                        "checkpoint %s is skipped: %s. Resuming from %s; the next save of that step replaces it",
                        damaged, why, latest.path if latest is not None else "the start (no complete checkpoint)",
                    )
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
            CheckpointError: incomplete checkpoint; a refused config change since the checkpoint
                (:mod:`fastrl.checkpoint.config_diff`: the model, data or its content digest, the
                algorithm, ... unless ``checkpoint.allow_changed`` names them); or a
                ``dp_reshardable`` optimizer state at another TP/PP layout.
        """
        ctx = self.ctx
        CheckpointManager.verify(path)
        saved = torch.load(path / TRAIN_STATE, weights_only=False)
        changes = self._compare_configs(path, saved, state)
        saved_opt = saved["config"].get("checkpoint", {}).get("save_optimizer", True)
        with_opt = self.cfg.checkpoint.save_optimizer and saved_opt
        if not with_opt and ctx.is_logging_rank:
            why = "holds no optimizer state (written with checkpoint.save_optimizer=false)" if not saved_opt else (
                "has an optimizer state that this config does not load (checkpoint.save_optimizer=false)"
            )
            logger.warning(
                "checkpoint %s %s: Adam restarts from zero moments at step %d, so this resume "
                "is not exact (the first updates take larger steps); keep checkpoint.save_optimizer=true for exact "
                "resume", path, why, int(saved["step"]),
            )
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
        if optimizer is None and actor.optimizer is not None:
            # bf16 / fp8: the optimizer's fp32 main weights still hold the weights it was built from;
            # without this the first step would copy them over the loaded ones (megatron's own
            # load_checkpoint does the same when it skips the optimizer; a no-op in fp32)
            with torch.no_grad():
                actor.optimizer.reload_model_params()
        if optimizer is not None:
            with torch.no_grad(), torch_adam_step_tolerated(optimizer):
                optimizer.load_state_dict(loaded["optimizer"])
            restore_adam_steps(optimizer, saved["adam_step"])
        state.load_state_dict(self._adapt_sampler_state(saved, state, changes))
        if optimizer is not None:
            reapply_optimizer_settings(optimizer, self.cfg.optimizer)
        state.scheduler.step(increment=0)  # the LR / weight decay of the new config at the saved step
        if any(c.kind == config_diff.SCHEDULE for c in changes) and ctx.is_logging_rank:
            self._log_schedule(state, saved)
        self.config_changes = changes
        rng_file = path / RNG_DIR / rng_file_name(ctx.rank)
        if rng_file.exists() and saved.get("world_size") == ctx.world_size:
            set_rng_state(torch.load(rng_file, weights_only=False))
        self.reshard_note = "" if saved_layout in (None, here) else (
            f" (resharded from TP={saved_layout['tp']} PP={saved_layout['pp']} DP={saved_layout['dp']} "
            f"to TP={here['tp']} PP={here['pp']} DP={here['dp']})"
        )

    # ---- resume rules ---------------------------------------------------------------------

    def _compare_configs(self, path: Path, saved: dict[str, Any], state: TrainState) -> list[config_diff.ConfigChange]:
        """Log every config key changed since the checkpoint; raise on a refused change."""
        old_cfg, new_cfg = dict(saved["config"]), self.cfg.to_dict()
        fingerprints = {"fingerprint": "data_fingerprint", "images_fingerprint": "images_fingerprint"}
        for key, field in fingerprints.items():
            if saved.get(field) is not None:
                old_cfg["data"] = {**old_cfg.get("data", {}), key: saved[field]}
            if getattr(state, field) is not None:
                new_cfg["data"] = {**new_cfg["data"], key: getattr(state, field)}
        changes = config_diff.diff_configs(old_cfg, new_cfg, allow_changed=self.cfg.checkpoint.allow_changed)
        if self.ctx.is_logging_rank:
            if changes:
                logger.info("config changed since checkpoint %s: %d key(s)", path, len(changes))
            for change in changes:
                (logger.info if change.accepted else logger.error)("config change: %s", change.describe())
            for field, what in (("data_fingerprint", "training-data"), ("images_fingerprint", "training-image")):
                if saved.get(field) is None and getattr(state, field) is not None:
                    logger.warning(
                        "checkpoint %s stores no %s fingerprint (written by an older FastRL): "
                        "cannot check that the %s is the same", path, what, what.replace("-", " "),
                    )
        bad = config_diff.refused(changes)
        if bad and self.cfg.trainer.val_only:
            if self.ctx.is_logging_rank:
                logger.warning(
                    "trainer.val_only: nothing is trained or saved, so the changed %s are accepted for this validation",
                    ", ".join(c.key for c in bad),
                )
            bad = []
        if bad:
            raise CheckpointError(config_diff.refusal_message(path, bad))
        return changes

    def _adapt_sampler_state(self, saved: dict[str, Any], state: TrainState, changes: list[config_diff.ConfigChange]) -> dict[str, Any]:
        """With an accepted ``data.*`` change (``checkpoint.allow_changed``) the prompt sampler may
        now cover another number of prompts or another seed: continue the saved epoch at the same
        fraction of it, in the new order (prompts of this epoch may repeat or be skipped)."""
        sampler, old = state.sampler, saved.get("sampler")
        if not (isinstance(old, dict) and any(c.allowed and c.key.startswith("data.") for c in changes)):
            return saved
        keys = ("num_items", "seed", "shuffle")
        if not all(hasattr(sampler, k) for k in keys) or all(old.get(k) == getattr(sampler, k) for k in keys):
            return saved
        new = dict(old, **{k: getattr(sampler, k) for k in keys})
        new["position"] = int(old.get("position", 0)) * sampler.num_items // max(int(old.get("num_items", 1)), 1)
        if self.ctx.is_logging_rank:
            logger.warning(
                "training data changed (allowed by checkpoint.allow_changed): the prompt sampler continues epoch %d "
                "at prompt %d of %d (was %d of %d, seed %s -> %s); prompts of this epoch may repeat or be skipped",
                new.get("epoch", 0), new["position"], sampler.num_items, old.get("position", 0), old.get("num_items"),
                old.get("seed"), sampler.seed,
            )
        return {**saved, "sampler": new}

    def _log_schedule(self, state: TrainState, saved: dict[str, Any]) -> None:
        sched = state.scheduler
        if saved.get("total_steps") is not None and saved["total_steps"] != state.total_steps:
            logger.info("run length: %d -> %d training steps", saved["total_steps"], state.total_steps)
        old = saved.get("scheduler", {})
        logger.info(
            "LR schedule applied from the new config at optimizer step %d: peak lr %g (was %g), min lr %g (was %g), "
            "warm-up %d (was %d), %s decay over %d optimizer steps (was %s over %d); lr now %g",
            sched.num_steps, sched.max_lr, old.get("max_lr", float("nan")), sched.min_lr, old.get("min_lr", float("nan")),
            sched.lr_warmup_steps, old.get("lr_warmup_steps", -1), sched.lr_decay_style, sched.lr_decay_steps,
            old.get("lr_decay_style"), old.get("lr_decay_steps", -1), current_lr(sched),
        )


def current_lr(scheduler: Any) -> float:
    """The learning rate the scheduler set on the first param group."""
    groups = scheduler.optimizer.param_groups
    return float(groups[0]["lr"]) if groups else float("nan")


def reapply_optimizer_settings(optimizer: Any, o: "OptimizerConfig") -> None:
    """Set this run's Adam hyper-parameters on the param groups a checkpoint restored.

    megatron's optimizer ``load_state_dict`` restores every param group as saved, including
    ``max_lr`` / ``min_lr`` (read by the LR scheduler), ``betas``, ``eps`` and ``weight_decay``;
    without this, a changed ``optimizer.*`` value would silently keep the checkpoint's. A no-op
    when the config is unchanged (the same values are written back). Call the scheduler's
    ``step(increment=0)`` afterwards to set the LR and weight decay from them.
    """
    for group in optimizer.param_groups:
        if "max_lr" in group:
            group["max_lr"] = o.lr
        if "min_lr" in group:
            group["min_lr"] = o.min_lr
        if "betas" in group:
            group["betas"] = (o.adam_beta1, o.adam_beta2)
        if "eps" in group:
            group["eps"] = o.adam_eps
