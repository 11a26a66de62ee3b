"""Groups with a single validly graded rollout are counted and warned about, not zeroed silently
(issue 33, item 5)."""

from __future__ import annotations

import logging

import torch

from fastrl.config import AlgorithmConfig
from fastrl.training.rollout_batch import ScoredRollouts
from fastrl.training.scoring import compute_advantages
from tests.unit.training.test_fp8_shapes import scored_rollouts


def _scored(group_ids: list[int], rewards: list[float], valid: list[bool]):
    base = scored_rollouts([3] * len(group_ids), [[2]] * len(group_ids))
    return ScoredRollouts(
        base.rollouts, group_ids=torch.tensor(group_ids), rewards=torch.tensor(rewards), accuracy=base.accuracy,
        valid=torch.tensor(valid), formatted=base.formatted,
    )


def test_every_rollout_in_its_own_group_is_counted_and_warned(caplog):
    # Breakage caught: on a build that does not count single-member groups, every advantage is 0,
    # the metric is missing and nothing is logged (the silent case of the issue).
    scored = _scored([0, 1, 2, 3], [1.0, 0.0, 1.0, 0.0], [True] * 4)
    with caplog.at_level(logging.WARNING, logger="fastrl.trainer"):
        out, m = compute_advantages(scored, AlgorithmConfig(), step=7)
    assert out.advantages.tolist() == [0.0] * 4
    assert m["advantage/single_member_groups"] == 4.0
    assert "step 7: 4 group(s) have a single validly graded rollout" in caplog.text


def test_group_reduced_to_one_valid_member_by_failed_grading_is_counted(caplog):
    # Group 0 has two valid rollouts with different rewards (it learns); group 1 has one valid
    # member left after two grading failures. Breakage caught: counting groups by size instead of
    # by valid members (group 1 has three rows) reports 0.
    scored = _scored([0, 0, 1, 1, 1], [1.0, 0.0, 1.0, 0.0, 0.0], [True, True, True, False, False])
    with caplog.at_level(logging.WARNING, logger="fastrl.trainer"):
        out, m = compute_advantages(scored, AlgorithmConfig(), step=3)
    assert m["advantage/single_member_groups"] == 1.0
    assert out.advantages[:2].abs().min() > 0.5 and out.advantages[2:].tolist() == [0.0] * 3
    assert "step 3: 1 group(s)" in caplog.text


def test_ordinary_groups_give_zero_and_no_warning(caplog):
    # Breakage caught: counting every group (or constant groups) as a single-member group.
    scored = _scored([0, 0, 1, 1], [1.0, 0.0, 1.0, 1.0], [True] * 4)
    with caplog.at_level(logging.WARNING, logger="fastrl.trainer"):
        _, m = compute_advantages(scored, AlgorithmConfig(), step=1)
    assert m["advantage/single_member_groups"] == 0.0
    assert caplog.text == ""
