"""Decisions on the running training time agree on every rank (a training-time budget, the
checkpoint grid): the step's time is the slowest rank's on every rank."""

from __future__ import annotations

import pytest
from launcher import run_distributed
from world_workers import budget_worker

pytestmark = pytest.mark.distributed


def test_ranks_whose_step_times_differ_spend_the_budget_at_the_same_step():
    """catches: ``world.max_over_ranks`` returning this rank's own value (rank 1 would stop after
    step 2 while rank 0 trains a third step: a hang in its next collective)."""
    times = [[1.0, 1.0, 1.0], [1.0, 1.2, 1.0]]  # rank 1's second step is slower; budget 2.1 s
    decisions = run_distributed(budget_worker, 2, times, 2.1)
    assert decisions[0] == decisions[1] == [False, True, True]
