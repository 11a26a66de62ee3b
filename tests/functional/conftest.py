"""Tiny end-to-end runs of ``python -m fastrl.train`` (a few steps of a tiny model, minutes at most)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.trainer_fork import run_trainer

REPO = Path(__file__).resolve().parents[2]

#: Overrides that make the default recipe tiny: a 2-layer model, 4 prompts x 4 rollouts per step.
TINY = [
    "model.tiny_hidden_size=64", "model.tiny_num_layers=2", "model.tiny_intermediate_size=128",
    "model.tiny_vision_hidden_size=32", "model.tiny_vision_depth=1",
    "rollout.prompts_per_step=4", "rollout.n=4", "trainer.mini_batch_prompts=2", "parallel.micro_batch_size=4", "rollout.max_response_length=16",
    "data.val_size=16", "data.max_train_samples=64", "trainer.val_every=0", "warm_start.enabled=false",
    "logging.progress_bar=false", "logging.tensorboard=false", "logging.plots=false", "reward.num_workers=1", "trainer.torch_threads=1",
]

#: A deterministic reward under which the untrained tiny policy gets non-zero advantages (about half
#: of its responses score 1; tests/functional/coin_rewards.py). Under the recipe's strict reward it
#: never answers right, every GRPO advantage is 0 and a run never takes a policy-gradient step.
COIN_REWARD = "reward.name=tests/functional/coin_rewards.py:one_in_two"


def train_process(out_dir: Path, *overrides: str, recipe: str = "easyvqa_tiny_fastrl_grpo_cpu",
                  timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m fastrl.train --recipe RECIPE TINY... overrides`` in its own process (forked from a
    process that has imported the trainer, tests/trainer_fork.py), whatever its exit code."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    argv = ["--recipe", recipe, *TINY, f"logging.output_dir={out_dir}", *overrides]
    return run_trainer(argv, env=env, cwd=REPO, timeout=timeout)


def run_train(out_dir: Path, *overrides: str, recipe: str = "easyvqa_tiny_fastrl_grpo_cpu", timeout: int = 600):
    """:func:`train_process`, failing the test unless the trainer exits 0; returns the CompletedProcess."""
    proc = train_process(out_dir, *overrides, recipe=recipe, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"trainer failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
