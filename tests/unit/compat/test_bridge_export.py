"""fastrl.compat.bridge_export: megatron-bridge exports from a model directory without weight files.

The full import -> export round trips are in ``tests/conversion``; here the upstream failure and the
names the export then sees.
"""

from __future__ import annotations

import importlib.metadata
import types

import pytest
import torch

from fastrl import compat
from fastrl.compat.bridge_export import use_weight_names

NAMES = ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"]


def test_written_for_megatron_bridge_0_3():
    version = importlib.metadata.version("megatron-bridge")
    assert version.startswith("0.3."), f"megatron-bridge {version}: re-check fastrl/compat/bridge_export.py"


def test_export_source_without_weight_files_fails_upstream_and_uses_the_recorded_names(tmp_path):
    from transformers import Qwen2Config

    Qwen2Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, architectures=["Qwen2ForCausalLM"],
    ).save_pretrained(tmp_path)  # fmt: skip
    bridge = compat.import_auto_bridge().from_hf_pretrained(str(tmp_path), torch_dtype=torch.float32)
    # what the export asks to learn which weights (and whether lm_head.weight) to write
    with pytest.raises(FileNotFoundError):
        bridge.hf_pretrained.state.source.get_all_keys()
    use_weight_names(types.SimpleNamespace(bridge=bridge), NAMES)
    assert sorted(bridge.hf_pretrained.state.source.get_all_keys()) == NAMES
