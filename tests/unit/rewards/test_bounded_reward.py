"""``get_reward(name, timeout_s=...)``: the grading API with a time limit (the bare function has none)."""

from __future__ import annotations

import time

import pytest

from fastrl.rewards import get_reward

HANGING_REWARD = """
import time

def grade(response, ground_truth):
    if response == "hang":
        while True:          # an adversarial answer that keeps the grader busy forever
            time.sleep(0.05)
    if response == "raise":
        raise ValueError("cannot parse")
    return 1.0 if response == ground_truth else 0.0
"""


def test_an_answer_that_would_hang_returns_invalid_within_the_bound(tmp_path):
    path = tmp_path / "hanging_reward.py"
    path.write_text(HANGING_REWARD)
    reward = get_reward(f"{path}:grade", timeout_s=1.0)
    try:
        assert reward("4", "4").accuracy == 1.0  # starts the worker
        start = time.monotonic()
        result = reward("hang", "4")
        elapsed = time.monotonic() - start
        assert not result.valid and result.timed_out and result.error == "timeout after 1s"
        assert elapsed < 10.0, elapsed  # 1 s plus killing the worker
        assert reward("raise", "4").error == "ValueError: cannot parse"  # an exception: invalid, not raised
        assert reward("3", "4").accuracy == 0.0  # the replaced worker grades again
    finally:
        reward.close()


def test_bounded_builtin_matches_the_bare_function():
    response = "<thinking>a red circle</thinking> \\boxed{red}"
    bounded = get_reward("easy_vqa", timeout_s=30.0)
    try:
        assert bounded(response, "red") == get_reward("easy_vqa")(response, "red")
    finally:
        bounded.close()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "5"])
def test_timeout_must_be_a_finite_positive_number(bad):
    with pytest.raises(ValueError, match="timeout_s must be a finite number > 0"):
        get_reward("easy_vqa", timeout_s=bad)


SLOW_REWARD = """
import os, threading, time

def grade(response, ground_truth):
    if response == "raise":
        raise ValueError("cannot parse")
    time.sleep(float(response))
    # accuracy 1 only when graded by the test's own process, in its main thread
    here = os.getpid() == {pid} and threading.current_thread() is threading.main_thread()
    return 1.0 if here else 0.0
"""


def test_the_bare_function_grades_in_the_calling_thread_without_a_limit(tmp_path):
    # What get_reward's docstring promises without timeout_s. Breakages caught: a default time limit
    # (the 1.5 s answer would come back invalid), grading in a worker process or thread (accuracy 0),
    # a swallowed grader exception (an invalid result instead of the ValueError).
    import os

    path = tmp_path / "slow_reward.py"
    path.write_text(SLOW_REWARD.format(pid=os.getpid()))
    bare = get_reward(f"{path}:grade")
    start = time.monotonic()
    result = bare("1.5", "x")
    assert time.monotonic() - start >= 1.5
    assert result.valid and result.accuracy == 1.0
    with pytest.raises(ValueError, match="cannot parse"):
        bare("raise", "x")
