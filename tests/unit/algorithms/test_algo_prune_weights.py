"""Bucket-size weights of a pruned batch (pruning.weighting="bucket_size")."""

import pytest
import torch

from fastrl.algorithms.advantages import grpo_advantages
from fastrl.algorithms.prune_weights import bucket_size_weights


def _group(rewards):
    r = torch.tensor(rewards, dtype=torch.float64)
    return grpo_advantages(r, torch.zeros(len(rewards), dtype=torch.long))


def test_one_kept_per_bucket_restores_the_zero_sum():
    # 6 right (A = +0.540060), 2 wrong (A = -1.620181; eps 1e-6 in the denominator); one of each kept: raw weights 6 and 2,
    # mean 4 -> 1.5 and 0.5; 1.5 x 0.540060 + 0.5 x (-1.620181) = 0
    adv = _group([1, 1, 1, 1, 1, 1, 0, 0])
    keep = torch.tensor([1, 0, 0, 0, 0, 0, 1, 0], dtype=torch.bool)
    w = bucket_size_weights(adv, torch.zeros(8, dtype=torch.long), keep)
    assert w.dtype == torch.float32
    torch.testing.assert_close(w, torch.tensor([1.5, 0, 0, 0, 0, 0, 0.5, 0]))
    assert float(adv[keep].sum()) == pytest.approx(-1.080121, abs=1e-6)  # unweighted: biased to the minority
    assert float((adv * w.double())[keep].sum()) == pytest.approx(0.0, abs=1e-6)


def test_weights_over_several_groups_have_mean_one_on_the_kept_rows():
    # group 0: buckets {+A: rows 0-2, kept 0,1} {-A: row 3, kept}; group 1: one zero-advantage
    # bucket of 4, rows 4 and 5 kept. Raw: 1.5, 1.5, 1, 2, 2 -> mean 1.6
    adv = torch.cat([_group([1, 1, 1, 0]), _group([0, 0, 0, 0])])
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    keep = torch.tensor([1, 1, 0, 1, 1, 1, 0, 0], dtype=torch.bool)
    w = bucket_size_weights(adv, gid, keep)
    torch.testing.assert_close(w, torch.tensor([1.5, 1.5, 0, 1, 2, 2, 0, 0]) / 1.6)
    assert float(w[keep].mean()) == pytest.approx(1.0)


def test_keeping_everything_gives_weight_one():
    adv = _group([1.5, 1.5, 0.5, 0.5, 0.5, 0, 1.5, 0.5])
    w = bucket_size_weights(adv, torch.zeros(8, dtype=torch.long), torch.ones(8, dtype=torch.bool))
    torch.testing.assert_close(w, torch.ones(8))


def test_paper_semantics_bucket_by_tolerance():
    # 0.30004 and 0.30006 share a bucket under "paper" (tolerance 1e-4); "reference" rounds them
    # to 4 decimals, 0.3 and 0.3001: two buckets
    adv = torch.tensor([0.30004, 0.30006, -0.6])
    gid = torch.zeros(3, dtype=torch.long)
    keep = torch.tensor([True, False, True])
    paper = bucket_size_weights(adv, gid, keep, semantics="paper")
    reference = bucket_size_weights(adv, gid, keep, semantics="reference")
    torch.testing.assert_close(paper, torch.tensor([4 / 3, 0, 2 / 3]))
    torch.testing.assert_close(reference, torch.tensor([1.0, 0, 1.0]))


def test_bad_inputs_are_refused_with_the_reason():
    adv = torch.zeros(4)
    gid = torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="`keep` has 3 rows but `advantages` has 4"):
        bucket_size_weights(adv, gid, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="keeps no rollout"):
        bucket_size_weights(adv, gid, torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="semantics"):
        bucket_size_weights(adv, gid, torch.ones(4, dtype=torch.bool), semantics="exact")
