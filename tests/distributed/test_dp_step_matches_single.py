"""A step's data path on two data-parallel ranks decides and trains exactly as on one process:
the same keep decisions, ``prune/f1`` and loss on a batch that MDAP really prunes
(``pruning.similarity_threshold=0.0``: one rollout per advantage bucket; rewards vary per prompt)."""

from __future__ import annotations

import pytest
from launcher import run_distributed
from step_workers import PROMPTS, N, dp_step_worker

pytestmark = pytest.mark.distributed


def test_two_dp_ranks_prune_and_train_like_one():
    """catches: per-rank local group ids under DP=2 (``fastrl/training/prompting.py``; issue 46,
    break 6): groups of different prompts merge in DP-global pruning, ``prune/f1`` doubles and the
    keep decisions and the loss change. Also any other rank-local quantity in the path (advantages,
    bucket weights, the loss denominator)."""
    single = dp_step_worker(False)
    ranks = run_distributed(dp_step_worker, 2, True)
    m1 = single["metrics"]
    assert 0 < m1["prune/num_kept"] < PROMPTS * N  # the batch really is pruned
    assert m1["prune/num_kept"] == len(single["kept"])
    kept = sorted(k for r in ranks for k in r["kept"])
    assert kept == single["kept"]
    for r in ranks:
        m2 = r["metrics"]
        for key in ("prune/num_kept", "prune/num_buckets", "prune/f1", "prune/f2", "reward/mean", "advantage/abs_mean"):
            assert m2[key] == pytest.approx(m1[key]), key
        assert r["loss"] == pytest.approx(single["loss"], rel=1e-6, abs=1e-9)
        for name, a in r["advantages"].items():
            assert a == pytest.approx(single["advantages"][name], abs=1e-6)
    assert sorted(t for r in ranks for t in r["trained"]) == single["trained"]
    assert abs(single["loss"]) > 1e-4  # a loss that can differ
