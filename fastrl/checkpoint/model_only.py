"""Dropping a kept checkpoint's optimizer state: the model-only checkpoint that evaluation and export read.

A trainer checkpoint holds the actor's weights and the DistributedOptimizer's state: fp32 main
weights, Adam's ``exp_avg`` and ``exp_avg_sq``, so about 4x the weights of an fp32 model (SmolLM2-135M:
2.15 GB, of which 0.54 GB are the weights) and 7x those of a bf16 one. Checkpoints kept for good on a
training-time grid (``checkpoint.save_at_train_s``) are only evaluated or exported afterwards, which
reads the weights alone; Megatron-LM's ``--no-save-optim`` makes the same cut at save time.

:func:`drop_optimizer` rewrites one complete trainer checkpoint into what a
``checkpoint.save_optimizer=false`` save writes: ``actor/`` keeps every tensor of the model (read and
written back unchanged, byte for byte, with torch.distributed.checkpoint: no model is built, so any
TP/PP layout and size works in one process), ``common.pt`` loses its ``"optimizer"`` entry,
``train_state.pt`` records ``checkpoint.save_optimizer=false`` and an ``"optimizer_dropped"`` note, and
the ``COMPLETE`` marker is rewritten (``"optimizer_dropped": true``). The new copy is written beside the
old one and renamed into place (:meth:`~fastrl.checkpoint.manager.CheckpointManager.rewrite`), so a
crash leaves the old checkpoint or the new one, never a mix. A resume from the result restarts Adam
from zero moments (:meth:`fastrl.checkpoint.io.CheckpointIO.load` says so); evaluation
(``trainer.val_only=true``) and ``tools/convert_checkpoint.py export`` read it as before.
"""

from __future__ import annotations

import io
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fastrl.checkpoint.layout import ACTOR_DIR, RNG_DIR, STEP_DIR, TRAIN_STATE
from fastrl.checkpoint.manager import CheckpointError, CheckpointInfo, CheckpointManager

#: Top-level key of the optimizer's entries in a checkpoint's ``actor/`` (:mod:`fastrl.checkpoint.actor_state`).
OPTIMIZER_KEY = "optimizer"
#: megatron dist_checkpointing's files beside the tensor data (``*.distcp``) in ``actor/``.
COMMON_FILE, METADATA_JSON = "common.pt", "metadata.json"


@dataclass(frozen=True)
class Dropped:
    """What :func:`drop_optimizer` did to one checkpoint (sizes in bytes, as listed by its marker)."""

    path: Path
    bytes_before: int
    bytes_after: int


def _optimizer_entry(key: str) -> bool:
    return key == OPTIMIZER_KEY or key.startswith(OPTIMIZER_KEY + ".")


def _placeholder(meta) -> object:
    """What torch.distributed.checkpoint's load fills for one entry of a checkpoint's metadata: an empty
    tensor of the saved size and dtype, or (a pickled object such as megatron's ``_extra_state``) any
    value, which the load replaces."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if isinstance(meta, TensorStorageMetadata):
        return torch.empty(meta.size, dtype=meta.properties.dtype)
    return io.BytesIO()


def drop_optimizer(path: str | Path, *, allow_latest: bool = False) -> Dropped:
    """Rewrite the trainer checkpoint ``path`` (a ``step_XXXXXXXX`` directory) without its optimizer state.

    Args:
        path: a complete trainer checkpoint that holds an optimizer state.
        allow_latest: also rewrite the newest complete checkpoint of its root, the one
            ``checkpoint.resume=auto`` loads (its resume then restarts Adam from zero moments).

    Returns:
        A :class:`Dropped` with the checkpoint's sizes before and after.

    Raises:
        CheckpointError: ``path`` is no complete trainer checkpoint (named file missing or truncated),
            holds no optimizer state (already dropped, or saved with ``checkpoint.save_optimizer=false``),
            or is the newest checkpoint of its root without ``allow_latest``.
    """
    path = Path(path)
    if not STEP_DIR.match(path.name):
        raise CheckpointError(f"{path} is no trainer checkpoint directory (step_XXXXXXXX); pass one step's directory")
    marker = CheckpointManager.verify(path)
    manager = CheckpointManager(path.parent)
    saved = torch.load(path / TRAIN_STATE, map_location="cpu", weights_only=False)
    if not saved["config"].get("checkpoint", {}).get("save_optimizer", True) or marker.get("optimizer_dropped"):
        raise CheckpointError(f"checkpoint {path} holds no optimizer state (saved without it, or already dropped)")
    latest = manager.find_latest()
    if latest is not None and latest.path.resolve() == path.resolve() and not allow_latest:
        raise CheckpointError(
            f"checkpoint {path} is the newest of {path.parent}, the one checkpoint.resume=auto loads; without its "
            f"optimizer state that resume restarts Adam from zero moments. Pass allow_latest (--allow-latest) "
            f"when the run is finished"
        )
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter, load, save

    actor = path / ACTOR_DIR
    entries = FileSystemReader(str(actor)).read_metadata().state_dict_metadata
    weights = {k: _placeholder(meta) for k, meta in entries.items() if not _optimizer_entry(k)}
    if len(weights) == len(entries):
        raise CheckpointError(f"checkpoint {path}: {ACTOR_DIR}/ holds no '{OPTIMIZER_KEY}.*' tensors to drop")
    step = int(marker["step"])
    staging = manager.staging_dir(step)
    try:
        (staging / ACTOR_DIR).mkdir()
        load(weights, storage_reader=FileSystemReader(str(actor)), no_dist=True)  # fills ``weights`` in place
        save(weights, storage_writer=FileSystemWriter(str(staging / ACTOR_DIR)), no_dist=True)
        common = torch.load(actor / COMMON_FILE, map_location="cpu", weights_only=False)
        torch.save({k: v for k, v in common.items() if k != OPTIMIZER_KEY}, staging / ACTOR_DIR / COMMON_FILE)
        shutil.copy2(actor / METADATA_JSON, staging / ACTOR_DIR / METADATA_JSON)
        if (path / RNG_DIR).is_dir():
            shutil.copytree(path / RNG_DIR, staging / RNG_DIR)
        before = manager.checkpoint_bytes(CheckpointInfo(path, step))
        config = {**saved["config"], "checkpoint": {**saved["config"].get("checkpoint", {}), "save_optimizer": False}}
        note = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "bytes_before": before}
        torch.save({**saved, "config": config, "optimizer_dropped": note}, staging / TRAIN_STATE)
        extra = {k: v for k, v in marker.items() if k not in ("files", "step")}
        info = manager.rewrite(step, staging, {**extra, "optimizer_dropped": True})
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    CheckpointManager.verify(info.path)
    return Dropped(info.path, before, manager.checkpoint_bytes(info))
