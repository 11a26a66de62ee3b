"""A step whose every group has equal rewards is counted and warned about (issue 45, item 8b)."""

from __future__ import annotations

import logging

import pytest

from fastrl.config import AlgorithmConfig
from fastrl.training.scoring import compute_advantages
from tests.unit.training.test_single_member_groups import _scored


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_every_advantage_zero_is_counted_and_warned(caplog, estimator):
    """catches: the silent step of the issue: an untrained policy that is never right (every reward 0)
    runs every pass of the update with no metric or line saying its policy gradient is 0."""
    scored = _scored([0, 0, 1, 1, 2, 2], [0.0, 0.0, 0.25, 0.25, 1.0, 1.0], [True] * 6)
    with caplog.at_level(logging.WARNING, logger="fastrl.trainer"):
        out, m = compute_advantages(scored, AlgorithmConfig(advantage_estimator=estimator), step=12)
    assert out.advantages.tolist() == [0.0] * 6
    assert m["advantage/zero_fraction"] == 1.0
    assert "step 12: every rollout's advantage is 0" in caplog.text and "advantage/zero_fraction = 1" in caplog.text


def test_partly_informative_step_counts_the_zero_share_without_a_warning(caplog):
    """catches: a fraction counted by groups instead of rollouts, or a warning that fires whenever
    some group is uninformative (every step of a real run has some)."""
    scored = _scored([0, 0, 1, 1], [1.0, 0.0, 1.0, 1.0], [True] * 4)
    with caplog.at_level(logging.WARNING, logger="fastrl.trainer"):
        _, m = compute_advantages(scored, AlgorithmConfig(), step=3)
    assert m["advantage/zero_fraction"] == 0.5
    assert caplog.text == ""
