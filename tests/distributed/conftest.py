"""Tiny Hugging Face model directories shared by the distributed tests (built once per session):
Qwen2 and Llama text models (``hf_models``) and FastRL's tiny Qwen2.5-VL (``fastrl.models.tiny``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hf_models import llama_dir, qwen2_dir  # noqa: E402

from fastrl.config import ModelConfig  # noqa: E402
from fastrl.models.tiny import build_tiny_hf_model_dir  # noqa: E402

#: A smaller tiny Qwen2.5-VL than the CPU recipe's (2 layers so that PP=2 has one per stage).
TINY_VL = ModelConfig(
    tiny_hidden_size=64, tiny_num_layers=2, tiny_num_attention_heads=4, tiny_num_key_value_heads=2,
    tiny_intermediate_size=128, tiny_vision_depth=1, tiny_vision_hidden_size=32,
)  # fmt: skip


@pytest.fixture(scope="session")
def qwen2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen2_dir(tmp_path_factory.mktemp("qwen2") / "model")


@pytest.fixture(scope="session")
def qwen25vl_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_hf_model_dir(tmp_path_factory.mktemp("qwen25vl") / "model", TINY_VL)


@pytest.fixture(scope="session")
def llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llama_dir(tmp_path_factory.mktemp("llama") / "model")
