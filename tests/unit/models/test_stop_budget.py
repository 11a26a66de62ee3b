"""The stop budget (fastrl/models/stop_budget.py): what slurm/submit.sh's --grace must hold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fastrl.models.memory_plan import estimate_memory
from fastrl.models.model_dims import KNOWN_MODELS
from fastrl.models.stop_budget import MIN_GRACE_S, estimate_stop_budget
from fastrl.train import main
from recipes import get_recipe

R7B = "qwen25vl_7b_fastrl_grpo_geo3k_h100_bf16"


def _budget(name: str):
    cfg = get_recipe(name)
    world = cfg.parallel.world_size
    plan = estimate_memory(cfg, world, cfg.parallel.gpu_memory_gib)
    return estimate_stop_budget(cfg, plan, KNOWN_MODELS[cfg.model.hf_path], world)


def test_a_7b_stop_needs_more_than_the_default_grace():
    """7B on one node of 8 H100: a save of the 116 GB checkpoint (bf16 weights 2 B + fp32 main
    weights and Adam moments 12 B per parameter, 8.29 B parameters) at 1 GB/s takes 116 s alone;
    with one step and a validation the stop needs 900 s, three times submit.sh's old fixed 300.

    catches: a budget without the save (780 s), without the validation, or the checkpoint counted
    without its optimizer state (2 B per parameter: 17 GB)."""
    b = _budget(R7B)
    assert b.checkpoint_gb == pytest.approx(14 * 8_292_166_656 / 1e9)
    assert b.save_s == pytest.approx(b.checkpoint_gb) and b.nodes == 1
    assert b.total_s == pytest.approx(b.generation_s + b.training_s + b.validation_s + b.save_s)
    assert b.grace_s == 900 > MIN_GRACE_S


def test_an_fp32_checkpoint_counts_its_main_weights_too():
    """megatron's fully_reshardable format stores the fp32 main weights even when the model itself
    is fp32 (SmolLM2-135M's fp32 checkpoints take 2,154 MB: 16 bytes a parameter).

    catches: an fp32 checkpoint counted at 12 bytes a parameter (weights and Adam's two moments,
    without the main weights)."""
    cfg = get_recipe(R7B)
    cfg = replace(cfg, precision=replace(cfg.precision, mode="fp32"))
    world = cfg.parallel.world_size
    plan = estimate_memory(cfg, world, cfg.parallel.gpu_memory_gib)
    b = estimate_stop_budget(cfg, plan, KNOWN_MODELS[cfg.model.hf_path], world)
    assert b.checkpoint_gb == pytest.approx(16 * 8_292_166_656 / 1e9)


def test_dry_run_prints_the_line_submit_reads(capsys):
    """``--dry-run`` ends its memory plan with ``# stop grace: >= N s (...)``, the line
    slurm/submit.sh parses.

    catches: the line's format changed without submit.sh (its sed would find no number)."""
    assert main(["--recipe", R7B, "--dry-run"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("# stop grace: >= ")]
    assert len(lines) == 1 and lines[0].startswith("# stop grace: >= 900 s (one step: generation ")
