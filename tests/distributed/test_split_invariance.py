"""The free update geometry's token-budget micro-batches: the loss and the gradient of a batch do
not depend on how its rows are cut into micro-batches (global token-count normalization)."""

from __future__ import annotations

import pytest
import torch
from launcher import run_distributed
from split_workers import split_worker

from fastrl.config import AlgorithmConfig

pytestmark = pytest.mark.distributed

SPLITS = [None, [6], [3, 3], [1, 2, 3], [4, 1, 1]]  # 1 per micro-batch; split 1, 2 and 3 ways


@pytest.mark.parametrize(
    "algorithm",
    [
        pytest.param(AlgorithmConfig(), id="ppo-token_mean"),
        pytest.param(
            AlgorithmConfig(loss_type="gspo", loss_agg="seq_mean_token_mean", gspo_clip_low=0.2, gspo_clip_high=0.2),
            id="gspo-seq_mean",
        ),
    ],
)
def test_gradient_does_not_depend_on_the_micro_batch_cut(qwen2_path, algorithm):
    results = run_distributed(split_worker, 1, qwen2_path, algorithm, SPLITS)[0]["results"]
    first = results[0]
    assert any(g.abs().max() > 1e-4 for g in first["grads"].values())
    for other in results[1:]:
        assert other["loss"] == pytest.approx(first["loss"], rel=1e-5, abs=1e-7)
        for name, g in first["grads"].items():
            torch.testing.assert_close(other["grads"][name], g, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
