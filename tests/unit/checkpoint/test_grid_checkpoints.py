"""Grid checkpoints for evaluation after training: which steps keep one, that retention never
deletes them, and the training-time budget stop."""

import json

import pytest

from fastrl.checkpoint.manager import CheckpointManager
from fastrl.cli import apply_overrides
from fastrl.config import RunConfig
from fastrl.training.time_grid import grid_save_due, time_budget_spent


def _save(mgr, step, *, keep=False):
    tmp = mgr.staging_dir(step)
    (tmp / "shard.bin").write_bytes(b"x" * 10)
    return mgr.publish(step, tmp, keep=keep, extra={"train_seconds": 10.0 * step})


def test_grid_save_due_at_the_step_that_reaches_each_time():
    """catches: a grid time compared with ``<`` instead of ``<=`` (a step ending exactly on 600 s
    keeps nothing), or the test made on the time before the step (the step before is kept)."""
    times = (600.0, 1200.0)
    # steps of 250 s: 0-250, 250-500, 500-750 (reaches 600), ..., 1000-1250 (reaches 1200)
    due = [k for k in range(1, 7) if grid_save_due(times, (), step=k, before_s=250.0 * (k - 1), after_s=250.0 * k)]
    assert due == [3, 5]
    assert grid_save_due(times, (), step=2, before_s=300.0, after_s=600.0)  # ends exactly on the grid time
    assert not grid_save_due(times, (), step=3, before_s=600.0, after_s=900.0)  # reached by the step before
    # one step across two grid times keeps one checkpoint; a listed step keeps one whatever its time
    assert grid_save_due(times, (), step=1, before_s=0.0, after_s=1300.0)
    assert grid_save_due((), (5, 20), step=20, before_s=0.0, after_s=1.0)
    assert not grid_save_due((), (5, 20), step=19, before_s=0.0, after_s=1.0)


def test_time_budget_spent():
    """catches: ``>`` for ``>=`` (a run ending exactly on its budget trains one step more)."""
    assert not time_budget_spent(None, 1e9)
    assert not time_budget_spent(3600.0, 3599.9)
    assert time_budget_spent(3600.0, 3600.0)


def test_kept_checkpoints_survive_keep_last(tmp_path):
    """catches: retention that ignores the marker's ``keep`` (steps 5 and 10 deleted by keep_last=1),
    and a replacing save of a kept step (the final best save) that drops its ``keep``."""
    mgr = CheckpointManager(tmp_path, keep_last=1)
    _save(mgr, 5, keep=True)
    _save(mgr, 7)
    _save(mgr, 10, keep=True)
    _save(mgr, 12)
    _save(mgr, 14)
    assert [c.step for c in mgr.complete_checkpoints()] == [5, 10, 14]
    assert [c.step for c in mgr.kept_for_good()] == [5, 10]
    _save(mgr, 10)  # the same step saved again without keep (e.g. as the best): it stays kept
    _save(mgr, 16)
    assert [c.step for c in mgr.complete_checkpoints()] == [5, 10, 16]
    assert json.loads((tmp_path / "step_00000010" / "COMPLETE").read_text())["train_seconds"] == 100.0


def test_grid_and_budget_fields_parse_and_are_checked():
    """catches: the increasing-order check dropped (an unsorted grid accepted), or max_train_time_s
    accepting 0."""
    cfg = apply_overrides(RunConfig(), ["checkpoint.save_at_train_s=[600,1200.5]", "checkpoint.save_at_steps=[5,20]",
                                        "trainer.max_train_time_s=3600"])
    assert cfg.checkpoint.save_at_train_s == (600.0, 1200.5) and cfg.checkpoint.save_at_steps == (5, 20)
    assert cfg.trainer.max_train_time_s == 3600.0
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="save_at_train_s must be finite seconds > 0 in increasing order"):
        apply_overrides(RunConfig(), ["checkpoint.save_at_train_s=[1200,600]"])
    with pytest.raises(ValueError, match="save_at_steps must be steps >= 1 in increasing order"):
        apply_overrides(RunConfig(), ["checkpoint.save_at_steps=[0,5]"])
    with pytest.raises(ValueError, match="max_train_time_s must be a finite number > 0"):
        apply_overrides(RunConfig(), ["trainer.max_train_time_s=0"])
