"""``tools/drop_optimizer.py`` (fastrl/checkpoint/model_only.py): a kept checkpoint without its optimizer
state holds the same weights, byte for byte, and evaluates as the full one did; what it refuses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastrl.checkpoint.manager import CheckpointError, CheckpointManager
from fastrl.checkpoint.model_only import _placeholder, drop_optimizer
from tests.functional.conftest import REPO, read_jsonl, run_train

pytestmark = pytest.mark.functional

RECIPE = "easyvqa_tiny_fastrl_grpo_cpu"
#: Two steps, validated and saved after each (both checkpoints kept), no validation before training.
RUN = ["trainer.max_steps=2", "trainer.val_every=1", "trainer.val_before_train=false", "checkpoint.save_every=1",
       "checkpoint.keep_last=2"]  # fmt: skip


def _actor_entries(step_dir, *, optimizer: bool) -> dict:
    from torch.distributed.checkpoint import FileSystemReader, load

    reader = FileSystemReader(str(step_dir / "actor"))
    entries = reader.read_metadata().state_dict_metadata
    state = {k: _placeholder(m) for k, m in entries.items() if k.startswith("optimizer.") == optimizer}
    load(state, storage_reader=reader, no_dist=True)
    return state


def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if k.startswith("val/") and not k.endswith("time_s")}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("drop")
    run_train(root, *RUN)
    return root / RECIPE


@pytest.fixture
def two_checkpoints(finished_run, tmp_path):
    """A copy of the finished run's directory for one test to rewrite."""
    return Path(shutil.copytree(finished_run, tmp_path / "copy" / RECIPE))


def test_dropping_keeps_the_weights_and_the_evaluation(two_checkpoints, tmp_path):
    """The rewritten step-1 checkpoint holds every model tensor bit for bit, no optimizer tensor,
    less than half the bytes, and a ``trainer.val_only`` run from it gives the step-1 validation of
    the training run itself, response for response.

    catches: tools/mutants.toml ``drop-optimizer-keeps-config`` (train_state.pt still says
    save_optimizer=true: the evaluation loads an optimizer state that is gone and fails) and
    ``drop-optimizer-loses-a-weight`` (a model tensor not written back)."""
    run_dir = two_checkpoints
    step1 = run_dir / "checkpoints" / "step_00000001"
    weights = _actor_entries(step1, optimizer=False)
    assert _actor_entries(step1, optimizer=True)  # there is an optimizer state to drop
    manager = CheckpointManager(run_dir / "checkpoints")
    latest_before = (run_dir / "checkpoints" / "latest").read_text()

    dropped = drop_optimizer(step1)

    assert dropped.path == step1 and dropped.bytes_after < dropped.bytes_before / 2
    marker = CheckpointManager.verify(step1)
    assert marker["optimizer_dropped"] is True and marker["step"] == 1
    assert manager.checkpoint_bytes(manager.complete_checkpoints()[0]) == dropped.bytes_after
    assert (run_dir / "checkpoints" / "latest").read_text() == latest_before
    assert not list((run_dir / "checkpoints").glob(".*step_*"))  # no staging or old copy left
    after = _actor_entries(step1, optimizer=False)
    assert sorted(after) == sorted(weights)
    for key, tensor in weights.items():
        if isinstance(tensor, torch.Tensor):
            assert after[key].dtype == tensor.dtype and torch.equal(after[key], tensor), key
    assert not _actor_entries(step1, optimizer=True)

    trained_val = next(r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "val" and r["step"] == 1)
    proc = run_train(tmp_path / "eval", *RUN, "trainer.val_only=true", f"checkpoint.resume={step1}")
    assert "holds no optimizer state (written with checkpoint.save_optimizer=false)" in proc.stdout + proc.stderr
    evaluated = next(r for r in read_jsonl(tmp_path / "eval" / RECIPE / "metrics.jsonl") if r["kind"] == "val")
    assert evaluated["step"] == 1 and _comparable(evaluated) == _comparable(trained_val)
    # the same response, word for word, to each validation question (a random tiny model scores 0)
    answers = "evaluations/val_step00000001.jsonl"
    assert read_jsonl(tmp_path / "eval" / RECIPE / answers) == read_jsonl(run_dir / answers)


def test_what_it_refuses(two_checkpoints, tmp_path):
    """The newest checkpoint (the one ``checkpoint.resume=auto`` loads) only with allow_latest; a
    checkpoint with no optimizer state; a folder that is no step directory.

    catches: tools/mutants.toml ``drop-optimizer-latest-unguarded``."""
    root = two_checkpoints / "checkpoints"
    latest = root / "step_00000002"
    with pytest.raises(CheckpointError, match="is the newest of .*Pass allow_latest"):
        drop_optimizer(latest)
    assert CheckpointManager.verify(latest).get("optimizer_dropped") is None
    drop_optimizer(latest, allow_latest=True)
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        drop_optimizer(latest, allow_latest=True)
    with pytest.raises(CheckpointError, match="is no trainer checkpoint directory"):
        drop_optimizer(root)


def test_the_command_line(two_checkpoints, tmp_path):
    """Exit 0 with the bytes freed per checkpoint; exit 1 naming the refused checkpoint, the
    others still rewritten."""
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
