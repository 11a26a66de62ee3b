"""The LR schedule reaches its horizon (the configured minimum of a cosine decay) in layouts
whose steps make fewer optimizer updates than an unpruned step: the schedule is set on the RL
step (fastrl.training.geometry.lr_positions), not advanced one unit per update."""

from __future__ import annotations

import pytest
from launcher import run_distributed
from lr_workers import lr_horizon_worker

pytestmark = pytest.mark.distributed

MIN_LR = 1e-5


def test_mini_batch_geometry_pruned_steps_complete_the_cosine_decay(qwen2_path):
    # Catches the build that advances the schedule one unit per optimizer update with
    # pruning.refill_to=mini_batch: pruned steps make fewer mini-batch updates than the
    # U = prompts_per_step / mini_batch_prompts = 4 units per step that size the horizon, so the
    # run stopped after 1 + 4 + 2 = 7 of 12 units with the LR still at ~4e-5 instead of min_lr.
    # Mini-batches of 1 prompt x n=2 = 2 rollouts: steps keeping 2, 8 and 4 rollouts make 1, 4, 2 updates.
    (r,) = run_distributed(
        lr_horizon_worker, 1, qwen2_path, refill_to="mini_batch", prompts_per_step=4, mini_batch_prompts=1, n=2,
        kept_per_step=[2, 8, 4], min_lr=MIN_LR,
    )
    assert r["updates"] == [1, 4, 2]  # the geometry really makes fewer updates on pruned steps
    assert r["per_step"] == 4 and r["horizon"] == 12
    assert r["positions"] == [4, 8, 12]  # every step ends at step x U: the scheduled 12 units, all taken
    assert r["final_position"] == r["horizon"]
    assert r["final_lr"] == MIN_LR


def test_free_geometry_two_ranks_short_of_rows_complete_the_cosine_decay(qwen2_path):
    # Catches the build that advances the schedule one unit per optimizer update in the free
    # geometry at DP=2: a step that keeps 14 rollouts (7 per rank) with U = 8 updates configured
    # makes min(8, 7) = 7, so the 3-step run ended at unit 23 of 24 with the LR above min_lr
    # (issue 33: 5.1e-7 instead of 0). Two gloo processes, one per DP rank.
    results = run_distributed(
        lr_horizon_worker, 2, qwen2_path, refill_to="free", prompts_per_step=8, mini_batch_prompts=1, n=2,
        kept_per_step=[16, 14, 16], min_lr=MIN_LR,
    )
    for r in results:  # both ranks make the same updates and set the same LR
        assert r["updates"] == [8, 7, 8]
        assert r["per_step"] == 8 and r["horizon"] == 24
        assert r["positions"] == [8, 16, 24]
        assert r["final_position"] == r["horizon"]
        assert r["final_lr"] == MIN_LR
