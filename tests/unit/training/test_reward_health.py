"""Invalid rewards: counted every step, each kind of error logged once, the run stopped when grading
keeps failing (fastrl/training/reward_health.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from fastrl.config import RewardConfig
from fastrl.rewards import RewardResult
from fastrl.training.reward_health import RewardHealth, RewardHealthError

OK = RewardResult(overall=1.0, format=0.5, accuracy=1.0)
BOOM = RewardResult.invalid("ValueError: boom\n  on two lines")
TIMEOUT = RewardResult.invalid("timeout after 10s", timed_out=True)
CRASH = RewardResult.invalid("grading worker process exited (exit code -9)")


def _health(**reward) -> RewardHealth:
    return RewardHealth(RewardConfig(name="my_reward.py:grade", **reward), reduce=lambda t: t.clone())


def test_error_kinds():
    assert [r.error_kind for r in (OK, BOOM, TIMEOUT, CRASH)] == [
        None, "ValueError", "timeout", "grading worker process exited",
    ]


def test_invalid_fraction_every_step_dapo_rounds_included():
    health = _health()
    health.observe([OK, OK, BOOM, TIMEOUT])
    health.observe([OK, BOOM, RewardResult.invalid("ValueError: another text")])  # a DAPO round
    assert health.end_step(1) == {"reward/invalid_fraction": pytest.approx(4 / 7)}
    health.observe([BOOM, CRASH, OK, OK])
    assert health.end_step(2) == {"reward/invalid_fraction": 0.5}
    health.observe([OK])
    assert health.end_step(3) == {"reward/invalid_fraction": 0.0}
    assert health.first_errors == {
        "ValueError": "ValueError: boom on two lines", "timeout": "timeout after 10s",
        "grading worker process exited": "grading worker process exited (exit code -9)",
    }


def test_the_scorer_logs_the_first_error_of_each_kind_once(tmp_path, caplog):
    from fastrl.rewards import RewardScorer

    path = tmp_path / "flaky.py"
    path.write_text("def grade(response, truth):\n    if response == 'ok':\n        return 1.0\n"
                    "    raise (ValueError if response == 'v' else KeyError)(f'bad {response}')\n")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="fastrl.rewards"):
        with RewardScorer(f"{path}:grade", num_workers=1, backend="thread") as scorer:
            scorer.score(["ok", "v", "v", "k"], ["1"] * 4)
            scorer.score(["v", "k", "ok"], ["1"] * 3)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "invalid result (ValueError): ValueError: bad v" in messages[0] and f"{path}:grade" in messages[0]
    assert "invalid result (KeyError): KeyError: 'bad k'" in messages[1]


def test_run_stops_after_consecutive_bad_steps_naming_reward_and_first_error():
    health = _health(max_invalid_fraction=0.5, max_invalid_steps=3)
    for step in (1, 2):
        health.observe([BOOM, BOOM, OK])
        health.end_step(step)
    health.observe([OK, OK, BOOM])  # 1/3 <= 0.5: the count starts again
    health.end_step(3)
    for step in (4, 5):
        health.observe([BOOM, TIMEOUT, BOOM, BOOM])
        health.end_step(step)
    health.observe([BOOM, BOOM])
    with pytest.raises(RewardHealthError) as err:
        health.end_step(6)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("reward 'my_reward.py:grade': 3 consecutive steps had more than reward.max_invalid_fraction=0.5")
    assert "step 6: 2 of 2 rewards invalid" in message
    assert "first error: ValueError: boom on two lines (other kinds: timeout)" in message


def test_a_run_that_learned_from_nothing_fails_at_its_last_step():
    health = _health(max_invalid_steps=3)
    health.observe([BOOM, BOOM])
    health.end_step(1)
    health.observe([BOOM, BOOM])
    with pytest.raises(RewardHealthError, match="the run ends having learned from almost nothing: all 4 rewards"):
        health.end_step(2, final=True)


def test_whole_run_check_needs_every_step_and_is_not_fooled_by_a_resume():
    health = _health(max_invalid_steps=3)
    health.observe([BOOM, OK])  # 0.5 is not more than 0.5
    health.end_step(1)
    health.observe([BOOM, BOOM])
    assert health.end_step(2, final=True) == {"reward/invalid_fraction": 1.0}
    resumed = _health(max_invalid_steps=3)
    resumed.observe([BOOM, BOOM])
    assert resumed.end_step(7, final=True) == {"reward/invalid_fraction": 1.0}  # steps 1-6 ran elsewhere


def test_fraction_one_never_stops_on_the_fraction_but_all_invalid_still_fails():
    health = _health(max_invalid_fraction=1.0, max_invalid_steps=1)
    health.observe([BOOM, OK])
    health.end_step(1)
    health.observe([BOOM, BOOM])
    health.end_step(2)
    assert health.consecutive_bad_steps == 0
    all_invalid = _health(max_invalid_fraction=1.0, max_invalid_steps=1)
    all_invalid.observe([TIMEOUT])
    with pytest.raises(RewardHealthError, match="all 1 rewards of its 1 step"):
        all_invalid.end_step(1, final=True)


def test_counts_are_dp_global():
    other_rank = torch.tensor([10.0, 10.0], dtype=torch.float64)  # another DP rank: 10 of 10 invalid
    health = RewardHealth(RewardConfig(max_invalid_steps=1), reduce=lambda t: t + other_rank)
    health.observe([OK, OK])
    with pytest.raises(RewardHealthError, match="step 1: 10 of 12 rewards invalid.*none seen on this rank"):
        health.end_step(1)


def test_counts_survive_a_checkpoint_so_a_resumed_stage_continues_them():
    health = _health(max_invalid_fraction=0.5, max_invalid_steps=3)
    for step in (1, 2):
        health.observe([BOOM, BOOM, OK])
        health.end_step(step)
    saved = health.state_dict()
    assert saved == {"consecutive_bad_steps": 2, "first_step": 1, "steps": 2, "bad_steps": 2,
                     "run_scored": 6, "run_invalid": 4}
    resumed = _health(max_invalid_fraction=0.5, max_invalid_steps=3)
    resumed.load_state_dict(saved)
    resumed.observe([BOOM, BOOM])
    with pytest.raises(RewardHealthError, match="3 consecutive steps"):  # not 1: the count went on
        resumed.end_step(3)
    whole = _health(max_invalid_steps=5)
    whole.observe([BOOM])
    whole.end_step(1)
    again = _health(max_invalid_steps=5)
    again.load_state_dict(whole.state_dict())
    again.observe([BOOM])
    with pytest.raises(RewardHealthError, match="all 2 rewards of its 2 step"):  # whole-run check across the resume
        again.end_step(2, final=True)
    with pytest.raises(KeyError, match="lacks run_invalid"):
        again.load_state_dict({k: v for k, v in saved.items() if k != "run_invalid"})


def test_train_state_saves_the_counts_and_loads_checkpoints_without_them():
    from fastrl.checkpoint.train_state import TrainState

    class Plain:
        def __init__(self):
            self.value = 0

        def state_dict(self):
            return {"value": self.value}

        def load_state_dict(self, state):
            self.value = state["value"]

    health = _health(max_invalid_steps=9)
    health.observe([BOOM, OK, OK])
    health.end_step(1)
    state = TrainState(sampler=Plain(), ars=Plain(), scheduler=Plain(), total_steps=10, step=1, reward_health=health)
    saved = state.state_dict()
    assert saved["reward_health"]["run_invalid"] == 1
    fresh = _health(max_invalid_steps=9)
    TrainState(sampler=Plain(), ars=Plain(), scheduler=Plain(), total_steps=10, reward_health=fresh).load_state_dict(saved)
    assert fresh.state_dict() == health.state_dict()
    old = {k: v for k, v in saved.items() if k != "reward_health"}  # written before the counts were saved
    untouched = _health(max_invalid_steps=9)
    TrainState(sampler=Plain(), ars=Plain(), scheduler=Plain(), total_steps=10, reward_health=untouched).load_state_dict(old)
    assert untouched.state_dict()["steps"] == 0
