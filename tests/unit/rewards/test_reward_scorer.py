"""RewardScorer: batch grading in worker processes / threads, timeouts, crashes, counts."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time

import pytest

from fastrl.rewards import RewardScorer, RewardSpecError, get_reward

SLOW_REWARD = """
import os, time

def grade(response, ground_truth):
    if response == "sleep":
        time.sleep(60)
    if response == "spin":
        while True:
            pass
    if response == "die":
        os._exit(3)
    if response == "raise":
        raise ZeroDivisionError("boom")
    return 1.0 if response == ground_truth else 0.0
"""

CHILD_ONLY_FAILURE = """
import sys
if getattr(sys.modules["__main__"].__spec__, "name", None) == "fastrl.rewards.worker":
    raise ImportError("only in the worker")

def grade(response, ground_truth):
    return 0.0
"""


@pytest.fixture
def slow_reward(tmp_path):
    path = tmp_path / "slow_reward.py"
    path.write_text(SLOW_REWARD)
    return f"{path}:grade"


def _batch(n):
    responses = [f"<thinking>t</thinking> \\boxed{{{i % 5}}}" if i % 3 else f"answer {i}" for i in range(n)]
    truths = [str(i % 4) for i in range(n)]
    return responses, truths


def test_process_scorer_matches_inline_grading_from_a_worker_thread():
    responses, truths = _batch(60)
    expected = [get_reward("geo3k")(r, t) for r, t in zip(responses, truths)]
    out = {}
    with RewardScorer("geo3k", num_workers=2, timeout_s=30.0) as scorer:
        # The trainer calls the scorer from a non-main thread.
        thread = threading.Thread(target=lambda: out.setdefault("results", scorer.score(responses, truths)))
        thread.start()
        thread.join(timeout=120)
        assert out["results"] == expected
        assert scorer.last_stats.num_scored == 60 and scorer.last_stats.num_invalid == 0
        assert sum(r.accuracy for r in expected) == 8.0  # i % 3 != 0 and i % 20 < 4: 1,2,20,22,23,40,41,43
        # A second call reuses the warm workers.
        assert scorer.score(responses[:7], truths[:7]) == expected[:7]
        assert scorer.total_stats.num_scored == 67
        assert scorer.score([], []) == []


def test_process_scorer_timeouts_crashes_and_errors(slow_reward):
    responses = ["a", "spin", "b", "die", "raise", "a", "sleep", "a"]
    with RewardScorer(slow_reward, num_workers=2, timeout_s=2.0, chunk_size=3) as scorer:
        results = scorer.score(responses, ["a"] * len(responses))
        by_response = dict(zip(responses, results))
        assert [r.accuracy for r in results if r.valid] == [1.0, 0.0, 1.0, 1.0]
        assert by_response["spin"].timed_out and by_response["sleep"].timed_out
        assert by_response["spin"].error == "timeout after 2s"
        assert not by_response["die"].valid and "exit code 3" in by_response["die"].error
        assert by_response["raise"].error == "ZeroDivisionError: boom"
        assert all(math.isnan(by_response[k].overall) for k in ("spin", "sleep", "die", "raise"))
        stats = scorer.last_stats
        assert (stats.num_scored, stats.num_invalid, stats.num_timeouts, stats.num_errors) == (8, 4, 2, 2)
        assert stats.num_worker_restarts == 3
        assert stats.as_metrics()["reward/num_timeouts"] == 2.0
        # Workers were replaced: the next batch grades normally.
        assert [r.accuracy for r in scorer.score(["a", "b"], ["a", "a"])] == [1.0, 0.0]


def test_thread_scorer_abandons_a_stuck_grader(slow_reward):
    with RewardScorer(slow_reward, num_workers=2, timeout_s=1.0, backend="thread") as scorer:
        start = time.monotonic()
        results = scorer.score(["a", "sleep", "raise", "b"], ["a"] * 4)
        assert time.monotonic() - start < 20
        assert [(r.valid, r.timed_out) for r in results] == [(True, False), (False, True), (False, False), (True, False)]
        assert [results[0].accuracy, results[3].accuracy] == [1.0, 0.0]
        assert scorer.last_stats.num_timeouts == 1 and scorer.last_stats.num_errors == 1


def test_scorer_rejects_bad_arguments(tmp_path):
    with pytest.raises(RewardSpecError):
        RewardScorer("no_such_reward")
    with pytest.raises(ValueError, match="num_workers"):
        RewardScorer("geo3k", num_workers=0)
    with pytest.raises(ValueError, match="backend"):
        RewardScorer("geo3k", backend="gpu")
    scorer = RewardScorer("easy_vqa", backend="thread")
    with pytest.raises(ValueError, match="2 responses but 1 ground truths"):
        scorer.score(["a", "b"], ["a"])
    with pytest.raises(TypeError, match="ground truth 1 is a int"):
        scorer.score(["a", "b"], ["a", 3])
    scorer.close()


def test_worker_start_failure_is_an_error(tmp_path):
    path = tmp_path / "child_only.py"
    path.write_text(CHILD_ONLY_FAILURE)
    with RewardScorer(f"{path}:grade", num_workers=1, timeout_s=5.0) as scorer:
        with pytest.raises(RuntimeError, match="failed to load in a grading worker: RewardSpecError.*only in the worker"):
            scorer.score(["a"], ["a"])


def test_workers_do_not_reimport_the_main_module(tmp_path):
    # multiprocessing's spawn would import the trainer's main module (torch, megatron) in every
    # grading worker; the workers are plain interpreters running fastrl.rewards.worker instead.
    marker = tmp_path / "imports.txt"
    script = tmp_path / "trainer_like.py"
    script.write_text(
        "import sys\n"
        "with open(sys.argv[1], 'a') as f:\n    f.write('imported\\n')\n"
        "from fastrl.rewards import RewardScorer\n"
        "if __name__ == '__main__':\n"
        "    with RewardScorer('easy_vqa', num_workers=2) as scorer:\n"
        "        print(scorer.score(['<thinking>x</thinking> \\\\boxed{red}'], ['red'])[0].overall)\n"
    )
    out = subprocess.run([sys.executable, str(script), str(marker)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1.5"
    assert marker.read_text() == "imported\n"
    # The workers share this stderr: `python -m fastrl.rewards.worker` must start without runpy's
    # "found in sys.modules after import of package" warning.
    assert "RuntimeWarning" not in out.stderr, out.stderr
