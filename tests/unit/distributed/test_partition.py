"""Balanced re-partition of kept rollouts over DP ranks (pure)."""

from __future__ import annotations

import random

import pytest

from fastrl.distributed.partition import balanced_assignment


def _loads(lengths, targets, ranks):
    loads, counts = [0] * ranks, [0] * ranks
    for length, t in zip(lengths, targets):
        loads[t] += length
        counts[t] += 1
    return loads, counts


@pytest.mark.parametrize("seed", range(30))
def test_equal_counts_and_loads_within_one_sequence_of_balance(seed):
    rng = random.Random(seed)
    ranks = rng.choice([2, 3, 4, 8])
    n = ranks * rng.randint(1, 12)
    lengths = [rng.choice([rng.randint(1, 20), rng.randint(100, 400)]) for _ in range(n)]
    owners = [rng.randrange(ranks) for _ in range(n)]
    targets = balanced_assignment(lengths, owners, ranks)
    loads, counts = _loads(lengths, targets, ranks)
    assert counts == [n // ranks] * ranks
    mean = sum(lengths) / ranks
    assert max(abs(load - mean) for load in loads) <= max(lengths)


def test_balanced_placement_moves_nothing():
    lengths = [10, 12, 11, 9]
    owners = [0, 0, 1, 1]
    assert balanced_assignment(lengths, owners, 2) == owners


def test_moves_only_what_balance_requires():
    # rank 0 holds 3 rollouts, rank 1 holds 1; all lengths equal: exactly one rollout must move
    lengths = [5, 5, 5, 5]
    owners = [0, 0, 0, 1]
    targets = balanced_assignment(lengths, owners, 2)
    assert sum(t != o for t, o in zip(targets, owners)) == 1
    assert sorted(targets) == [0, 0, 1, 1]


def test_skewed_lengths_are_spread():
    lengths = [100, 90, 80, 70, 1, 1, 1, 1]
    owners = [0, 0, 0, 0, 1, 1, 1, 1]
    targets = balanced_assignment(lengths, owners, 2)
    loads, counts = _loads(lengths, targets, 2)
    assert counts == [4, 4]
    assert loads == [172, 172]  # 100 + 70 + 1 + 1 and 90 + 80 + 1 + 1


@pytest.mark.parametrize("n, ranks", [(9, 4), (0, 2), (3, 4)])
def test_count_not_a_multiple_of_dp_size_is_an_error(n, ranks):
    with pytest.raises(ValueError, match="data-parallel ranks"):
        balanced_assignment([1] * n, [0] * n, ranks)


def test_bad_owner_is_an_error():
    with pytest.raises(ValueError, match="owners must be DP ranks"):
        balanced_assignment([1, 2], [0, 5], 2)
