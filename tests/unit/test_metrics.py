"""Metrics: flattening, JSON lines, resumed runs replace re-logged steps."""

import json

import pytest
import torch

from fastrl.training.metrics import MetricsLogger, flatten, read_metrics, supersede_records_after
from fastrl.training.timers import PhaseTimer


def test_flatten_nested_and_tensors():
    flat = flatten({"reward": {"mean": torch.tensor(0.5)}, "n": 8, "ok": True})
    assert flat == {"reward/mean": 0.5, "n": 8, "ok": 1}
    with pytest.raises(TypeError, match="metric 'x' is str"):
        flatten({"x": "a"})


def test_jsonl_and_tensorboard(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=True)
    log.log(1, {"loss": 1.0})
    log.log(2, {"loss": 0.5, "bad": float("nan")})
    log.log(2, {"loss": 0.25})  # resumed run re-logs step 2
    log.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[1]["loss"] == 0.25
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["bad"] is None
    assert any((tmp_path / "tensorboard").iterdir())


def test_disabled_logger_writes_nothing(tmp_path):
    log = MetricsLogger(tmp_path / "r1", enabled=False)
    assert log.log(1, {"a": 1}) == {"a": 1}
    assert not (tmp_path / "r1").exists()


def test_phase_timer_accumulates():
    timer = PhaseTimer()
    for _ in range(2):
        with timer.phase("gen"):
            sum(range(1000))
    with timer.phase("update"):
        pass
    out = timer.pop()
    assert set(out) == {"gen", "update", "step"}
    assert out["step"] == pytest.approx(out["gen"] + out["update"])
    assert timer.pop() == {"step": 0.0}


def test_resume_supersedes_the_records_of_re_done_steps(tmp_path):
    # Breakage caught: a resumed run appending to metrics.jsonl, so a re-done step has two records
    # (issue 33, item 7), or dropping the old records instead of keeping them aside.
    import json

    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "kind": "start", "x": 0}, {"step": 0, "kind": "val", "x": 1}, {"step": 1, "kind": "train", "x": 2},
        {"step": 2, "kind": "train", "x": 3}, {"step": 2, "kind": "val", "x": 4}, {"step": 3, "kind": "train", "x": 5},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 4, "kind": "tra')  # torn by a crash
    moved, superseded = supersede_records_after(path, 2)
    assert moved == 2 and superseded == tmp_path / "metrics.superseded.jsonl"
    assert [json.loads(line)["x"] for line in path.read_text().splitlines()] == [0, 1, 2, 3, 4]
    old = superseded.read_text().splitlines()
    assert json.loads(old[0]) == lines[5] and old[1] == '{"step": 4, "kind": "tra'
    assert supersede_records_after(path, 2) == (0, None)  # nothing after step 2 any more
    # a run that restarts from nothing (no checkpoint) logs its start and step 0 again
    assert supersede_records_after(path, 0)[0] == 5 and path.read_text() == ""
    assert len(superseded.read_text().splitlines()) == 7


def test_supersede_refuses_a_file_that_is_not_metrics(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"loss": 1}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:1: a record without an integer 'step'"):
        supersede_records_after(path, 1)
    assert path.read_text() == '{"loss": 1}\n'  # untouched
