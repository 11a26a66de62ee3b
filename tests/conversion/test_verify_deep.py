"""``tools/verify_conversion.py`` on a deeper tiny model (issue 45, item 6): a correct conversion
(every tensor identical) whose float32 logits differ by more than the old fixed 1e-5 -- as
SmolLM2's 30 layers do -- passes at the default ``--tol auto``, and still fails at ``--tol 1e-5``.

The model: the tiny text Qwen2 at 24 layers, its weight matrices scaled by 5 and its output layer
by 20, so that every block changes the residual stream and the logits reach ~14 (a random 0.02-std
initialization gives logits below 1 and blocks that barely matter: differences of 3e-7 at any depth).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import check, run_tool

pytestmark = [pytest.mark.distributed]


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(Hugging Face directory, its imported checkpoint)``."""
    import shutil

    from safetensors.torch import load_file, save_file

    from fastrl.config import ModelConfig
    from fastrl.models.tiny import build_tiny_text_model_dir

    base = tmp_path_factory.mktemp("deep")
    model = ModelConfig(architecture="qwen2", tiny_hidden_size=128, tiny_num_layers=24, tiny_num_attention_heads=2,
                        tiny_num_key_value_heads=2, tiny_intermediate_size=256)
    built = build_tiny_text_model_dir(base / "built", model)
    hf = base / "hf"
    shutil.copytree(built, hf)
    weights = load_file(str(hf / "model.safetensors"))
    scaled = {k: (v * (20.0 if k == "lm_head.weight" else 5.0) if v.dim() == 2 else v).contiguous() for k, v in weights.items()}
    save_file(scaled, str(hf / "model.safetensors"), metadata={"format": "pt"})
    ckpt = base / "megatron"
    check(run_tool("convert_checkpoint", "import", "--hf", hf, "--out", ckpt))
    return hf, ckpt


def _logits_row(proc) -> float:
    row = next(line for line in proc.stdout.splitlines() if line.startswith("logits "))
    return float(row.split()[1])


def test_correct_deep_conversion_passes_at_the_default_tolerance(deep_model):
    """catches: the fixed default --tol 1e-5, which reported this identical-tensor conversion MISMATCH."""
    hf, ckpt = deep_model
    proc = check(run_tool("verify_conversion", "--hf", hf, "--ckpt", ckpt, "--top", "1"))
    assert _logits_row(proc) > 1e-5  # the premise: the old default would have failed it
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("verify_conversion: OK (all 291 tensors identical; logits max "), last
    assert "auto: 10 x eps(float32) x 24 blocks" in last


def test_explicit_tolerance_still_applies(deep_model):
    """catches: --tol ignored once the default is automatic (a user's tighter bound silently dropped)."""
    hf, ckpt = deep_model
    proc = run_tool("verify_conversion", "--hf", hf, "--ckpt", ckpt, "--tol", "1e-5", "--top", "1")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "verify_conversion: MISMATCH: logits differ by " in proc.stderr and "> 1e-05" in proc.stderr
    assert "Traceback" not in proc.stderr
