"""Exact resume: 4 steps straight == 2 steps + resume + 2 steps (bit-identical weights and metrics).

The untrained tiny policy never answers right, so under the recipe's strict reward every advantage
is 0 and the policy-gradient term vanishes: a resume that lost the Adam moments would still look
exact. The runs use the deterministic coin reward (``tests/functional/coin_rewards.py``: about half
of the responses score 1), and the test asserts that every step's advantages and gradient are
non-zero. Breakage checked: skipping ``optimizer.load_state_dict`` on resume
(``fastrl/checkpoint/io.py``, Adam restarts from zero moments) fails the weight comparison.
"""

import pytest
import torch

from tests.functional.conftest import COIN_REWARD, read_jsonl, run_train

pytestmark = [pytest.mark.functional, pytest.mark.long(80)]

# Metrics that measure time (or depend on it) legitimately differ between runs.
_TIMING = ("time/", "rollout/time_s", "rollout/tokens_per_s", "prune/time_s", "val/time_s", "wall_time")


def _deterministic(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(_TIMING) and k != "time/train_elapsed"}


def _weights(ckpt_dir, tmp_path):
    """Every tensor of the actor checkpoint (model and optimizer state), read without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{ckpt_dir.parent.parent.parent.name}.pt"
    dcp_to_torch_save(str(ckpt_dir / "actor"), str(out))
    return torch.load(out, weights_only=False)


def test_two_plus_two_steps_equal_four(tmp_path):
    common = ["trainer.max_steps=4", "adaptive_sampling.period=steps", "adaptive_sampling.period_steps=2", COIN_REWARD]
    straight = tmp_path / "straight"
    run_train(straight, *common)
    split = tmp_path / "split"
    first = run_train(split, *common, "stage.max_steps=2")
    assert "checkpoint saved" in first.stdout + first.stderr
    second = run_train(split, *common, "stage.max_steps=2")
    assert "resumed from" in second.stdout + second.stderr

    a = read_jsonl(straight / "easyvqa_tiny_fastrl_grpo_cpu" / "metrics.jsonl")
    b = read_jsonl(split / "easyvqa_tiny_fastrl_grpo_cpu" / "metrics.jsonl")
    train_a = {r["step"]: _deterministic(r) for r in a if r["kind"] == "train"}
    train_b = {r["step"]: _deterministic(r) for r in b if r["kind"] == "train"}
    assert sorted(train_a) == sorted(train_b) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        assert train_a[step] == train_b[step], f"step {step} differs"
        # a trajectory that learns: the policy-gradient term is not 0 (it is under the strict reward)
        assert train_a[step]["advantage/abs_mean"] > 0.1 and train_a[step]["actor/grad_norm"] > 0, step
    # the adaptive sampler's decision at the period boundary (step 2) survived the restart
    assert train_a[2].get("ars/new_n") == train_b[2].get("ars/new_n")

    wa = _weights(straight / "easyvqa_tiny_fastrl_grpo_cpu" / "checkpoints" / "step_00000004", tmp_path)
    wb = _weights(split / "easyvqa_tiny_fastrl_grpo_cpu" / "checkpoints" / "step_00000004", tmp_path)
    assert sorted(wa) == sorted(wb)
    assert any("decoder.layers" in k for k in wa) and any("exp_avg" in k for k in wa)
    # Model weights and the optimizer state (fp32 main params, Adam moments; stored per parameter in
    # model space by the default fully_reshardable format) must be bit-identical.
    tensors = [k for k in wa if isinstance(wa[k], torch.Tensor)]
    assert len([k for k in tensors if k.startswith("optimizer.state.exp_avg.")]) > 10
    differing = [k for k in tensors if not torch.equal(wa[k], wb[k])]
    assert differing == []
