"""``TrainState``: what the step loop owns and a checkpoint restores exactly.

Everything here is a value or an object with ``state_dict()`` / ``load_state_dict()``; the
checkpoint code saves it without knowing the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class TrainState:
    """The progress of a run.

    Attributes:
        sampler: the resumable prompt sampler (:class:`fastrl.data.ResumableSampler`).
        ars: the adaptive rollout sampler (:class:`fastrl.algorithms.adaptive_sampling.AdaptiveRolloutSampler`).
        scheduler: the run's learning-rate schedule (megatron ``OptimizerParamScheduler`` over the
            actor's optimizer, built by the trainer: ``fastrl.training.actor.build_lr_scheduler``).
            The state owns it (saved as ``scheduler``); the policy update hands it to the actor,
            which sets each update's position on it.
        total_steps: steps of the whole run.
        step: steps completed.
        best_val: best validation accuracy so far (None before the first validation).
        best_step: the step of ``best_val``.
        train_seconds: wall time spent in training steps (validation and start-up excluded), s.
        epochs_completed: data epochs the prompt sampler completed during the last step (drives
            ``adaptive_sampling.period='epoch'``; not saved: a step boundary recomputes it).
        data_fingerprint: digest of the training records this run reads
            (:func:`fastrl.checkpoint.config_diff.records_fingerprint`); saved, and compared at
            resume so that another data file is detected. Like ``total_steps``, the run's own value
            is kept on load.
        images_fingerprint: digest of the training records' images
            (:func:`fastrl.checkpoint.config_diff.images_fingerprint`); saved and compared the same way.
        reward_health: the invalid-reward counts (:class:`fastrl.training.reward_health.RewardHealth`),
            or None; saved when given. A checkpoint written before they were saved loads with the
            counts as they are (zero at the start of a process).
        prompt_skipper: the GRESO-style skipper's per-prompt history
            (:class:`fastrl.algorithms.prompt_skipping.PromptSkipper`, ``pruning.method='greso'``),
            or None; saved when given (a checkpoint that kept it inside the adaptive sampler's state
            loads it from there).
        skipped_updates: optimizer updates skipped over the whole run for a non-finite loss or
            gradient (metric ``actor/skipped_updates_total``; a checkpoint without it loads as 0).
    """

    sampler: Stateful
    ars: Stateful
    scheduler: Stateful
    total_steps: int
    step: int = 0
    best_val: float | None = None
    best_step: int | None = None
    train_seconds: float = 0.0
    epochs_completed: int = 0
    data_fingerprint: str | None = None
    images_fingerprint: str | None = None
    reward_health: Stateful | None = None
    prompt_skipper: Stateful | None = None
    skipped_updates: int = 0

    def state_dict(self) -> dict[str, Any]:
        """The saved part, as stored in ``train_state.pt`` (plus what the checkpoint writer adds)."""
        return {
            "step": self.step,
            "sampler": self.sampler.state_dict(),
            "ars": self.ars.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "best_val": self.best_val,
            "best_step": self.best_step,
            "train_seconds": self.train_seconds,
            "total_steps": self.total_steps,
            "data_fingerprint": self.data_fingerprint,
            "images_fingerprint": self.images_fingerprint,
            "skipped_updates": self.skipped_updates,
            **({"reward_health": self.reward_health.state_dict()} if self.reward_health is not None else {}),
            **({"prompt_skipper": self.prompt_skipper.state_dict()} if self.prompt_skipper is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (``total_steps`` and the fingerprints stay the run's own)."""
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        ars = dict(state["ars"])
        skipper_state = state.get("prompt_skipper", ars.pop("prompt_skipper", None))  # older checkpoints: in ars
        self.ars.load_state_dict(ars)
        if self.prompt_skipper is not None and skipper_state is not None:
            self.prompt_skipper.load_state_dict(skipper_state)
        self.scheduler.load_state_dict(state["scheduler"])
        self.best_val, self.best_step = state["best_val"], state["best_step"]
        self.train_seconds = float(state["train_seconds"])
        self.skipped_updates = int(state.get("skipped_updates", 0))
        if self.reward_health is not None and "reward_health" in state:
            self.reward_health.load_state_dict(state["reward_health"])
