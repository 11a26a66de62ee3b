"""A resumed LR schedule follows the new config (peak LR, decay horizon, Adam settings) and keeps
only the checkpoint's step count; with an unchanged config it is the checkpoint's exactly."""

from __future__ import annotations

import copy
import math
import types

import pytest

from fastrl.checkpoint.io import reapply_optimizer_settings
from fastrl.config import OptimizerConfig
from fastrl.training.actor import build_lr_scheduler


def _optimizer(cfg: OptimizerConfig):
    # the keys megatron's param groups carry (max_lr / min_lr are read by the scheduler)
    group = {"params": [], "lr": 0.0, "weight_decay": 0.0, "max_lr": cfg.lr, "min_lr": cfg.min_lr,
             "betas": (cfg.adam_beta1, cfg.adam_beta2), "eps": cfg.adam_eps}
    return types.SimpleNamespace(param_groups=[group])


def _resume(old: OptimizerConfig, old_total: int, new: OptimizerConfig, new_total: int, steps: int = 2):
    """Train ``steps`` under ``old``, then resume under ``new`` the way CheckpointIO.load does."""
    opt_a = _optimizer(old)
    sched_a = build_lr_scheduler(opt_a, old, old_total)
    for _ in range(steps):
        sched_a.step(increment=1)
    opt_b = _optimizer(new)
    sched_b = build_lr_scheduler(opt_b, new, new_total)
    opt_b.param_groups = copy.deepcopy(opt_a.param_groups)  # megatron restores the param groups as saved
    sched_b.load_state_dict(copy.deepcopy(sched_a.state_dict()))
    reapply_optimizer_settings(opt_b, new)
    sched_b.step(increment=0)
    return opt_a, sched_a, opt_b, sched_b


def test_changed_peak_lr_and_horizon_act_after_resume():
    old = OptimizerConfig(lr=1e-3, lr_decay_style="linear")
    new = OptimizerConfig(lr=2e-3, lr_decay_style="linear", adam_beta1=0.8, adam_eps=1e-6, weight_decay=0.1)
    _, _, opt, sched = _resume(old, 4, new, 8)
    assert sched.num_steps == 2 and sched.lr_decay_steps == 8 and sched.max_lr == 2e-3
    g = opt.param_groups[0]
    assert g["lr"] == pytest.approx(2e-3 * (1 - 2 / 8))  # the new peak, decaying over the new horizon
    assert g["betas"] == (0.8, 0.999) and g["eps"] == 1e-6 and g["weight_decay"] == pytest.approx(0.1)
    sched.step(increment=1)
    assert opt.param_groups[0]["lr"] == pytest.approx(2e-3 * (1 - 3 / 8))


def test_extending_a_run_moves_the_decay_horizon():
    cfg = OptimizerConfig(lr=1e-3, lr_decay_style="cosine", lr_warmup_steps=1)
    _, _, opt, sched = _resume(cfg, 4, cfg, 8, steps=4)
    assert sched.lr_decay_steps == 8
    # at the old horizon's end the LR had reached min_lr = 0; on the new one it is half way down
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 3 / 7)))


def test_unchanged_config_resumes_to_the_identical_schedule():
    cfg = OptimizerConfig(lr=1e-3, min_lr=1e-4, lr_warmup_steps=2, lr_decay_style="cosine")
    opt_a, sched_a, opt_b, sched_b = _resume(cfg, 6, cfg, 6, steps=3)
    assert opt_b.param_groups == opt_a.param_groups
    assert sched_b.state_dict() == sched_a.state_dict()
    for _ in range(3):
        sched_a.step(increment=1)
        sched_b.step(increment=1)
        assert opt_b.param_groups[0]["lr"] == opt_a.param_groups[0]["lr"]
