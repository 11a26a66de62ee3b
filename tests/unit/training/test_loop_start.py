"""The start of the step loop (fastrl/training/loop.py::run_loop): a run that has nothing to train
leaves the run directory's records where they are; one that trains sets aside the steps it re-does."""

from __future__ import annotations

import json
import types

import pytest

from fastrl.checkpoint.signals import StopRequest
from fastrl.train import resolve_config
from fastrl.training.loop import FINISHED_FILE, run_loop, write_finished

RECIPE = "easyvqa_tiny_fastrl_grpo_cpu"
RECORDS = [{"step": 0, "kind": "start"}, {"step": 1, "kind": "train"}, {"step": 2, "kind": "train"}]


def _run(tmp_path, *overrides):
    config = resolve_config(RECIPE, [f"logging.output_dir={tmp_path}", "logging.tensorboard=false", *overrides])
    run_dir = config.run_dir
    run_dir.mkdir(parents=True)
    ctx = types.SimpleNamespace(rank=0, is_logging_rank=True, world_size=1, device="cpu")
    timer = types.SimpleNamespace(phase=lambda name: __import__("contextlib").nullcontext())
    parts = types.SimpleNamespace(cfg=config, ctx=ctx, run_dir=run_dir, timer=timer, actor=None, start_metrics={}, data_metrics={})
    state = types.SimpleNamespace(step=0, total_steps=2, train_seconds=0.0)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return parts, state


def test_resume_none_on_a_finished_run_moves_no_record(tmp_path, caplog):
    """catches: the records after the resumed step moved to metrics.superseded.jsonl before the loop
    decided there is nothing to train (the order on main: a no-op call emptied the history)."""
    parts, state = _run(tmp_path, "checkpoint.resume=none")
    write_finished(parts.run_dir, 2)
    before = (parts.run_dir / "metrics.jsonl").read_text()
    with caplog.at_level("INFO", logger="fastrl.trainer"):
        summary = run_loop(parts, state, StopRequest())
    assert summary["already_complete"] is True
    assert "nothing to do" in caplog.text
    assert (parts.run_dir / "metrics.jsonl").read_text() == before
    assert not (parts.run_dir / "metrics.superseded.jsonl").exists()
    assert (parts.run_dir / FINISHED_FILE).exists()


def test_a_run_that_trains_sets_aside_the_steps_it_re_does(tmp_path, monkeypatch):
    """The other side: once the loop trains from step 0, the old records move (the loop then fails
    here at its first step, which this test does not build)."""
    import fastrl.training.loop as loop

    parts, state = _run(tmp_path, "checkpoint.resume=none", "trainer.val_before_train=false")
    monkeypatch.setattr(loop, "_progress", lambda run, st: (_ for _ in ()).throw(RuntimeError("first step")))
    with pytest.raises(RuntimeError, match="first step"):
        run_loop(parts, state, StopRequest())
    assert (parts.run_dir / "metrics.jsonl").read_text() == ""
    moved = [json.loads(line) for line in (parts.run_dir / "metrics.superseded.jsonl").read_text().splitlines()]
    assert moved == RECORDS
