"""The actor's learning-rate schedule (megatron-core OptimizerParamScheduler)."""

from __future__ import annotations

import math
import types

import pytest

from fastrl.config import OptimizerConfig
from fastrl.training.actor import build_lr_scheduler


def _lrs(cfg: OptimizerConfig, total: int) -> list[float]:
    optimizer = types.SimpleNamespace(param_groups=[{"params": [], "lr": 0.0, "weight_decay": 0.0}])
    scheduler = build_lr_scheduler(optimizer, cfg, total)
    out = [optimizer.param_groups[0]["lr"]]
    for _ in range(total):
        scheduler.step(increment=1)
        out.append(optimizer.param_groups[0]["lr"])
    return out


def test_constant_schedule_is_the_peak_lr():
    assert _lrs(OptimizerConfig(lr=1e-3), 3) == [1e-3] * 4


def test_linear_warmup_then_cosine_decay_to_min_lr():
    lrs = _lrs(OptimizerConfig(lr=1e-3, min_lr=1e-4, lr_warmup_steps=2, lr_decay_style="cosine"), 6)
    assert lrs[:3] == pytest.approx([0.0, 5e-4, 1e-3])
    # cosine over the 4 steps after warm-up: min + (max - min) * (1 + cos(pi * k / 4)) / 2
    assert lrs[4] == pytest.approx(1e-4 + 9e-4 * (1 + math.cos(math.pi * 2 / 4)) / 2)
    assert lrs[6] == pytest.approx(1e-4)


def test_lr_positions_are_set_on_the_rl_step():
    from fastrl.training.geometry import lr_positions

    # a step that makes all U updates: the integer positions one increment per update gives
    # (catches a build that changes the LR of runs whose steps make every update)
    assert lr_positions(1, 4, 4) == [1, 2, 3, 4]
    assert lr_positions(3, 4, 4) == [9, 10, 11, 12]
    assert all(isinstance(p, int) for p in lr_positions(3, 4, 4))
    # fewer updates (pruned mini-batch step, a DP rank short of rows): each advances by U / u and
    # the step still ends at step x U (catches a build whose decay stops short of its horizon)
    assert lr_positions(2, 2, 4) == [6, 8]
    assert lr_positions(2, 7, 8)[-1] == 16 and lr_positions(2, 7, 8)[0] == pytest.approx(8 + 8 / 7)
    assert lr_positions(1, 8, 4) == [0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4]  # more updates than U
    for bad in [(0, 1, 1), (1, 0, 1), (1, 1, 0)]:
        with pytest.raises(ValueError):
            lr_positions(*bad)


def test_a_short_step_reaches_the_configured_minimum_lr():
    """The positions of a run whose steps make fewer updates than U end at the horizon: min_lr."""
    from fastrl.training.geometry import lr_positions

    optimizer = types.SimpleNamespace(param_groups=[{"params": [], "lr": 0.0, "weight_decay": 0.0}])
    scheduler = build_lr_scheduler(optimizer, OptimizerConfig(lr=1e-3, min_lr=1e-5, lr_decay_style="cosine"), 3 * 8)
    for step, updates in enumerate([8, 7, 3], start=1):
        for position in lr_positions(step, updates, 8):
            scheduler.num_steps = position
            scheduler.step(increment=0)
    assert scheduler.num_steps == scheduler.lr_decay_steps == 24
    assert optimizer.param_groups[0]["lr"] == 1e-5
