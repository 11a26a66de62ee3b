"""The layer-spec choice: local vs Transformer Engine, FP8 settings, and refusal of FP8 without TE."""

from __future__ import annotations

import pytest
import torch

import fastrl.config.model as config_module
from fastrl.config import ConfigError, PrecisionConfig
from fastrl.models.layer_spec import choose_layers, fp8_settings


def _fp8(monkeypatch, **kwargs) -> PrecisionConfig:
    """An fp8 precision config (built anywhere; only training needs Transformer Engine)."""
    return PrecisionConfig(mode="fp8", **kwargs)


def test_fp8_without_transformer_engine_fails_at_construction(monkeypatch):
    precision = _fp8(monkeypatch)
    with pytest.raises(ConfigError, match="needs NVIDIA Transformer Engine"):
        choose_layers(precision, te_available=False)


def test_fp8_with_transformer_engine_uses_te_layers_and_megatron_fp8_fields(monkeypatch):
    precision = _fp8(monkeypatch, fp8_format="hybrid", fp8_recipe="delayed", fp8_amax_history_len=16)
    choice = choose_layers(precision, te_available=True)
    assert choice.impl == "transformer_engine"
    assert choice.config_overrides["fp8"] == "hybrid"
    assert choice.config_overrides["fp8_recipe"] == "delayed"
    assert choice.config_overrides["fp8_amax_history_len"] == 16
    assert choice.config_overrides["fp8_amax_compute_algo"] == "max"
    assert choice.config_overrides["bf16"] is True and choice.config_overrides["params_dtype"] == torch.bfloat16


@pytest.mark.parametrize("recipe", ["tensorwise", "mxfp8", "blockwise"])
def test_non_delayed_recipes_carry_no_amax_history(monkeypatch, recipe):
    settings = fp8_settings(_fp8(monkeypatch, fp8_format="e4m3", fp8_recipe=recipe))
    assert settings == {"fp8": "e4m3", "fp8_recipe": recipe}


def test_mxfp8_with_hybrid_format_is_rejected(monkeypatch):
    monkeypatch.setattr(config_module, "transformer_engine_available", lambda: True)
    with pytest.raises(ConfigError, match="mxfp8"):
        PrecisionConfig(mode="fp8", fp8_recipe="mxfp8", fp8_format="hybrid")


@pytest.mark.parametrize("mode, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_without_transformer_engine_the_local_spec_is_used(mode, dtype):
    choice = choose_layers(PrecisionConfig(mode=mode), te_available=False)
    assert choice.impl == "local"
    assert choice.config_overrides["params_dtype"] == dtype
    assert choice.config_overrides["bf16"] is (mode == "bf16")
    assert "fp8" not in choice.config_overrides


def test_sequence_parallel_without_transformer_engine_is_refused():
    with pytest.raises(ConfigError, match="sequence_parallel=true needs Transformer Engine"):
        choose_layers(PrecisionConfig(mode="bf16"), sequence_parallel=True, te_available=False)
    assert choose_layers(PrecisionConfig(mode="bf16"), sequence_parallel=True, te_available=True).impl == "transformer_engine"
