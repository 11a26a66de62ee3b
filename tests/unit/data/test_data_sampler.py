"""ResumableSampler: epochs are permutations, resuming never repeats or skips a prompt."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl.data import ResumableSampler


def test_each_epoch_is_a_seeded_permutation():
    sampler = ResumableSampler(10, seed=3)
    first = sampler.next_batch(10)
    second = sampler.next_batch(10)
    assert sorted(first.indices) == list(range(10)) and sorted(second.indices) == list(range(10))
    assert first.indices != second.indices
    assert (first.epoch, first.epochs_completed, second.epoch) == (0, 1, 1)
    assert first.indices == np.random.default_rng([3, 0]).permutation(10).tolist()
    assert ResumableSampler(10, seed=3).next_batch(10).indices == first.indices
    assert ResumableSampler(10, seed=4).next_batch(10).indices != first.indices


def test_batch_crossing_an_epoch_boundary():
    sampler = ResumableSampler(5, seed=0, shuffle=False)
    assert sampler.next_batch(3).indices == [0, 1, 2]
    batch = sampler.next_batch(4)
    assert (batch.indices, batch.epoch, batch.epochs_completed) == ([3, 4, 0, 1], 0, 1)
    assert sampler.next_batch(11).epochs_completed == 2  # larger than the dataset
    assert (sampler.state_dict()["epoch"], sampler.state_dict()["position"]) == (3, 3)  # 7 + 11 = 3 * 5 + 3


@settings(max_examples=40, deadline=None)
@given(
    num_items=st.integers(1, 30),
    sizes=st.lists(st.integers(1, 17), min_size=1, max_size=12),
    resume_at=st.integers(0, 12),
    seed=st.integers(0, 2**31),
)
def test_resuming_with_changing_batch_sizes_equals_an_uninterrupted_run(num_items, sizes, resume_at, seed):
    reference = ResumableSampler(num_items, seed=seed)
    expected = [i for size in sizes for i in reference.next_batch(size).indices]
    sampler = ResumableSampler(num_items, seed=seed)
    got = []
    for k, size in enumerate(sizes):
        if k == resume_at:  # a restart: a fresh sampler loads the checkpointed state
            state = sampler.state_dict()
            sampler = ResumableSampler(num_items, seed=seed)
            sampler.load_state_dict(state)
        got.extend(sampler.next_batch(size).indices)
    assert got == expected
    # Every epoch visits every index exactly once.
    for epoch_start in range(0, len(got) - num_items + 1, num_items):
        assert sorted(got[epoch_start : epoch_start + num_items]) == list(range(num_items))


def test_state_from_another_dataset_is_refused():
    sampler = ResumableSampler(10, seed=1)
    sampler.next_batch(4)
    state = sampler.state_dict()
    with pytest.raises(ValueError, match="num_items=10 but this run has num_items=9"):
        ResumableSampler(9, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=1 but this run has seed=2"):
        ResumableSampler(10, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="outside"):
        ResumableSampler(10, seed=1).load_state_dict({**state, "position": 10})
    with pytest.raises(ValueError, match="batch_size"):
        sampler.next_batch(0)
