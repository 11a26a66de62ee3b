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
