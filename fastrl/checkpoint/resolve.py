"""Finding and verifying a checkpoint a user names, and reading its metadata files.

A user names a checkpoint root (``RUN_DIR/checkpoints``: its newest complete step, or
``step_{step:08d}``), one step directory, or an imported checkpoint. Every checkpoint is checked
with :meth:`~fastrl.checkpoint.manager.CheckpointManager.verify` before it is read, so a
truncated or partly copied one fails with a :class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import torch

from fastrl.checkpoint.actor_state import load_model_weights
from fastrl.checkpoint.layout import ACTOR_DIR, COMPLETE_MARKER, IMPORT_INFO, TRAIN_STATE, step_dir_name
from fastrl.checkpoint.manager import CheckpointError, CheckpointManager


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """A verified checkpoint directory.

    Attributes:
        path: the checkpoint directory (``step_XXXXXXXX`` or an imported checkpoint).
        kind: ``"trainer"`` (written by the trainer) or ``"import"`` (by ``convert_checkpoint.py import``).
        step: training step (0 for an imported checkpoint).
    """

    path: Path
    kind: Literal["trainer", "import"]
    step: int


def resolve_checkpoint(ckpt: str | os.PathLike, step: int | None = None) -> ResolvedCheckpoint:
    """Find and verify the checkpoint that ``ckpt`` (and ``step``) name.

    Raises:
        CheckpointError: no such directory, no complete checkpoint, or one that fails
            :meth:`CheckpointManager.verify` (the message names the file).
    """
    path = Path(ckpt)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
    if not (path / COMPLETE_MARKER).exists() and not (path / ACTOR_DIR).exists():
        manager = CheckpointManager(path)
        if step is not None:
            path = path / step_dir_name(step)
        else:
            latest = manager.find_latest()
            if latest is None:
                candidates = sorted(p for p in path.iterdir() if p.is_dir() and p.name.startswith("step_"))
                if candidates:
                    CheckpointManager.verify(candidates[-1])  # raises with the reason
                raise CheckpointError(
                    f"{ckpt} holds no checkpoint: expected a checkpoint root with step_XXXXXXXX "
                    f"directories, a step directory, or a directory made by convert_checkpoint.py import"
                )
            path = latest.path
    elif step is not None and (path / TRAIN_STATE).exists() and not path.name.endswith(f"{step:08d}"):
        raise CheckpointError(f"--step {step} was given but {path} is the checkpoint of another step")
    marker = CheckpointManager.verify(path)
    if not (path / ACTOR_DIR).is_dir():
        raise CheckpointError(f"checkpoint {path} has no {ACTOR_DIR}/ directory (no model weights)")
    if (path / IMPORT_INFO).exists():
        return ResolvedCheckpoint(path=path, kind="import", step=0)
    return ResolvedCheckpoint(path=path, kind="trainer", step=int(marker.get("step", 0)))


def read_train_state(path: Path) -> dict[str, Any]:
    """``train_state.pt`` of a trainer checkpoint, as the dict it was saved as.

    Raises:
        CheckpointError: missing or unreadable (corrupted) file.
    """
    file = Path(path) / TRAIN_STATE
    if not file.is_file():
        raise CheckpointError(f"checkpoint {path}: {TRAIN_STATE} is missing")
    try:
        return torch.load(file, map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises many kinds for a damaged pickle / zip
        raise CheckpointError(f"checkpoint {path}: cannot read {file.name} ({type(err).__name__}: {err}); the file is corrupted") from None


def read_import_info(path: Path) -> dict[str, Any] | None:
    """``fastrl_import.json`` of an imported checkpoint (None when absent).

    Raises:
        CheckpointError: the file is not valid JSON.
    """
    file = Path(path) / IMPORT_INFO
    if not file.exists():
        return None
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"checkpoint {path}: {IMPORT_INFO} is not valid JSON ({err}); the file is corrupted") from None


def load_megatron_checkpoint(chunks: Sequence[Any], path: str | os.PathLike) -> ResolvedCheckpoint:
    """Load the model weights of an imported (or trainer) checkpoint into built model ``chunks``.

    For ``model.megatron_checkpoint``: build the policy from ``path/hf`` with
    ``build_policy(..., load_weights=False)`` at the run's layout, then call this (collective; any
    TP/PP, dist_checkpointing reshards). Optimizer state, if any, is not loaded.

    Raises:
        CheckpointError: incomplete, truncated or corrupted checkpoint (names the file), or one
            holding another model.
    """
    checkpoint = resolve_checkpoint(path)
    load_model_weights(chunks, checkpoint.path / ACTOR_DIR)
    return checkpoint
