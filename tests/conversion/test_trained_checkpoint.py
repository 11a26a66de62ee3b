"""A checkpoint written by a short FastRL training run exports to Hugging Face and reloads in
transformers with the logits of the trained megatron model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TRAIN_OVERRIDES, check, run_tool
from conversion_workers import trained_logits_worker
from launcher import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.functional]


def test_trained_checkpoint_exports_with_identical_logits(trained_run: Path, tmp_path: Path):
    from transformers import Qwen2_5_VLForConditionalGeneration

    from tools.verify_conversion import hf_logits, sample_inputs

    root = trained_run / "checkpoints"
    out = tmp_path / "hf"
    check(run_tool("convert_checkpoint", "export", "--ckpt", root, "--out", out, "--no-progress"))
    info = json.loads((out / "fastrl_export.json").read_text())
    assert info["kind"] == "trainer" and info["step"] == 1

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(out, torch_dtype=torch.float32).eval()
    assert not model.config.tie_word_embeddings  # the recipe's tiny model has its own output layer
    assert model.lm_head.weight.data_ptr() != model.model.language_model.embed_tokens.weight.data_ptr()
    exported = hf_logits(model, sample_inputs(out))
    (trained,) = run_distributed(trained_logits_worker, 1, root, out, timeout_s=200)
    assert (trained[..., : exported.shape[-1]] - exported).abs().max() <= 1e-5


def test_verify_tool_tells_trained_from_initial_weights(trained_run: Path, tmp_path: Path):
    """The trained actor differs from the tiny model it started from: verify_conversion exits 1."""
    from fastrl.config import ModelConfig
    from fastrl.models.tiny import build_tiny_hf_model_dir

    fields = dict(o.removeprefix("model.").split("=") for o in TRAIN_OVERRIDES if o.startswith("model."))
    initial = build_tiny_hf_model_dir(tmp_path / "initial", ModelConfig(**{k: int(v) for k, v in fields.items()}))
    proc = run_tool("verify_conversion", "--hf", initial, "--ckpt", trained_run / "checkpoints", "--top", "3")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISMATCH" in proc.stderr and "Traceback" not in proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("logits "))
    assert float(row.split()[1]) > 1e-5
