"""Checkpoint directories: a checkpoint without a complete marker is never loaded."""

import json

import pytest

from fastrl.checkpoint.manager import COMPLETE_MARKER, CheckpointError, CheckpointManager


def _save(mgr, step, payload=b"x" * 100):
    tmp = mgr.staging_dir(step)
    (tmp / "model").mkdir()
    (tmp / "model" / "shard0.bin").write_bytes(payload)
    (tmp / "train_state.json").write_text(json.dumps({"step": step}))
    return mgr.publish(step, tmp)


def test_publish_find_and_retention(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    assert mgr.find_latest() is None
    for step in (10, 20, 30):
        info = _save(mgr, step)
        assert info.step == step
    names = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert names == ["step_00000020", "step_00000030"]
    assert (tmp_path / "latest").read_text().strip() == "step_00000030"
    assert mgr.find_latest().step == 30


def test_best_is_kept_beyond_keep_last(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=1)
    _save(mgr, 10)
    mgr.mark_best(10)
    _save(mgr, 20)
    _save(mgr, 30)
    assert [c.step for c in mgr.complete_checkpoints()] == [10, 30]
    assert mgr.best().step == 10


def test_interrupted_save_is_never_loaded(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    _save(mgr, 10)
    # a save killed before its rename: the temporary directory exists, latest still names step 10
    tmp = mgr.staging_dir(20)
    (tmp / "train_state.json").write_text("{}")
    assert mgr.find_latest().step == 10
    # a directory renamed into place by hand without a marker is ignored too
    (tmp_path / "step_00000030").mkdir()
    assert mgr.find_latest().step == 10
    with pytest.raises(CheckpointError, match="no COMPLETE marker"):
        mgr.verify(tmp_path / "step_00000030")


def test_truncated_file_is_detected(tmp_path):
    mgr = CheckpointManager(tmp_path)
    info = _save(mgr, 10)
    shard = info.path / "model" / "shard0.bin"
    shard.write_bytes(shard.read_bytes()[:50])
    with pytest.raises(CheckpointError, match=r"shard0.bin has 50 bytes, the marker says 100 \(truncated"):
        mgr.verify(info.path)
    assert mgr.find_latest() is None


def test_missing_file_and_bad_marker(tmp_path):
    mgr = CheckpointManager(tmp_path)
    info = _save(mgr, 10)
    (info.path / "train_state.json").unlink()
    with pytest.raises(CheckpointError, match="train_state.json listed in the marker is missing"):
        mgr.verify(info.path)
    (info.path / COMPLETE_MARKER).write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable COMPLETE marker"):
        mgr.verify(info.path)


def test_save_resume_save_again_same_step(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    _save(mgr, 10, payload=b"a" * 10)
    again = _save(mgr, 10, payload=b"b" * 12)  # re-saving a step replaces it atomically
    assert (again.path / "model" / "shard0.bin").read_bytes() == b"b" * 12
    assert [c.step for c in mgr.complete_checkpoints()] == [10]
    _save(mgr, 11)
    assert mgr.find_latest().step == 11


def test_background_deletion_renames_at_once_and_sweeps_what_a_kill_left(tmp_path):
    # Breakage caught: rank 0 deleting old checkpoints (about 1 TB for 72B) while the other ranks
    # wait at the save's barrier, whose NCCL timeout is 10 minutes; or a half-deleted checkpoint
    # still looking like one (it is renamed out of the way before anything is deleted).
    import threading

    mgr = CheckpointManager(tmp_path, keep_last=1, background_delete=True)
    release = threading.Event()
    import fastrl.checkpoint.manager as manager_module

    real = manager_module._remove_all
    manager_module._remove_all = lambda paths: (release.wait(10), real(paths))
    try:
        _save(mgr, 10)
        _save(mgr, 20)  # step 10 goes: renamed at once, removed in the background (held here)
        assert [c.step for c in mgr.complete_checkpoints()] == [20]
        assert not (tmp_path / "step_00000010").exists()
        pending = [p.name for p in tmp_path.iterdir() if p.name.startswith(".del-")]
        assert len(pending) == 1 and pending[0].startswith(".del-step_00000010-")
        release.set()
        mgr.wait_for_deletions()
        assert not any(p.name.startswith(".del-") for p in tmp_path.iterdir())
    finally:
        manager_module._remove_all = real
    # a process killed mid-delete leaves a .del- directory: the next publish removes it
    (tmp_path / ".del-step_00000005-1").mkdir()
    _save(mgr, 30)
    mgr.wait_for_deletions()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step_00000030"]
