"""Loss and gradients of the actor update equal the single-process model on the same batch."""

from __future__ import annotations

import pytest
import torch
from launcher import run_distributed
from transformers import AutoModelForCausalLM
from workers import hf_loss_and_grads, train_worker

from fastrl.config import AlgorithmConfig

pytestmark = pytest.mark.distributed

LAYOUTS = [  # (world size, TP, PP): DP = world / (TP x PP)
    pytest.param(1, 1, 1, id="world1"),
    pytest.param(2, 2, 1, id="tp2"),
    pytest.param(2, 1, 2, id="pp2"),
    pytest.param(2, 1, 1, id="dp2"),
    pytest.param(4, 2, 2, id="tp2xpp2"),
]


@pytest.mark.parametrize("world, tp, pp", LAYOUTS)
def test_loss_and_gradients_match_single_process_hf(qwen2_path, world, tp, pp):
    algorithm = AlgorithmConfig()  # PPO clip-higher + dual clip, token-mean, low-variance KL loss
    expected_loss, expected_grads = hf_loss_and_grads(qwen2_path, algorithm)
    results = run_distributed(train_worker, world, qwen2_path, tp, pp, algorithm, distributed_optimizer=False, step=False)
    for r in results:  # every rank reports the same global loss
        assert r["metrics"]["actor/loss"] == pytest.approx(expected_loss, rel=1e-5, abs=1e-7)
    grads = results[0]["tensors"]
    assert sorted(grads) == sorted(expected_grads)
    assert any(g.abs().max() > 1e-3 for g in expected_grads.values())
    for name, g in expected_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize(
    "world, tp, pp, loss_type",
    [pytest.param(2, 1, 1, "gspo", id="dp2-gspo"), pytest.param(2, 1, 2, "gspo_token", id="pp2-gspo_token")],
)
def test_sequence_level_losses_match_single_process_hf(qwen2_path, world, tp, pp, loss_type):
    """GSPO aggregates per response (global denominator = responses of the mini-batch). The clip
    range is widened so that the test batch's sequence ratios (~1.07) are not all clipped."""
    algorithm = AlgorithmConfig(loss_type=loss_type, loss_agg="seq_mean_token_mean", gspo_clip_low=0.2, gspo_clip_high=0.2)
    expected_loss, expected_grads = hf_loss_and_grads(qwen2_path, algorithm)
    results = run_distributed(train_worker, world, qwen2_path, tp, pp, algorithm, distributed_optimizer=False, step=False)
    assert results[0]["metrics"]["actor/loss"] == pytest.approx(expected_loss, rel=1e-5, abs=1e-7)
    assert results[0]["metrics"]["actor/seq_clipfrac"] < 1  # the policy-gradient term has a gradient
    for name, g in expected_grads.items():
        torch.testing.assert_close(results[0]["tensors"][name], g, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


def test_distributed_optimizer_step_matches_single_process(qwen2_path):
    """DP=2 x TP=2 with the DistributedOptimizer (sharded Adam state, global-norm clipping) takes
    the same step as one process."""
    algorithm = AlgorithmConfig(loss_agg="seq_mean_token_mean")
    single = run_distributed(train_worker, 1, qwen2_path, 1, 1, algorithm, distributed_optimizer=True, step=True)[0]
    multi = run_distributed(train_worker, 4, qwen2_path, 2, 1, algorithm, distributed_optimizer=True, step=True)
    assert multi[0]["metrics"]["actor/grad_norm"] == pytest.approx(single["metrics"]["actor/grad_norm"], rel=1e-5)
    assert single["metrics"]["actor/grad_norm"] > 0
    initial = AutoModelForCausalLM.from_pretrained(qwen2_path, dtype=torch.float32).state_dict()
    # Adam's first step moves every weight by about lr (1e-3); agree to 1% of that (elements with
    # gradients near zero are sensitive to the summation order of the reduced gradients)
    assert max(float((w - initial[name]).abs().max()) for name, w in single["tensors"].items()) > 5e-4
    for name, w in single["tensors"].items():
        torch.testing.assert_close(multi[0]["tensors"][name], w, rtol=0, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
