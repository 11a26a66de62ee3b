"""Tiny Hugging Face model directories shared by the distributed tests (built once per session)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hf_models import qwen2_dir, qwen25vl_dir  # noqa: E402


@pytest.fixture(scope="session")
def qwen2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen2_dir(tmp_path_factory.mktemp("qwen2") / "model")


@pytest.fixture(scope="session")
def qwen25vl_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen25vl_dir(tmp_path_factory.mktemp("qwen25vl") / "model")
