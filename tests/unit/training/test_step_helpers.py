"""Step bookkeeping of DAPO's extra rounds: counts over every round, the sampler's wrap past
trainer.epochs (issue 19, item 7)."""

import logging

import pytest

from fastrl.data import ResumableSampler
from fastrl.training.step import _add_round_counts, _check_epochs


def test_epochs_drawn_counts_positions():
    s = ResumableSampler(10, seed=0)
    assert s.epochs_drawn == 0.0
    s.next_batch(4)
    assert s.epochs_drawn == 0.4
    s.next_batch(6)
    assert s.epochs_drawn == 1.0 and s.epoch == 1 and s.position == 0
    s.next_batch(15)
    assert s.epochs_drawn == 2.5


def test_wrap_past_configured_epochs_is_logged(caplog):
    s = ResumableSampler(10, seed=0)
    s.next_batch(10)
    assert _check_epochs(s, 0.0, 1, 5, 0, True) == {}  # exactly one epoch: not past it
    with caplog.at_level(logging.WARNING, logger="fastrl.trainer"):
        s.next_batch(3)
        assert _check_epochs(s, 1.0, 1, 6, 1, True) == {"data/epochs_drawn": 1.3}
        assert "step 6 (generation round 1): the prompt sampler wrapped past trainer.epochs=1 (1.300" in caplog.text
        caplog.clear()
        s.next_batch(3)  # still in the second epoch: the metric, no new warning
        assert _check_epochs(s, 1.3, 1, 7, 0, True) == {"data/epochs_drawn": 1.6}
        assert caplog.text == ""
        s.next_batch(5)  # enters a third epoch: warned again
        assert _check_epochs(s, 1.6, 1, 8, 0, True) == {"data/epochs_drawn": 2.1}
        assert "2.100 epochs of prompts drawn" in caplog.text
        caplog.clear()
        assert _check_epochs(s, 1.6, 1, 8, 0, False) == {"data/epochs_drawn": 2.1}  # other ranks: no log
        assert caplog.text == ""


def test_round_counts_add_up_over_rounds():
    m = {
        "reward/num_scored": 32.0, "reward/num_invalid": 1.0, "rollout/generated_tokens": 400.0,
        "rollout/time_s": 2.0, "rollout/tokens_per_s": 200.0, "reward/invalid_fraction": 1 / 32,
    }
    _add_round_counts(m, {
        "reward/num_scored": 32.0, "reward/num_invalid": 3.0, "rollout/generated_tokens": 200.0,
        "rollout/time_s": 2.0, "rollout/tokens_per_s": 100.0, "reward/invalid_fraction": 3 / 32,
    })
    assert m["reward/num_scored"] == 64.0 and m["reward/num_invalid"] == 4.0
    assert m["rollout/generated_tokens"] == 600.0 and m["rollout/time_s"] == 4.0
    assert m["rollout/tokens_per_s"] == pytest.approx(150.0)
    assert m["reward/invalid_fraction"] == 1 / 32  # not a count: the first round's value stays
