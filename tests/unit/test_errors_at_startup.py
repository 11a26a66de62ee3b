"""Clear errors for bad input to the parallel state, the model provider and the policy batch."""

from __future__ import annotations

import json

import pytest
import torch

from fastrl.batch import PolicyBatch
from fastrl.distributed.parallel_state import resolve_backend
from fastrl.models.provider import read_model_type


def test_backend_auto_is_gloo_without_cuda_and_nccl_needs_cuda():
    assert resolve_backend("auto") == "gloo"
    assert resolve_backend("gloo") == "gloo"
    with pytest.raises(RuntimeError, match="needs CUDA"):
        resolve_backend("nccl")


def test_model_type_is_read_from_the_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    assert read_model_type(tmp_path) == "qwen2_5_vl"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type='gpt2' is not supported"):
        read_model_type(tmp_path)
    with pytest.raises(FileNotFoundError, match="Hugging Face model directory"):
        read_model_type(tmp_path / "missing")


def _batch(n: int = 4, t: int = 5) -> PolicyBatch:
    mask = torch.ones(n, t, dtype=torch.bool)
    return PolicyBatch(input_ids=torch.arange(n * t).reshape(n, t), attention_mask=mask, response_mask=mask)


def test_micro_batches_must_divide_the_batch():
    assert [len(mb) for mb in _batch().micro_batches(2)] == [2, 2]
    with pytest.raises(ValueError, match="4 rollouts cannot be split into micro-batches of 3"):
        list(_batch().micro_batches(3))


def test_policy_batch_shapes_are_checked():
    with pytest.raises(ValueError, match="response_mask has shape"):
        PolicyBatch(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3, dtype=torch.bool),
                    response_mask=torch.ones(2, 4, dtype=torch.bool))  # fmt: skip
    with pytest.raises(ValueError, match=r"PolicyBatch.advantages has first dimension 3"):
        _batch(2).with_tensors(advantages=torch.zeros(3))
