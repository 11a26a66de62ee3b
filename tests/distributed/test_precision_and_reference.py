"""bf16 training with fp32 master weights, and the frozen reference policy."""

from __future__ import annotations

import pytest
import torch
from launcher import run_distributed
from workers import bf16_and_reference_worker, hf_log_probs, make_batch

pytestmark = pytest.mark.distributed


def test_bf16_update_with_frozen_reference_at_tp2(qwen2_path):
    results = run_distributed(bf16_and_reference_worker, 2, qwen2_path)
    r = results[0]
    assert r["param_dtypes"] == ["torch.bfloat16"]
    assert r["main_param_dtypes"] == ["torch.float32"]  # fp32 master weights and Adam state
    assert r["ref_requires_grad"] is False
    batch = make_batch()
    mask = batch.response_mask
    expected = hf_log_probs(qwen2_path, batch)
    torch.testing.assert_close(r["ref"], expected, rtol=1e-4, atol=1e-5)  # fp32 reference
    assert (r["before"] - expected)[mask].abs().max() < 0.05  # bf16 actor: same model, bf16 rounding
    assert r["metrics"]["actor/grad_norm"] > 0 and r["metrics"]["actor/update_skipped"] == 0
    assert (r["after"] - r["before"])[mask].abs().max() > 1e-3  # the actor moved
    assert torch.equal(r["ref_after"], r["ref"])  # the reference did not
    assert r["mismatch"]["tokens"] == int(mask.sum())
    assert 0 < r["mismatch"]["abs_diff_sum"] / r["mismatch"]["tokens"] < 0.05
    for other in results[1:]:
        assert other["metrics"]["actor/loss"] == pytest.approx(r["metrics"]["actor/loss"], rel=1e-6)
