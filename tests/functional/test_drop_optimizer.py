"""``tools/drop_optimizer.py`` (fastrl/checkpoint/model_only.py) on a trained checkpoint: the rewritten one
stores every model item byte for byte in the same chunks, keeps its marker's entries, evaluates and
exports as the full one did; what it refuses; the command line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fastrl.checkpoint import model_only
from fastrl.checkpoint.manager import CheckpointError, CheckpointManager
from fastrl.checkpoint.model_only import drop_optimizer, is_optimizer_entry
from fastrl.checkpoint.run_lock import RunDirLock, RunDirLocked
from tests.dcp_items import stored_items
from tests.functional.conftest import REPO, read_jsonl, run_train

pytestmark = pytest.mark.functional

RECIPE = "easyvqa_tiny_fastrl_grpo_cpu"
#: Two steps, validated and saved after each; step 1 kept for good (as a training-time grid keeps them).
RUN = ["trainer.max_steps=2", "trainer.val_every=1", "trainer.val_before_train=false", "checkpoint.save_every=1",
       "checkpoint.keep_last=1", "checkpoint.save_at_steps=[1]"]  # fmt: skip


def _export(checkpoint: Path, out: Path) -> dict:
    cmd = [sys.executable, str(REPO / "tools" / "convert_checkpoint.py"), "export", "--ckpt", str(checkpoint), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("drop")
    run_train(root, *RUN)
    return root / RECIPE


@pytest.fixture
def two_checkpoints(finished_run, tmp_path):
    """A copy of the finished run's directory for one test to rewrite."""
    return Path(shutil.copytree(finished_run, tmp_path / "copy" / RECIPE))


def test_dropping_keeps_the_weights_the_evaluation_and_the_export(two_checkpoints, tmp_path):
    """The rewritten step-1 checkpoint stores every model item (tensor chunks and pickled objects)
    with the same metadata and the same bytes, no optimizer item, under a quarter of the bytes; its
    marker keeps ``keep`` and ``train_seconds``; a ``trainer.val_only`` run from it gives the training
    run's step-1 validation response for response; ``convert_checkpoint.py export`` writes the same
    weights as from the full checkpoint.

    catches: tools/mutants.toml ``drop-optimizer-keeps-config`` (train_state.pt still says
    save_optimizer=true: the evaluation loads an optimizer state that is gone and fails),
    ``drop-optimizer-loses-a-weight`` (a model tensor not copied), ``drop-optimizer-offsets-not-moved``
    (the new metadata points at the old offsets) and ``drop-optimizer-marker-extras-lost`` (the
    grid checkpoint is no longer kept for good and loses its training time)."""
    run_dir = two_checkpoints
    step1 = run_dir / "checkpoints" / "step_00000001"
    before = stored_items(step1 / "actor")
    marker_before = CheckpointManager.verify(step1)
    assert marker_before["keep"] is True and any(is_optimizer_entry(k) for k, _ in before)
    latest_before = (run_dir / "checkpoints" / "latest").read_text()
    full_export = _export(step1, tmp_path / "hf_full")

    dropped = drop_optimizer(step1)

    assert dropped.path == step1 and dropped.bytes_after < dropped.bytes_before / 3
    marker = CheckpointManager.verify(step1)
    assert marker["optimizer_dropped"] is True and marker["step"] == 1
    assert {k: marker[k] for k in ("keep", "train_seconds", "recipe")} == {k: marker_before[k] for k in ("keep", "train_seconds", "recipe")}
    assert CheckpointManager(run_dir / "checkpoints").checkpoint_bytes(CheckpointManager(run_dir / "checkpoints").kept_for_good()[0]) == dropped.bytes_after
    assert (run_dir / "checkpoints" / "latest").read_text() == latest_before
    assert not list((run_dir / "checkpoints").glob(".*step_*"))  # no staging or old copy left
    assert not (run_dir / "trainer.lock").exists()
    after = stored_items(step1 / "actor")
    assert after == {k: v for k, v in before.items() if not is_optimizer_entry(k[0])}

    trained_val = next(r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "val" and r["step"] == 1)
    proc = run_train(tmp_path / "eval", *RUN, "trainer.val_only=true", f"checkpoint.resume={step1}")
    assert "holds no optimizer state (written with checkpoint.save_optimizer=false)" in proc.stdout + proc.stderr
    evaluated = next(r for r in read_jsonl(tmp_path / "eval" / RECIPE / "metrics.jsonl") if r["kind"] == "val")
    assert evaluated["step"] == 1 and evaluated["val/accuracy"] == trained_val["val/accuracy"]
    answers = "evaluations/val_step00000001.jsonl"  # a random tiny model scores 0: compare the responses
    assert read_jsonl(tmp_path / "eval" / RECIPE / answers) == read_jsonl(run_dir / answers)

    exported = _export(step1, tmp_path / "hf_dropped")
    assert sorted(exported) == sorted(full_export)
    for name, tensor in full_export.items():
        assert torch.equal(exported[name].contiguous().view(torch.uint8), tensor.contiguous().view(torch.uint8)), name


def test_what_it_refuses(two_checkpoints, monkeypatch):
    """The newest checkpoint (the one ``checkpoint.resume=auto`` loads) only with allow_latest; one
    with no optimizer state, by its config as well as by its marker; a folder that is no step
    directory; a run a trainer holds. A failure while writing leaves the checkpoint as it was.

    catches: tools/mutants.toml ``drop-optimizer-latest-unguarded`` and ``drop-optimizer-unlocked``."""
    root = two_checkpoints / "checkpoints"
    latest, step1 = root / "step_00000002", root / "step_00000001"
    with pytest.raises(CheckpointError, match="is the newest of .*Pass allow_latest"):
        drop_optimizer(latest)
    assert CheckpointManager.verify(latest).get("optimizer_dropped") is None

    lock = RunDirLock(two_checkpoints).acquire()
    try:
        with pytest.raises(RunDirLocked):
            drop_optimizer(step1)
    finally:
        lock.release()

    def broken_copy(actor, out):
        raise OSError(28, "No space left on device")

    files_before = CheckpointManager.verify(step1)["files"]
    with monkeypatch.context() as m:
        m.setattr(model_only, "copy_model_items", broken_copy)
        with pytest.raises(OSError, match="No space left"):
            drop_optimizer(step1)
    assert CheckpointManager.verify(step1)["files"] == files_before and not list(root.glob(".*step_*"))

    drop_optimizer(latest, allow_latest=True)
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        drop_optimizer(latest, allow_latest=True)
    marker = json.loads((latest / "COMPLETE").read_text())  # refused by its config alone, too
    (latest / "COMPLETE").write_text(json.dumps({k: v for k, v in marker.items() if k != "optimizer_dropped"}))
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        drop_optimizer(latest, allow_latest=True)
    with pytest.raises(CheckpointError, match="is no trainer checkpoint directory"):
        drop_optimizer(root)


def test_the_command_line(two_checkpoints):
    """Exit 1 naming the refused checkpoint, the others still rewritten (before -> after MB each);
    exit 0 when every one is rewritten."""
    root = two_checkpoints / "checkpoints"
    cmd = [sys.executable, str(REPO / "tools" / "drop_optimizer.py"), str(root / "step_00000002"), str(root / "step_00000001")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert f"drop_optimizer: error: checkpoint {root / 'step_00000002'} is the newest" in proc.stderr
    assert f"{root / 'step_00000001'}:" in proc.stdout and "MB ->" in proc.stdout
    assert json.loads((root / "step_00000001" / "COMPLETE").read_text())["optimizer_dropped"] is True
    again = subprocess.run([*cmd[:2], "--allow-latest", str(root / "step_00000002")],
                           capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
