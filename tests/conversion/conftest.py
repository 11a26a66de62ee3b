"""Fixtures of the conversion tests: a tiny tied Qwen2.5-VL, an imported checkpoint made by the CLI,
and a checkpoint written by a one-step training run. Each is built once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "distributed"))  # launcher.run_distributed

from fastrl.config import ModelConfig  # noqa: E402
from fastrl.models.tiny import build_tiny_hf_model_dir  # noqa: E402

#: Tiny Qwen2.5-VL (built with tied and with untied embeddings); TP=2 divides the 4 query / 2 key-value heads, the 2 vision
#: heads and the 128-token vocabulary, PP=2 the 2 layers.
TINY_VL = ModelConfig(
    tiny_hidden_size=64, tiny_num_layers=2, tiny_num_attention_heads=4, tiny_num_key_value_heads=2,
    tiny_intermediate_size=128, tiny_vision_depth=1, tiny_vision_hidden_size=64,
)  # fmt: skip

#: The tiny overrides of tests/functional/conftest.py (micro-batch of 1 rollout for the 8-rollout
#: mini-batches), one training step.
TRAIN_OVERRIDES = [
    "model.tiny_hidden_size=64", "model.tiny_num_layers=2", "model.tiny_intermediate_size=128",
    "model.tiny_vision_hidden_size=32", "model.tiny_vision_depth=1",
    "rollout.prompts_per_step=4", "rollout.n=4", "trainer.mini_batch_prompts=2", "rollout.max_response_length=16",
    "data.val_size=16", "data.max_train_samples=64", "trainer.val_every=0", "warm_start.enabled=false",
    "logging.progress_bar=false", "logging.tensorboard=false", "logging.plots=false", "reward.num_workers=1", "trainer.torch_threads=1",
    "parallel.micro_batch_size=1", "trainer.max_steps=1",
]  # fmt: skip


def run_tool(tool: str, *args: object, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``tools/<tool>.py`` with ``args`` in a subprocess (output captured, never raises on failure)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)
    cmd = [sys.executable, str(REPO / "tools" / f"{tool}.py"), *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if proc.returncode != 0:
        pytest.fail(f"{proc.args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


@pytest.fixture(scope="session")
def tied_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_hf_model_dir(tmp_path_factory.mktemp("tied") / "model", TINY_VL, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def tied_bf16_hf(tied_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tied model stored in bfloat16 (as released Qwen2.5-VL checkpoints are)."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("tied_bf16") / "model"
    shutil.copytree(tied_hf, out)
    weights = load_file(str(out / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="session")
def untied_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_hf_model_dir(tmp_path_factory.mktemp("untied") / "model", TINY_VL, tie_word_embeddings=False)


@pytest.fixture(scope="session")
def imported_tp1(tied_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``convert_checkpoint.py import`` of the tied model at TP=1, PP=1."""
    out = tmp_path_factory.mktemp("imported") / "tp1pp1"
    check(run_tool("convert_checkpoint", "import", "--hf", tied_hf, "--out", out, "--tp", 1, "--pp", 1))
    return out


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of ``python -m fastrl.train`` (tiny default recipe, one step)."""
    out = tmp_path_factory.mktemp("train")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable, "-m", "fastrl.train", "--recipe", "easyvqa_tiny_fastrl_grpo_cpu", *TRAIN_OVERRIDES,
        f"logging.output_dir={out}",
    ]  # fmt: skip
    check(subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600))
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir
