"""DAPO filters (dynamic sampling, overlong shaping) and adaptive rollout sampling (spec section 3)."""

import json
import logging

import pytest
import torch
from _algo_settings import PROPERTY
from hypothesis import given
from hypothesis import strategies as st

from fastrl.algorithms.adaptive_sampling import AdaptiveRolloutSampler
from fastrl.algorithms.filters import dynamic_sampling_keep, overlong_penalty

# ---------------------------------------------------------------------------------------------
# dynamic sampling
# ---------------------------------------------------------------------------------------------


def test_dynamic_sampling_keeps_mixed_groups_only():
    acc = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0])
    gid = torch.tensor([7, 7, 3, 3, 5, 5, 9, 9])
    assert dynamic_sampling_keep(acc, gid).tolist() == [True, True, False, False, False, False, True, True]


def test_dynamic_sampling_filters_on_accuracy_not_score():
    # formatted-but-wrong: the score would be 0.5 everywhere; on accuracy the group is all 0 and is dropped
    assert dynamic_sampling_keep(torch.zeros(4), torch.zeros(4, dtype=torch.int64)).tolist() == [False] * 4
    with pytest.raises(ValueError, match=r"accuracy\[1\]` is 0.5.*format-inclusive"):
        dynamic_sampling_keep(torch.tensor([1.0, 0.5]), torch.tensor([0, 0]))


def test_dynamic_sampling_valid_mask():
    acc = torch.tensor([1.0, float("nan"), 1.0, 0.0])
    gid = torch.tensor([0, 0, 1, 1])
    keep = dynamic_sampling_keep(acc, gid, valid=torch.tensor([True, False, True, True]))
    assert keep.tolist() == [False, False, True, True]  # group 0 has only a valid 1 left
    with pytest.raises(ValueError, match="rows but the batch has"):
        dynamic_sampling_keep(torch.tensor([1, 0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="empty"):
        dynamic_sampling_keep(torch.tensor([]), torch.tensor([], dtype=torch.int64))


# ---------------------------------------------------------------------------------------------
# overlong shaping
# ---------------------------------------------------------------------------------------------


def test_overlong_penalty_spec_vectors():
    out = overlong_penalty(torch.tensor([16000, 18000, 20481, 16384, 20480, 0]), 20480, 4096)
    assert out.tolist() == [0.0, -0.39453125, -1.0, 0.0, -1.0, 0.0]


def test_overlong_penalty_bad_input():
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(torch.tensor([1]), 100, 0)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(torch.tensor([1]), 100, 101)
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        overlong_penalty(torch.tensor([1, -1]), 100, 10)
    with pytest.raises(TypeError, match="integers"):
        overlong_penalty(torch.tensor([1.5]), 100, 10)


# ---------------------------------------------------------------------------------------------
# adaptive rollout sampling
# ---------------------------------------------------------------------------------------------


def test_ars_hand_computed_periods(caplog):
    s = AdaptiveRolloutSampler(8)
    assert s.n == 8
    assert s.record([4, 4, 4, 4]) == (4.0, 4.0)
    assert s.record({10: 2, 11: 6, 12: 4, 13: 4}) == (4.0, 6.0)  # a PruneResult.kept_per_group works too
    with caplog.at_level(logging.INFO, logger="fastrl.algorithms.adaptive_sampling"):
        # f1_mean 4, f2_mean 5, alpha 0.5 -> f3 = 4.5; g1 = 4.5; f3 < g1 is false -> n_max
        assert s.end_period(0.5) == 8
    assert s.g1 == 4.5 and s.f3 == 4.5
    assert "n 8 -> 8" in caplog.text and "g1=4.5000" in caplog.text
    s.record([3, 3, 3, 3])
    # f3 = 3 -> n = round(8 - 1.5) = round(6.5) = 6 (half to even)
    assert s.end_period(1.0) == 6
    assert s.last_decision["f3"] == 3.0 and s.last_decision["n_before"] == 8.0
    s.record([2, 2])
    s.record([3, 3])
    # f3 = 0.25 * 2.5 + 0.75 * 2.5 = 2.5 -> round(8 - 2) = 6
    assert s.end_period(0.25) == 6
    s.record([9, 9])
    assert s.end_period(0.9) == 8  # f3 above g1 -> back to n_max


def test_ars_clamps_to_n_min_and_rounds_half_even():
    s = AdaptiveRolloutSampler(4)
    s.record([4, 4])
    assert s.end_period(0.0) == 4  # g1 = 4
    s.record([0, 1])  # f1 0.5, f2 1 -> alpha 1: f3 = 0.5 -> 4 - 3.5 = 0.5 -> round 0 -> clamp 2
    assert s.end_period(1.0) == 2
    s.record([3, 3])  # f3 = 3 -> 4 - 1 = 3
    assert s.end_period(1.0) == 3
    s2 = AdaptiveRolloutSampler(8, n_min=3)
    s2.record([8])
    s2.end_period(0.0)
    s2.record([5])  # 8 - 3 = 5
    assert s2.end_period(0.5) == 5
    s2.record([4, 5])  # alpha 1: f3 = f1 = 4.5 -> 8 - 3.5 = 4.5 -> 4 (half to even), above n_min
    assert s2.end_period(1.0) == 4
    s2.record([3.0])  # 8 - 5 = 3 = n_min (integral floats are accepted)
    assert s2.end_period(1.0) == 3


def test_ars_state_is_json_and_constant_budget():
    s = AdaptiveRolloutSampler(8)
    s.record([1, 2, 3])
    state = json.loads(json.dumps(s.state_dict()))
    t = AdaptiveRolloutSampler(8)
    t.load_state_dict(state)
    assert t.state_dict() == s.state_dict()
    assert AdaptiveRolloutSampler.prompts_for_constant_budget(256, 8, 6) == 342  # ceil(2048 / 6)
    assert AdaptiveRolloutSampler.prompts_for_constant_budget(256, 8, 8) == 256


def test_ars_bad_input():
    with pytest.raises(ValueError, match="n_min"):
        AdaptiveRolloutSampler(8, n_min=1)
    with pytest.raises(ValueError, match="n_max"):
        AdaptiveRolloutSampler(2, n_min=3)
    s = AdaptiveRolloutSampler(8)
    with pytest.raises(ValueError, match="no step recorded"):
        s.end_period(0.5)
    with pytest.raises(ValueError, match="empty"):
        s.record([])
    with pytest.raises(ValueError, match=r"kept_per_group\[1\]"):
        s.record([1, 2.5])
    s.record([1])
    with pytest.raises(ValueError, match="progress"):
        s.end_period(1.5)
    with pytest.raises(ValueError, match="n_max=16"):
        AdaptiveRolloutSampler(16).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="missing keys"):
        s.load_state_dict({"n": 3})


periods = st.lists(  # periods of steps of kept counts per group
    st.lists(st.lists(st.integers(0, 8), min_size=1, max_size=6), min_size=1, max_size=5), min_size=1, max_size=6
)


@PROPERTY
@given(periods, st.data())
def test_property_restore_mid_period_gives_identical_decisions(periods, data):
    """Invariant: saving the state at any step (also mid-period), building a fresh sampler and
    loading it gives exactly the decisions and final state of an uninterrupted run; and n always
    stays in [n_min, n_max]."""
    total = sum(len(p) for p in periods)
    cut = data.draw(st.integers(0, total))

    def run(cut_at):
        s = AdaptiveRolloutSampler(8)
        decisions, step = [], 0
        for p_i, period in enumerate(periods):
            for counts in period:
                if step == cut_at:
                    fresh = AdaptiveRolloutSampler(8)
                    fresh.load_state_dict(json.loads(json.dumps(s.state_dict())))
                    s = fresh
                s.record(counts)
                step += 1
            decisions.append(s.end_period((p_i + 1) / len(periods)))
            assert 2 <= s.n <= 8
        return decisions, s.state_dict()

    assert run(cut) == run(-1)
