"""Matched-ratio peers of MDAP (issue 30, item 2): the same per-group count as a reference keep
mask, chosen at random, by largest |advantage| or by PODS's max-variance rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastrl.algorithms import matched_select, mdap_select

# two groups of 6: group 0 right/wrong split, group 1 one right answer among wrong ones
ADV = torch.tensor([0.9, 0.9, 0.9, -1.1, -0.7, -0.9, 2.0, -0.4, -0.4, -0.4, -0.4, -0.4])
GID = torch.tensor([0] * 6 + [1] * 6)
REF = torch.tensor([1, 0, 0, 1, 0, 0] + [1, 1, 0, 1, 0, 0], dtype=torch.bool)  # keeps 2 and 3


def _kept(result, g):
    return sorted(i for i in torch.nonzero(result.phase1_keep).view(-1).tolist() if int(GID[i]) == g)


def test_top_abs_takes_the_largest_magnitudes_at_the_reference_counts():
    # Breakage caught: a matched peer that keeps its own ratio (keep_ratio) instead of the reference's counts.
    r = matched_select(ADV, GID, REF, rule="top_abs")
    assert _kept(r, 0) == [0, 3] and _kept(r, 1) == [6, 7, 8]  # |-1.1|, then 0.9 (first of the ties)
    assert r.kept_per_group == {0: 2, 1: 3}


def test_pods_takes_the_max_variance_subset():
    r = matched_select(ADV, GID, REF, rule="pods")
    assert _kept(r, 0) == [2, 3]  # the lowest and the highest (of the tied 0.9s the last row): variance 1.0
    assert _kept(r, 1) == [6, 7, 8]  # the single right answer and the first two wrong ones


def test_random_is_uniform_at_the_reference_counts_and_reproducible():
    picks = []
    for seed in range(400):
        r = matched_select(ADV, GID, REF, rule="random", generator=torch.Generator().manual_seed(seed))
        assert len(_kept(r, 0)) == 2 and len(_kept(r, 1)) == 3
        picks.append(r.phase1_keep.numpy())
    freq = np.mean(picks, axis=0)
    # each row of group 0 kept with probability 2/6, of group 1 with 3/6 (uniform within the group)
    np.testing.assert_allclose(freq[:6], 2 / 6, atol=0.08)
    np.testing.assert_allclose(freq[6:], 3 / 6, atol=0.08)
    again = matched_select(ADV, GID, REF, rule="random", generator=torch.Generator().manual_seed(7))
    first = matched_select(ADV, GID, REF, rule="random", generator=torch.Generator().manual_seed(7))
    assert torch.equal(again.keep, first.keep)


def test_matched_to_mdap_keeps_mdaps_counts_and_refills_the_same_way():
    # identical responses within each sign: MDAP keeps one per advantage bucket
    responses = [torch.tensor([1, 2, 3]) if a > 0 else torch.tensor([4, 5, 6]) for a in ADV.tolist()]
    mdap = mdap_select(ADV, GID, responses, multiple=4)
    for rule in ("random", "top_abs", "pods"):
        gen = torch.Generator().manual_seed(0)
        r = matched_select(ADV, GID, mdap.phase1_keep, rule=rule, generator=gen, multiple=4)
        for g in (0, 1):
            assert len(_kept(r, g)) == int(mdap.phase1_keep[GID == g].sum())
        assert r.num_kept % 4 == 0 and r.num_kept == mdap.num_kept


def test_bad_arguments():
    with pytest.raises(ValueError, match="`rule` must be one of"):
        matched_select(ADV, GID, REF, rule="best")
    with pytest.raises(ValueError, match="12 rollouts"):
        matched_select(ADV, GID, REF[:5], rule="top_abs")
    with pytest.raises((TypeError, ValueError)):
        matched_select(ADV, GID, REF, rule="random")  # no generator
