"""Validation is split over the DP ranks and every rank takes the same best-checkpoint decision
(issue 29, item 9)."""

from __future__ import annotations

import pytest
from launcher import run_distributed
from validation_workers import validation_worker

from fastrl.training.validation import share_bounds

pytestmark = pytest.mark.distributed


def test_share_bounds_cover_the_questions_once():
    for total in (0, 1, 5, 2000, 2001):
        for size in (1, 2, 3, 8):
            shares = [share_bounds(total, r, size) for r in range(size)]
            assert [i for lo, hi in shares for i in range(lo, hi)] == list(range(total))
            assert max(hi - lo for lo, hi in shares) - min(hi - lo for lo, hi in shares) <= 1
    with pytest.raises(ValueError, match="rank 2 of size 2"):
        share_bounds(10, 2, 2)


def test_each_dp_rank_decodes_its_share_and_all_agree_on_rank_0s_metrics():
    # 11 questions over 2 ranks (6 + 5), chunks of 4: rank 0 decodes 0-5, rank 1 6-10, and both make
    # 2 stop checks (the same number: the check is a collective). Rank 1's engine answers
    # differently from rank 0's; validate_policy must still give both ranks rank 0's accuracy.
    # Breakage caught: every rank decoding the whole set (2x the work), a rank that makes fewer stop
    # checks (a hang in the collective), and ranks that decide "new best" from different accuracies
    # before a collective save.
    r0, r1 = run_distributed(validation_worker, 2, 11, 4, 1)
    assert r0["decoded"] == list(range(6)) and r1["decoded"] == list(range(6, 11))
    assert r0["stop_checks"] == r1["stop_checks"] == 2
    assert r0["questions"] == r1["questions"] == 11.0
    # rank 0: 0 and 3 correct; skewed rank 1 inverts its answers: 7, 8 and 10 correct
    assert r0["accuracy"] == r1["accuracy"] == pytest.approx(5 / 11)  # the same gathered list on both ranks
    assert r0["policy_accuracy"] == r1["policy_accuracy"] == r0["accuracy"]


def test_tensor_parallel_peers_take_rank_0s_metrics():
    # TP=2: both ranks are one DP rank; only the first rank of the model-parallel group holds an
    # engine (docs/engine.md): it decodes and grades every question and broadcasts the graded
    # results, so the peer decodes nothing and summarizes rank 0's results (its own engine here is
    # skewed and never asked). Breakage caught: a peer decoding with an engine of its own (on a GPU
    # node it has none), or one taking another accuracy than rank 0 into the collective save.
    r0, r1 = run_distributed(validation_worker, 2, 11, 4, 1, 2)
    assert r0["decoded"] == list(range(11)) and r1["decoded"] == []
    assert r0["accuracy"] == r1["accuracy"] == pytest.approx(4 / 11)
    assert r0["policy_accuracy"] == r1["policy_accuracy"] == pytest.approx(4 / 11)
    assert r0["stop_checks"] == r1["stop_checks"]


def test_one_rank_is_the_unsplit_validation():
    # Breakage caught: a split that drops or repeats questions at DP=1.
    (r0,) = run_distributed(validation_worker, 1, 11, 4, None)
    assert r0["decoded"] == list(range(11)) and r0["stop_checks"] == 3
    assert r0["accuracy"] == pytest.approx(4 / 11)  # 0, 3, 6, 9
