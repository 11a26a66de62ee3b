"""trainer.old_log_probs=auto: the step's first optimizer update takes the detached log-probs of
its own forward pass as the old ones (no old-policy pass over its rows). It is exact: the loss,
the gradient norm and the updated weights equal those of the old-policy pass on every row
(``recompute``), to float tolerance, on a step with non-zero advantages, KL loss and truncated
importance weights; with two updates and two PPO epochs the later updates still use log-probs of
the policy before the step."""

from __future__ import annotations

import math

import pytest
import torch
from launcher import run_distributed
from on_policy_workers import on_policy_worker

pytestmark = pytest.mark.distributed


def _assert_same_update(out: dict) -> None:
    a, b = out["recompute"], out["auto"]
    assert any(not torch.equal(a["before"][k], v) for k, v in a["after"].items()), "the update changed nothing"
    for key in ("actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "mismatch/abs_diff_mean"):
        assert b["metrics"][key] == pytest.approx(a["metrics"][key], rel=1e-4, abs=1e-6), key
    for name, w in a["after"].items():
        torch.testing.assert_close(b["after"][name], w, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


def test_one_on_policy_update_equals_the_old_policy_pass(qwen2_path):
    """One update per step (the SmolLM2 recipes' geometry): no old-policy pass at all.

    catches: the on-policy update reading the batch's placeholder old log-probs instead of its own
    (``old = mb.old_log_probs`` in ``Actor.micro_batch_loss``: NaN loss); the guard skipped on the
    on-policy path (``guard_saw`` empty)."""
    out = run_distributed(on_policy_worker, 1, qwen2_path, (6,), 1)[0]
    assert torch.isnan(out["auto"]["old_before_update"]).all()  # no old-policy pass ran over these rows
    _assert_same_update(out)
    assert len(out["auto"]["guard_saw"]) == 1 and out["recompute"]["guard_saw"] == []
    assert out["auto"]["guard_saw"][0]["mismatch/abs_diff_mean"] == pytest.approx(
        out["recompute"]["metrics"]["mismatch/abs_diff_mean"], rel=1e-4
    )
    assert out["guard_raised"] and out["guarded_unchanged"]  # a guard that raises stops before any weight changes


def test_later_off_policy_updates_keep_the_old_policy_log_probs(qwen2_path):
    """Two updates per pass, two PPO epochs: only the first update of the first pass is on-policy;
    the second update's rows get the old-policy pass, and the second epoch reuses the first
    update's captured log-probs.

    catches: the shortcut applied to every update (``if epoch == 0 and start == 0 and
    on_policy_rows`` as ``if on_policy_rows``: the second update's ratio becomes 1 instead of
    pi_new / pi_old, and loss and weights differ), or to the second epoch's first update."""
    out = run_distributed(on_policy_worker, 1, qwen2_path, (4, 2), 2)[0]
    old = out["auto"]["old_before_update"]
    assert torch.isnan(old[:4]).all() and not torch.isnan(old[4:]).any()
    assert out["recompute"]["metrics"]["actor/updates"] == out["auto"]["metrics"]["actor/updates"] == 4
    assert math.isfinite(out["auto"]["metrics"]["actor/loss"])
    _assert_same_update(out)
