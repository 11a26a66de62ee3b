"""Command line: dotted overrides are type-checked; unknown keys name the closest key."""

import subprocess
import sys

import pytest

from fastrl.cli import apply_overrides
from fastrl.config import ConfigError, RunConfig
from fastrl.train import main


def test_overrides_are_typed():
    config = apply_overrides(
        RunConfig(),
        ["rollout.n=4", "optimizer.lr=3e-5", "pruning.method=cppo", "checkpoint.dir=/tmp/x",
         "trainer.max_steps=none", "logging.tensorboard=false", "algorithm.dual_clip_c=null"],
    )
    assert config.rollout.n == 4 and isinstance(config.rollout.n, int)
    assert config.optimizer.lr == pytest.approx(3e-5)
    assert config.pruning.method == "cppo"
    assert config.checkpoint.dir == "/tmp/x"
    assert config.trainer.max_steps is None
    assert config.logging.tensorboard is False
    assert config.algorithm.dual_clip_c is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("algorithm.clip_hihg=0.3", "did you mean 'algorithm.clip_high'"),
        ("rollout.n=four", "rollout.n='four' is not an integer"),
        ("rollout.n=2.5", "is not an integer"),
        ("pruning.method=magic", "pruning.method='magic' is not one of"),
        ("logging.tensorboard=maybe", "is not a boolean"),
        ("rollout.temperature", "not of the form key.path=value"),
        ("rollout.n=1", "needs at least 2 responses"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        apply_overrides(RunConfig(), [override])


def test_main_dry_run_prints_resolved_config(capsys):
    assert main(["--recipe", "easyvqa_tiny_fastrl_grpo_cpu", "rollout.n=6", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert '"recipe": "easyvqa_tiny_fastrl_grpo_cpu"' in out
    assert '"n": 6' in out


def test_cli_wrong_override_exits_nonzero_with_closest_key():
    proc = subprocess.run(
        [sys.executable, "-m", "fastrl.train", "--recipe", "easyvqa_tiny_fastrl_grpo_cpu", "algorithm.clip_hihg=0.3"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "algorithm.clip_high" in proc.stderr


def test_describe_lists_every_key(capsys):
    assert main(["--describe"]) == 0
    out = capsys.readouterr().out
    assert "pruning.similarity_threshold = 0.2" in out
    assert "Jaccard similarity threshold" in out
