"""The guards around a trainer's save and resume (fastrl/checkpoint/io.py): no checkpoint from
non-finite weights, no partial staging folder after a failed save, a damaged newest checkpoint named."""

from __future__ import annotations

import types

import pytest
import torch

import fastrl.checkpoint.io as ckpt_io
from fastrl.checkpoint.io import CheckpointIO
from fastrl.checkpoint.manager import CheckpointError, CheckpointManager
from fastrl.train import resolve_config

CTX = types.SimpleNamespace(rank=0, is_logging_rank=True, dp_group=None, world_size=1, tp_size=1, pp_size=1, dp_size=1)


def _io(tmp_path, *overrides) -> CheckpointIO:
    config = resolve_config("easyvqa_tiny_fastrl_grpo_cpu", [f"logging.output_dir={tmp_path}", *overrides])
    return CheckpointIO(config, CTX, run_dir=tmp_path / "run")


def _actor(value: float = 0.5):
    chunk = torch.nn.Linear(3, 2)
    with torch.no_grad():
        chunk.weight.fill_(value)
    return types.SimpleNamespace(policy=types.SimpleNamespace(chunks=[chunk]), optimizer=None)


def _publish(manager: CheckpointManager, step: int) -> None:
    staging = manager.staging_dir(step)
    (staging / "actor").mkdir()
    (staging / "actor" / "weights.bin").write_bytes(b"x" * 64)
    manager.publish(step, staging)


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    """catches: save() without the finiteness check (a diverged update was written COMPLETE and
    `latest` pointed at it: every resume loaded NaN weights)."""
    io = _io(tmp_path)
    _publish(io.manager, 1)
    state = types.SimpleNamespace(step=2)
    with pytest.raises(CheckpointError) as refused:
        io.save(state, _actor(float("nan")))
    message = str(refused.value)
    assert message.startswith("step 2: the policy's weights hold non-finite values")
    assert str(io.root / "step_00000001") in message
    assert [c.step for c in io.manager.complete_checkpoints()] == [1]
    assert (io.root / "latest").read_text().strip() == "step_00000001"
    assert not list(io.root.glob(".tmp-*"))


def test_a_save_without_room_for_it_is_refused_before_it_writes(tmp_path, monkeypatch):
    """With less free space than the newest checkpoint took (x SPACE_MARGIN), the save is refused
    with the sizes, the root and what to do, before anything is written; with room, it proceeds.

    catches: save() without the free-space check (tools/mutants.toml ``checkpoint-space-unchecked``:
    a full disk failed mid-write with ``unexpected pos 704 vs 598``) and the margin dropped
    (``checkpoint-space-no-margin``)."""
    io = _io(tmp_path)
    _publish(io.manager, 1)
    took = io.manager.checkpoint_bytes(io.manager.find_latest())
    assert took == 64  # the marker's list of files: actor/weights.bin
    writes = []
    monkeypatch.setattr(ckpt_io, "save_actor", lambda *a, **k: writes.append(a))
    monkeypatch.setattr(io.manager, "free_bytes", lambda: int(took * 1.05))
    with pytest.raises(CheckpointError) as refused:
        io.save(types.SimpleNamespace(step=2), _actor())
    message = str(refused.value)
    assert message.startswith(f"step 2: the filesystem of {io.root} has ")
    assert str(io.root / "step_00000001") in message and "checkpoint.dir" in message
    assert writes == [] and not list(io.root.glob(".tmp-*"))
    assert [c.step for c in io.manager.complete_checkpoints()] == [1]
    monkeypatch.setattr(io.manager, "free_bytes", lambda: int(took * 1.2))
    with pytest.raises(Exception) as past_the_check:  # the fake actor has no train state to write
        io.save(types.SimpleNamespace(step=2), _actor())
    assert not isinstance(past_the_check.value, CheckpointError) and len(writes) == 1


def test_a_save_short_of_space_first_applies_retention_then_proceeds(tmp_path, monkeypatch):
    """Short of space, the check first makes room: with ``keep_last`` lowered to 1 (as a resume
    with a new setting would), the older checkpoint goes before the save, which then proceeds.

    catches: the check refusing without making room (tools/mutants.toml
    ``checkpoint-space-no-room-made``: the error's advice to lower keep_last and resume did
    nothing, since retention ran only after a successful save)."""
    io = _io(tmp_path)
    _publish(io.manager, 1)
    _publish(io.manager, 2)
    io.manager.keep_last = 1
    took = io.manager.checkpoint_bytes(io.manager.find_latest())
    writes = []
    monkeypatch.setattr(ckpt_io, "save_actor", lambda *a, **k: writes.append(a))
    monkeypatch.setattr(io.manager, "free_bytes",
                        lambda: int(took * (1.05 if (io.root / "step_00000001").exists() else 1.2)))
    with pytest.raises(Exception) as past_the_check:  # the fake actor has no train state to write
        io.save(types.SimpleNamespace(step=3), _actor())
    assert not isinstance(past_the_check.value, CheckpointError) and len(writes) == 1
    assert [c.step for c in io.manager.complete_checkpoints()] == [2]


class _DiskFull(BaseException):
    """Like torch.distributed.checkpoint's CheckpointException (a BaseException) from a full disk."""


def test_a_failed_save_removes_its_staging_folder(tmp_path, monkeypatch):
    """catches: a save that fails (here with a BaseException, as torch's CheckpointException is)
    leaving its partial .tmp-step_* folder on the full disk."""
    io = _io(tmp_path)

    def failing_save(chunks, optimizer, path, **kwargs):
        (path / "partial.distcp").write_bytes(b"y" * 128)
        raise _DiskFull("No space left on device")

    monkeypatch.setattr(ckpt_io, "save_actor", failing_save)
    with pytest.raises(_DiskFull):
        io.save(types.SimpleNamespace(step=3), _actor())
    assert not list(io.root.glob(".tmp-*")) and not list(io.root.glob("step_*"))
    assert io.last_saved_step is None


def test_a_damaged_newest_checkpoint_skipped_by_resume_is_named(tmp_path, monkeypatch, caplog):
    """catches: resume=auto skipping a truncated newest checkpoint silently."""
    io = _io(tmp_path, "checkpoint.resume=auto")
    _publish(io.manager, 1)
    _publish(io.manager, 2)
    (io.root / "step_00000002" / "actor" / "weights.bin").write_bytes(b"x" * 10)  # truncated copy
    loaded = []
    monkeypatch.setattr(CheckpointIO, "load", lambda self, path, state, actor: loaded.append(path))
    with caplog.at_level("WARNING", logger="fastrl.checkpoint"):
        path = io.resume(types.SimpleNamespace(step=0), None)
    assert path == io.root / "step_00000001" and loaded == [path]
    warning = next(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert warning.startswith(f"checkpoint {io.root / 'step_00000002'} is skipped: ")
    assert "has 10 bytes, the marker says 64 (truncated or corrupted copy)" in warning
    assert f"Resuming from {io.root / 'step_00000001'}" in warning


def test_damaged_after_lists_only_newer_incomplete_step_directories(tmp_path):
    manager = CheckpointManager(tmp_path)
    _publish(manager, 1)
    (tmp_path / "step_00000003").mkdir()  # no marker: a save killed mid-way
    (tmp_path / ".tmp-step_00000004").mkdir()  # staging: never a checkpoint
    damaged = manager.damaged_after(1)
    assert [p.name for p, _ in damaged] == ["step_00000003"]
    assert "has no COMPLETE marker" in damaged[0][1]
    assert manager.damaged_after(3) == []
