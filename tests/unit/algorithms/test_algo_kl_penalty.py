"""KL in the reward (EasyR1/verl ``apply_kl_penalty``): hand-computed vectors."""

import math

import pytest
import torch

from fastrl.algorithms.advantages import grpo_advantages
from fastrl.algorithms.kl_penalty import kl_penalized_rewards

# Two responses in a [N=2, T=4] layout: column 0 is a prompt token, the rest response (row 1 ends early).
SCORES = torch.tensor([1.0, 0.0])
OLD = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -0.5, -0.2, 0.0]])
REF = torch.tensor([[-9.0, -1.5, -1.0, -0.5], [-9.0, -0.5, -0.7, -30.0]])
MASK = torch.tensor([[False, True, True, True], [False, True, True, False]])


def test_k1_vector_sums_over_response_tokens():
    out = kl_penalized_rewards(SCORES, OLD, REF, MASK, kl_coef=0.1, estimator="k1")
    # k1 = old - ref on response tokens: row 0: 0.5, -1.0, 0.0 -> -0.5; row 1: 0.0, 0.5 -> 0.5
    assert out.token_kl.flatten().tolist() == pytest.approx([0.0, 0.5, -1.0, 0.0, 0.0, 0.0, 0.5, 0.0])
    assert out.sequence_kl.tolist() == pytest.approx([-0.5, 0.5])
    assert out.penalty.tolist() == pytest.approx([-0.05, 0.05])
    assert out.rewards.tolist() == pytest.approx([1.05, -0.05])
    assert out.rewards.dtype == torch.float32


def test_low_var_kl_vector():
    out = kl_penalized_rewards(SCORES, OLD, REF, MASK, kl_coef=0.5, estimator="low_var_kl")
    k3 = lambda old, ref: math.exp(ref - old) - (ref - old) - 1.0  # noqa: E731
    row0 = k3(-1.0, -1.5) + k3(-2.0, -1.0) + k3(-0.5, -0.5)  # 0.106531 + 0.718282 + 0
    row1 = k3(-0.5, -0.5) + k3(-0.2, -0.7)  # 0 + 0.106531
    assert row0 == pytest.approx(0.8248125, abs=1e-6) and row1 == pytest.approx(0.1065307, abs=1e-6)
    assert out.sequence_kl.tolist() == pytest.approx([row0, row1], abs=1e-6)
    assert out.rewards.tolist() == pytest.approx([1.0 - 0.5 * row0, -0.5 * row1], abs=1e-6)
    # the prompt column (ref -9) and the padded token (ref -30) are outside the mask: no effect
    assert out.token_kl[:, 0].abs().sum() == 0 and out.token_kl[1, 3] == 0


def test_zero_coef_and_identical_policies_leave_rewards():
    assert torch.equal(kl_penalized_rewards(SCORES, OLD, REF, MASK, kl_coef=0.0, estimator="k2").rewards, SCORES)
    same = kl_penalized_rewards(SCORES, OLD, OLD.clone(), MASK, kl_coef=1.0, estimator="low_var_kl")
    assert torch.equal(same.rewards, SCORES) and same.penalty.abs().sum() == 0


def test_penalty_changes_group_advantages():
    # a group of 4 with equal task rewards: only the KL tells them apart (as in verl)
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0])
    old = torch.tensor([[-1.0, -1.0]] * 4)
    ref = torch.tensor([[-1.0, -1.0], [-2.0, -1.0], [-1.0, -1.0], [-1.0, -3.0]])
    out = kl_penalized_rewards(scores, old, ref, torch.ones(4, 2, dtype=torch.bool), kl_coef=0.1, estimator="k1")
    assert out.rewards.tolist() == pytest.approx([1.0, 0.9, 0.0, -0.2])
    adv = grpo_advantages(out.rewards, torch.zeros(4, dtype=torch.long))
    mean, std = 0.425, math.sqrt(((0.575**2) + (0.475**2) + (0.425**2) + (0.625**2)) / 3)
    assert adv.tolist() == pytest.approx([(r - mean) / (std + 1e-6) for r in (1.0, 0.9, 0.0, -0.2)], abs=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(scores=torch.zeros(3)), "N=3"),
        (dict(response_mask=torch.ones(2, 3, dtype=torch.bool)), "response_mask"),
        (dict(kl_coef=-0.1), "kl_coef"),
        (dict(kl_coef=float("nan")), "kl_coef"),
        (dict(estimator="k9"), "unknown KL estimator"),
    ],
)
def test_bad_input(kwargs, match):
    args = dict(scores=SCORES, old_log_probs=OLD, ref_log_probs=REF, response_mask=MASK, kl_coef=0.1, estimator="k1")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        kl_penalized_rewards(**args)
