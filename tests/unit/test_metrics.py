"""Metrics: flattening, JSON lines, resumed runs replace re-logged steps."""

import json

import pytest
import torch

from fastrl.training.metrics import MetricsLogger, flatten, read_metrics
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
