"""``algorithm.kl_in_reward=true`` through the real trainer (issue 19, item 1): the KL penalty is
computed on the full batch before the advantages and changes what the update sees."""

import os
import subprocess
import sys

import pytest

from tests.functional.conftest import REPO, TINY, read_jsonl

pytestmark = pytest.mark.functional

RECIPE = "easyvqa_tiny_fastrl_grpo_cpu"
#: a coin-flip reward so that step 1 has non-zero advantages (the untrained policy is never right)
COMMON = [
    "trainer.max_steps=2", "trainer.val_before_train=false", "algorithm.use_kl_loss=false",
    "reward.name=tests/functional/coin_rewards.py:one_in_two",
]


def _start(out_dir, *overrides):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "fastrl.train", "--recipe", RECIPE, *TINY, f"logging.output_dir={out_dir}", *COMMON, *overrides]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _train(out_dir):
    return {r["step"]: r for r in read_jsonl(out_dir / RECIPE / "metrics.jsonl") if r["kind"] == "train"}


def test_kl_penalty_changes_the_rewards_the_advantages_see(tmp_path):
    # the two runs side by side (two processes) to keep the test short
    procs = {
        "kl": _start(tmp_path / "kl", "algorithm.kl_in_reward=true", "algorithm.kl_coef=0.1"),
        "plain": _start(tmp_path / "plain"),
    }
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            pytest.fail(f"{name} run failed ({proc.returncode}):\n{out[-6000:]}")
    kl, plain = _train(tmp_path / "kl"), _train(tmp_path / "plain")
    assert sorted(kl) == sorted(plain) == [1, 2]
    # step 1: the policy is the reference, so the penalty is 0 and both runs train alike
    assert kl[1]["kl_penalty/mean"] == 0.0 and kl[1]["reward/penalized_mean"] == kl[1]["reward/mean"]
    assert kl[1]["advantage/std"] == plain[1]["advantage/std"]
    # step 2: same rollouts (same weights after identical step-1 updates), same task reward ...
    assert kl[2]["reward/mean"] == plain[2]["reward/mean"]
    # ... but a non-zero penalty, subtracted from the rewards the advantages are computed from
    assert kl[2]["kl_penalty/mean"] > 0 and kl[2]["kl_penalty/token_kl_mean"] > 0
    assert kl[2]["kl_penalty/mean"] == pytest.approx(0.1 * kl[2]["kl_penalty/sequence_kl_mean"], rel=1e-5)
    assert kl[2]["reward/penalized_mean"] == pytest.approx(kl[2]["reward/mean"] - kl[2]["kl_penalty/mean"], abs=1e-6)
    assert kl[2]["reward/penalized_mean"] != plain[2]["reward/mean"]
    assert kl[2]["advantage/std"] != plain[2]["advantage/std"]
    assert "kl_penalty/mean" not in plain[2] and "actor/kl_loss" not in kl[2]
