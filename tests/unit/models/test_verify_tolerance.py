"""``tools/verify_conversion.py``'s verdict (issue 45, item 6): identical tensors with float32 logit
differences that grow with depth and logit size pass; a real difference fails, naming what differs."""

from __future__ import annotations

import argparse

import pytest
import torch

from tools.verify_conversion import Report, auto_logit_tolerance, parse_tol, transformer_blocks

EPS = torch.finfo(torch.float32).eps


def _report(logits_max: float, *, blocks: int, ref_logit_max: float, tensor_diff: float = 0.0) -> Report:
    tensors = {f"model.layers.{i}.mlp.down_proj.weight": 0.0 for i in range(blocks)}
    tensors["lm_head.weight"] = tensor_diff
    return Report(logits_max=logits_max, logits_mean=logits_max / 5, positions=7, vocab=128, tensor_max=tensors,
                  missing=[], extra=[], blocks=blocks, ref_logit_max=ref_logit_max)


def test_deep_model_with_identical_tensors_passes_at_default_tolerance():
    """catches: the fixed default of 1e-5 (validated on 2-layer models): SmolLM2's correct export
    (30 layers, all tensors identical, logits 2.6e-5 apart) and the 24-layer tiny model of
    tests/conversion/test_verify_deep.py (2.3e-5) were reported MISMATCH."""
    smollm2 = _report(2.6e-5, blocks=30, ref_logit_max=25.0)
    assert smollm2.ok(None, 0.0), smollm2.failures(None, 0.0)
    deep_tiny = _report(2.34e-5, blocks=24, ref_logit_max=13.8)
    assert deep_tiny.ok(None, 0.0)
    assert "auto: 10 x eps(float32) x 24 blocks" in deep_tiny.tolerance_text(None)


def test_tolerance_scales_with_depth_logits_and_dtype():
    """catches: a tolerance that ignores the depth, the logits' size or the compute dtype (one
    constant would be too loose for a 2-layer model or too tight for a 30-layer one)."""
    assert auto_logit_tolerance(30, 25.0) == pytest.approx(10 * EPS * 30 * 25.0)
    assert auto_logit_tolerance(2, 0.5) == pytest.approx(10 * EPS * 2)  # small logits: the floor of 1
    assert auto_logit_tolerance(60, 25.0) == pytest.approx(2 * auto_logit_tolerance(30, 25.0))
    assert auto_logit_tolerance(30, 25.0, torch.bfloat16) / auto_logit_tolerance(30, 25.0) == pytest.approx(2**16)


def test_real_differences_still_fail():
    """catches: a verdict that passes on the logits alone (a weight that differs), or a tolerance so
    loose that a wrong config (logits off by 1e-2) passes on a deep model."""
    differing_weight = _report(1e-7, blocks=2, ref_logit_max=1.0, tensor_diff=1e-6)
    assert differing_weight.failures(None, 0.0) == [
        "1 tensor(s) differ by more than --weight-tol 0 (largest 1.000e-06 in lm_head.weight)"]
    wrong_config = _report(1e-2, blocks=30, ref_logit_max=25.0)
    (failure,) = wrong_config.failures(None, 0.0)
    assert failure.startswith("logits differ by 1.000e-02 > 8.94e-04 (auto:")
    assert _report(2e-5, blocks=2, ref_logit_max=1.0).failures(1e-5, 0.0) == ["logits differ by 2.000e-05 > 1e-05"]
    names = Report(0.0, 0.0, 1, 1, {}, missing=["lm_head.weight"], extra=[], blocks=2)
    assert not names.ok(None, 0.0)


def test_blocks_and_tol_parsing():
    """catches: the vision tower left out of a Qwen2.5-VL model's depth, a config without a layer
    count silently taken as depth 0, or --tol accepting 0 / text."""
    assert transformer_blocks({"num_hidden_layers": 30}) == 30
    assert transformer_blocks({"text_config": {"num_hidden_layers": 28}, "vision_config": {"depth": 32}}) == 60
    with pytest.raises(ValueError, match="num_hidden_layers"):
        transformer_blocks({"model_type": "x"})
    assert parse_tol("auto") is None and parse_tol("5e-4") == 5e-4
    for bad in ("0", "-1", "loose"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_tol(bad)
