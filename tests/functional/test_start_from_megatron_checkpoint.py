"""``model.megatron_checkpoint``: training starts from a directory made by ``convert_checkpoint.py import``."""

import subprocess
import sys

import pytest

from fastrl.config import ModelConfig
from tests.functional.conftest import REPO, TINY, read_jsonl, run_train

pytestmark = [pytest.mark.functional, pytest.mark.long(60)]

SMALL = dict(
    tiny_hidden_size=64, tiny_num_layers=2, tiny_intermediate_size=128, tiny_vision_hidden_size=32, tiny_vision_depth=1
)


def test_train_from_imported_checkpoint(tmp_path):
    from fastrl.models.tiny import build_tiny_hf_model_dir

    hf = build_tiny_hf_model_dir(tmp_path / "hf", ModelConfig(**SMALL))
    imported = tmp_path / "imported"
    proc = subprocess.run(
        [sys.executable, "tools/convert_checkpoint.py", "import", "--hf", str(hf), "--out", str(imported), "--tp", "1", "--pp", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    overrides = [o for o in TINY if not o.startswith("model.")]
    base = ["model.source=hf", f"model.hf_path={hf}", "trainer.max_steps=1", "trainer.val_before_train=false"]
    run_train(tmp_path / "from_hf", *overrides, *base)
    # perturb the HF directory's weights: a run that ignored the checkpoint would now differ
    from safetensors.torch import load_file, save_file

    weights = load_file(hf / "model.safetensors")
    weights = {k: v * 1.5 if v.dim() == 2 else v for k, v in weights.items()}
    save_file(weights, hf / "model.safetensors", metadata={"format": "pt"})
    run_train(tmp_path / "from_ckpt", *overrides, *base, f"model.megatron_checkpoint={imported}")
    a = [r for r in read_jsonl(tmp_path / "from_hf" / "easyvqa_tiny_fastrl_grpo_cpu" / "metrics.jsonl") if r["kind"] == "train"]
    b = [r for r in read_jsonl(tmp_path / "from_ckpt" / "easyvqa_tiny_fastrl_grpo_cpu" / "metrics.jsonl") if r["kind"] == "train"]
    # the run started from the imported (original) weights, not from the perturbed directory
    for key in ("reward/mean", "response/length_mean", "prune/num_kept", "actor/loss", "actor/grad_norm"):
        assert a[0][key] == b[0][key], key
    assert b[0]["mismatch/abs_diff_max"] < 1e-4
