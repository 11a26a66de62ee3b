"""Dropping a kept checkpoint's optimizer state: the model-only checkpoint that evaluation and export read.

A trainer checkpoint holds the actor's weights and the DistributedOptimizer's state in megatron's
``fully_reshardable`` format: fp32 main weights, Adam's ``exp_avg`` and ``exp_avg_sq``, so about 4x the
weights of an fp32 model (SmolLM2-135M: 2,154 MB, of which 538 MB are the weights) and 7x those of a
bf16 one. Checkpoints kept for good on a training-time grid (``checkpoint.save_at_train_s``) are only
evaluated or exported afterwards, which reads the weights alone; Megatron-LM's ``--no-save-optim`` makes
the same cut at save time.

:func:`drop_optimizer` rewrites one complete trainer checkpoint without the optimizer's entries:

- ``actor/``: every stored item (tensor chunk or pickled object, such as Transformer Engine's
  ``_extra_state``) of every key outside ``optimizer.*`` is copied as its stored bytes, chunk by chunk,
  into one data file, and torch.distributed.checkpoint's ``.metadata`` is written with the same entries
  and chunks pointing at their new offsets. Nothing is deserialized and no model is built, so the
  chunking that megatron's sharded load reads from (one chunk per layer and TP rank) is kept, any
  TP/PP layout works in one process, and memory stays at one copy buffer. ``common.pt`` loses its
  ``"optimizer"`` entry; ``metadata.json`` is copied.
- ``train_state.pt``: ``checkpoint.save_optimizer=false`` in its config (what a save without the
  optimizer records, so that every loader reads the model only) and an ``"optimizer_dropped"`` note.
- ``COMPLETE``: rewritten with the new files, its other entries (``keep``, ``train_seconds``, ...) kept,
  and ``"optimizer_dropped": true``.

The copy is written beside the checkpoint (``.tmp-step_X``), flushed to disk and renamed into place
(:meth:`~fastrl.checkpoint.manager.CheckpointManager.rewrite`), under the run directory's trainer lock
(:mod:`fastrl.checkpoint.run_lock`), so no trainer of the run saves or prunes meanwhile. A crash before
the swap leaves the old checkpoint and a staging folder that the next save removes; one between its
two renames leaves the old one as ``.old-step_X`` and the new one as ``.tmp-step_X``, both complete
(rename either back to ``step_X`` before the run saves again, since retention removes such folders).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from fastrl.checkpoint.layout import ACTOR_DIR, RNG_DIR, STEP_DIR, TRAIN_STATE
from fastrl.checkpoint.manager import CheckpointError, CheckpointInfo, CheckpointManager

#: What :func:`drop_optimizer` may raise for one checkpoint: any error, and torch.distributed.checkpoint's
#: ``CheckpointException``, which derives from BaseException (past ``except Exception``).
DROP_ERRORS = (Exception, CheckpointException)

#: Top-level key of the optimizer's entries in a checkpoint's ``actor/`` (:mod:`fastrl.checkpoint.actor_state`).
OPTIMIZER_KEY = "optimizer"
#: megatron dist_checkpointing's files beside the tensor data in ``actor/``; torch.distributed.checkpoint's index.
COMMON_FILE, METADATA_JSON, DCP_METADATA = "common.pt", "metadata.json", ".metadata"
#: The one data file the model's items are copied into.
DATA_FILE = "__0_0.distcp"
#: Bytes copied per read.
COPY_BUFFER = 64 * 2**20


@dataclass(frozen=True)
class Dropped:
    """What :func:`drop_optimizer` did to one checkpoint (sizes in bytes, as listed by its marker)."""

    path: Path
    bytes_before: int
    bytes_after: int


def is_optimizer_entry(key: str) -> bool:
    """Whether ``key`` of an ``actor/`` directory belongs to the optimizer state."""
    return key == OPTIMIZER_KEY or key.startswith(OPTIMIZER_KEY + ".")


def _fsync(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def copy_model_items(actor: Path, out: Path) -> int:
    """Copy the non-optimizer items of the torch.distributed.checkpoint directory ``actor`` into
    ``out`` (which must exist): their stored bytes into :data:`DATA_FILE`, and a ``.metadata`` with the
    same entries and chunks at their new offsets. Returns the number of items copied.

    Raises:
        CheckpointError: ``actor`` holds no optimizer entries (nothing to drop), or an item's stored
            range lies past the end of its file (a truncated data file, named).
    """
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(actor)).read_metadata()
    entries = metadata.state_dict_metadata
    model = {k: v for k, v in entries.items() if not is_optimizer_entry(k)}
    if len(model) == len(entries):
        raise CheckpointError(f"{actor}: holds no '{OPTIMIZER_KEY}.*' entries to drop")
    items = sorted(
        ((index, info) for index, info in metadata.storage_data.items() if index.fqn in model),
        key=lambda item: (item[1].relative_path, item[1].offset),
    )
    storage: dict[Any, Any] = {}
    with open(out / DATA_FILE, "wb") as dst:
        sources: dict[str, Any] = {}
        try:
            for index, info in items:
                if info.relative_path not in sources:
                    sources[info.relative_path] = open(actor / info.relative_path, "rb")
                src = sources[info.relative_path]
                src.seek(info.offset)
                offset, left = dst.tell(), info.length
                while left:
                    chunk = src.read(min(left, COPY_BUFFER))
                    if not chunk:
                        raise CheckpointError(
                            f"{actor / info.relative_path}: ends before the {info.length} bytes of {index.fqn} at offset "
                            f"{info.offset} (a truncated file); this checkpoint cannot be rewritten"
                        )
                    dst.write(chunk)
                    left -= len(chunk)
                storage[index] = dataclasses.replace(info, relative_path=DATA_FILE, offset=offset)
        finally:
            for src in sources.values():
                src.close()
        dst.flush()
        os.fsync(dst.fileno())
    new = copy.copy(metadata)  # keeps the version, storage_meta and any attribute megatron added
    new.state_dict_metadata = model
    new.storage_data = storage
    if isinstance(metadata.planner_data, dict):
        new.planner_data = {k: v for k, v in metadata.planner_data.items() if not is_optimizer_entry(k)}
    with open(out / DCP_METADATA, "wb") as fh:
        pickle.dump(new, fh)
    _fsync(out / DCP_METADATA)
    return len(items)


def _run_dir(path: Path, config: dict[str, Any]) -> Path:
    """The run directory whose trainer lock covers the checkpoint root of ``path``."""
    if not config.get("checkpoint", {}).get("dir"):
        return path.parent.parent  # RUN_DIR/checkpoints/step_X
    logging_cfg = config.get("logging", {})
    run_dir = Path(logging_cfg.get("output_dir", ".")) / (logging_cfg.get("run_name") or config.get("recipe", ""))
    if not run_dir.is_dir():
        raise CheckpointError(
            f"checkpoint {path} was written with checkpoint.dir set, and its run directory {run_dir} (from its "
            f"logging settings) is not here to lock; run from the directory the trainer ran in"
        )
    return run_dir


def drop_optimizer(path: str | Path, *, allow_latest: bool = False) -> Dropped:
    """Rewrite the trainer checkpoint ``path`` (a ``step_XXXXXXXX`` directory) without its optimizer state.

    Args:
        path: a complete trainer checkpoint that holds an optimizer state.
        allow_latest: also rewrite the newest complete checkpoint of its root, the one
            ``checkpoint.resume=auto`` loads (its run then resumes only with
            ``checkpoint.save_optimizer=false``, from zero Adam moments).

    Returns:
        A :class:`Dropped` with the checkpoint's sizes before and after.

    Raises:
        CheckpointError: ``path`` is no complete trainer checkpoint (named file missing or truncated),
            holds no optimizer state (already dropped, or saved with ``checkpoint.save_optimizer=false``),
            or is the newest checkpoint of its root without ``allow_latest``.
        RunDirLocked: a trainer holds the run directory (its pid, host and start time named).
    """
    from fastrl.checkpoint.run_lock import RunDirLock

    path = Path(path)
    if not STEP_DIR.match(path.name):
        raise CheckpointError(f"{path} is no trainer checkpoint directory (step_XXXXXXXX); pass one step's directory")
    marker = CheckpointManager.verify(path)
    saved = torch.load(path / TRAIN_STATE, map_location="cpu", weights_only=False)
    if not saved["config"].get("checkpoint", {}).get("save_optimizer", True) or marker.get("optimizer_dropped"):
        raise CheckpointError(f"checkpoint {path} holds no optimizer state (saved without it, or already dropped)")
    lock = RunDirLock(_run_dir(path, saved["config"])).acquire()
    try:
        return _rewrite(path, marker, saved, allow_latest=allow_latest)
    finally:
        lock.release()


def _rewrite(path: Path, marker: dict[str, Any], saved: dict[str, Any], *, allow_latest: bool) -> Dropped:
    manager = CheckpointManager(path.parent)
    latest = manager.find_latest()
    if latest is not None and latest.path.resolve() == path.resolve() and not allow_latest:
        raise CheckpointError(
            f"checkpoint {path} is the newest of {path.parent}, the one checkpoint.resume=auto loads; without its "
            f"optimizer state the run resumes only with checkpoint.save_optimizer=false, from zero Adam moments. "
            f"Pass allow_latest (--allow-latest) when the run is finished"
        )
    step = int(marker["step"])
    before = manager.checkpoint_bytes(CheckpointInfo(path, step))
    staging = manager.staging_dir(step)
    try:
        actor = staging / ACTOR_DIR
        actor.mkdir()
        copy_model_items(path / ACTOR_DIR, actor)
        common = torch.load(path / ACTOR_DIR / COMMON_FILE, map_location="cpu", weights_only=False)
        torch.save({k: v for k, v in common.items() if k != OPTIMIZER_KEY}, actor / COMMON_FILE)
        shutil.copy2(path / ACTOR_DIR / METADATA_JSON, actor / METADATA_JSON)
        if (path / RNG_DIR).is_dir():
            shutil.copytree(path / RNG_DIR, staging / RNG_DIR)
        config = {**saved["config"], "checkpoint": {**saved["config"].get("checkpoint", {}), "save_optimizer": False}}
        note = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "bytes_before": before}
        torch.save({**saved, "config": config, "optimizer_dropped": note}, staging / TRAIN_STATE)
        for f in staging.rglob("*"):
            if f.is_file():
                _fsync(f)
        extra = {k: v for k, v in marker.items() if k not in ("files", "step")}
        info = manager.rewrite(step, staging, {**extra, "optimizer_dropped": True})
    except BaseException:
        old = path.parent / f".old-{path.name}"
        if not path.exists() and old.is_dir():  # stopped between the swap's two renames: the old one back
            os.replace(old, path)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Dropped(info.path, before, manager.checkpoint_bytes(info))
