"""Hand-made vectors of the peer selectors (issue 18): PODS max-variance, zero-advantage skip,
the importance weights of unbiased MDAP, and GRESO-style prompt skipping."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fastrl.algorithms import PromptSkipper, max_variance_subset, pods_select, random_select, zero_advantage_select
from fastrl.algorithms.prune_weights import inverse_keep_weights


def _brute_force_best_variance(values, m):
    return max(float(np.var([values[i] for i in c])) for c in itertools.combinations(range(len(values)), m))


@pytest.mark.parametrize(
    "values, m, expected",
    [
        ([0, 0, 0, 1, 1, 1], 2, [0, 5]),          # one low + one high: var 0.25 (k=1)
        ([0, 0, 0, 1, 1, 1], 4, [0, 1, 4, 5]),    # two of each
        ([0, 0, 0, 0, 0, 1], 2, [0, 5]),          # the single right answer kept
        ([1, 1, 1, 1], 2, [0, 1]),                # all equal: k=0 (smallest k), the first two rows
        ([0.0, 10.0, 4.0, 5.0, 9.0], 3, [0, 1, 4]),  # {0, 9, 10} (k=2) beats {0, 4, 10} (k=1)
        ([0.0, 10.0, 4.0, 5.0, 6.0], 3, [0, 1, 2]),  # {0, 4, 10} ties {0, 6, 10}: the smaller k wins
        ([3.0, -1.0, 2.0], 1, [1]),               # m=1: variance 0 everywhere, k=0 -> the lowest
    ],
)
def test_max_variance_subset_vectors(values, m, expected):
    got = max_variance_subset(values, m).tolist()
    assert got == expected
    assert float(np.var([values[i] for i in got])) == pytest.approx(_brute_force_best_variance(values, m))


def test_max_variance_subset_matches_brute_force_on_random_vectors():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 9))
        values = rng.integers(0, 4, n).astype(float).tolist()
        m = int(rng.integers(1, n + 1))
        pick = max_variance_subset(values, m)
        assert len(pick) == m
        assert float(np.var([values[i] for i in pick])) == pytest.approx(_brute_force_best_variance(values, m), abs=1e-12)


def test_max_variance_subset_rejects_bad_m():
    with pytest.raises(ValueError):
        max_variance_subset([1.0, 2.0], 3)


def test_pods_select_per_group():
    adv = torch.tensor([-1.0, -1.0, 1.0, 1.0, 0.5, 0.5, 0.5, -1.5])
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    r = pods_select(adv, gid, keep_ratio=0.5)
    assert r.keep.tolist() == [True, False, False, True, True, False, False, True]
    assert r.kept_per_group == {0: 2, 1: 2} and r.num_refilled == 0


def test_pods_select_refills_to_multiple():
    adv = torch.tensor([-1.0, -1.0, 1.0, 1.0, 0.5, 0.5, 0.5, -1.5])
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    r = pods_select(adv, gid, keep_ratio=0.5, multiple=3)
    assert r.num_kept == 6 and r.num_refilled == 2


def test_zero_advantage_select_drops_exact_and_rounded_zeros():
    adv = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.7, -0.7, 0.00001, -0.3])
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    r = zero_advantage_select(adv, gid)
    assert r.keep.tolist() == [False, False, False, False, True, True, False, True]
    assert r.kept_per_group == {0: 0, 1: 3} and r.zero_advantage_kept == 0
    r = zero_advantage_select(adv, gid, multiple=4)  # refill: largest |a| first -> a zero row last
    assert r.num_kept == 4 and r.num_refilled == 1


def test_zero_advantage_select_all_zero_batch_keeps_each_groups_first():
    gid = torch.tensor([1, 0, 1, 0, 2])
    r = zero_advantage_select(torch.zeros(5), gid)
    assert r.keep.tolist() == [True, True, False, False, True]


def test_random_select_is_per_group_keep_ratio():
    """Paper Table 5's random-p: each group keeps max(1, int(n x p)) uniformly random rollouts."""
    gid = torch.arange(4).repeat_interleave(8)
    r = random_select(torch.randn(32), gid, generator=torch.Generator().manual_seed(0), keep_ratio=0.25)
    assert r.kept_per_group == {0: 2, 1: 2, 2: 2, 3: 2}


def test_inverse_keep_weights_hand_vector():
    # group 0: bucket A=+1 (3 members, 1 kept), bucket A=-1 (1 member, 1 kept); group 1: all kept
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, 0.5, -0.5])
    gid = torch.tensor([0, 0, 0, 0, 1, 1])
    keep = torch.tensor([True, False, False, True, True, True])
    w = inverse_keep_weights(adv, gid, keep)  # lengths 1: T_K = 4, T_hat = 3 + 1 + 1 + 1 = 6
    assert w.tolist() == pytest.approx([3 * 4 / 6, 0, 0, 1 * 4 / 6, 4 / 6, 4 / 6])
    lengths = torch.tensor([2, 9, 9, 4, 1, 1])  # T_K = 8, T_hat = 3*2 + 4 + 1 + 1 = 12
    w = inverse_keep_weights(adv, gid, keep, lengths=lengths)
    assert w.tolist() == pytest.approx([3 * 8 / 12, 0, 0, 8 / 12, 8 / 12, 8 / 12])
    # the weighted kept advantages of group 0 sum to the full group's (2) times the common factor
    assert float((w[:4] * adv[:4]).sum()) == pytest.approx(2 * 8 / 12, abs=1e-6)


def test_inverse_keep_weights_unbiased_in_expectation():
    """Uniform choice of k_b of m_b members per bucket: E[sum_kept w A] = sum_all A (lengths 1,
    no token renormalization, so w = m_b / k_b exactly when every bucket keeps one of its members)."""
    rng = np.random.default_rng(1)
    adv = torch.tensor([1.0, 1.0, 1.0, -3.0, 2.0, 2.0, -1.0, -1.0, -1.0, -1.0])
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    # keep one member of every bucket: T_K = buckets, T_hat = N, so undo the T_K / T_hat factor
    total = 0.0
    trials = 2000
    for _ in range(trials):
        keep = torch.zeros(10, dtype=torch.bool)
        for members in ([0, 1, 2], [3], [4, 5], [6, 7, 8, 9]):
            keep[int(rng.choice(members))] = True
        w = inverse_keep_weights(adv, gid, keep) * (10 / 4)
        total += float((w * adv).sum())
    assert total / trials == pytest.approx(float(adv.sum()), abs=1e-5)


def test_prompt_skipper_streaks_and_skips():
    s = PromptSkipper(explore_prob=0.5, max_skip_fraction=0.5)
    s.record([1, 2, 3], [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])
    s.record([1, 3], [[1, 1, 1, 1], [0, 1, 0, 0]])
    assert s.streak == {1: 2, 2: 0, 3: 0}
    # prompt 1 (streak 2) is generated with probability 0.25; never-seen and informative: always
    draws = [s.skip_mask([1, 2, 3, 4], torch.Generator().manual_seed(seed)) for seed in range(400)]
    assert all(not m[1] and not m[2] and not m[3] for m in draws)
    frac = sum(m[0] for m in draws) / len(draws)
    assert 0.68 < frac < 0.82  # 1 - 0.25
    # the cap: at most half of the batch
    s.record([2, 3, 4], [[0, 0], [1, 1], [1, 1]])
    for seed in range(50):
        assert sum(s.skip_mask([1, 2, 3, 4], torch.Generator().manual_seed(seed))) <= 2


def test_prompt_skipper_state_round_trip_and_determinism():
    s = PromptSkipper()
    s.record([5, 6], [[1, 1], [0, 1]])
    t = PromptSkipper()
    t.load_state_dict(s.state_dict())
    assert t.streak == s.streak
    a = s.skip_mask([5, 6, 7], torch.Generator().manual_seed(3))
    b = t.skip_mask([5, 6, 7], torch.Generator().manual_seed(3))
    assert a == b


def test_train_state_carries_the_prompt_skipper():
    from fastrl.algorithms import AdaptiveRolloutSampler
    from fastrl.checkpoint.train_state import TrainState
    from fastrl.data import ResumableSampler

    def state(skipper):
        return TrainState(sampler=ResumableSampler(4, seed=0), ars=AdaptiveRolloutSampler(8),
                          scheduler=PromptSkipper(), total_steps=3, prompt_skipper=skipper)

    skipper = PromptSkipper()
    skipper.record([1], [[0, 0]])
    saved = state(skipper).state_dict()
    assert saved["prompt_skipper"]["streak"] and "prompt_skipper" not in saved["ars"]
    restored = PromptSkipper()
    state(restored).load_state_dict(saved)
    assert restored.streak == {1: 1}
    # a checkpoint that kept the skipper inside the adaptive sampler's state
    older = {**saved, "ars": {**saved["ars"], "prompt_skipper": saved["prompt_skipper"]}}
    del older["prompt_skipper"]
    from_older = PromptSkipper()
    state(from_older).load_state_dict(older)
    assert from_older.streak == {1: 1}
