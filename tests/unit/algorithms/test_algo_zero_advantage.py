"""Uniform groups out of the expensive passes and their KL sample (pruning.drop_uniform_groups,
pruning.zero_adv_kl; issue 49 item 1), the KL row weights of the loss, and near-duplicate clusters
(item 3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastrl.algorithms.advantages import grpo_advantages
from fastrl.algorithms.losses import kl_loss
from fastrl.algorithms.near_duplicates import near_duplicate_clusters
from fastrl.algorithms.zero_advantage import kl_sample, merge_uniform_drop, zero_advantage_groups


def _batch(rewards_per_group):
    r = torch.tensor([x for g in rewards_per_group for x in g], dtype=torch.float32)
    gid = torch.tensor([i for i, g in enumerate(rewards_per_group) for _ in g])
    return grpo_advantages(r, gid), gid


def test_uniform_groups_are_whole_groups_not_rows_at_the_mean():
    """catches: a per-row zero test (a mixed group's rollout at the group mean, advantage 0, taken
    for a uniform group)."""
    adv, gid = _batch([[1, 1, 1], [0, 0.5, 1], [0, 0, 0], [1, 0, 0]])
    assert float(adv[4]) == 0.0  # the 0.5 sits at its group's mean
    assert zero_advantage_groups(adv, gid).tolist() == [True] * 3 + [False] * 3 + [True] * 3 + [False] * 3


def test_no_uniform_rollout_is_kept_when_dropped():
    """catches: a uniform group kept (``phase1 = mixed_keep`` without ``& ~uniform``)."""
    adv, gid = _batch([[1, 1, 1, 1], [1, 0, 0, 1], [0, 0, 0, 0], [1, 0, 1, 1]])
    everything = torch.ones(16, dtype=torch.bool)
    result, kl_w = merge_uniform_drop(adv, gid, everything, kl="drop")
    assert kl_w is None
    assert result.keep.tolist() == [False] * 4 + [True] * 4 + [False] * 4 + [True] * 4
    assert result.kept_per_group == {0: 0, 1: 4, 2: 0, 3: 4}  # what ARS records


def test_kl_sample_is_weighted_u_over_s_and_kept_beside_the_mixed_rows():
    """catches: a KL weight other than ``U / s`` (``s / U``, or 1) on the sampled uniform rows, or a
    sample of another size."""
    adv, gid = _batch([[1, 1, 1, 1], [1, 0, 0, 1], [0, 0, 0, 0], [1, 0, 1, 1]])
    result, kl_w = merge_uniform_drop(
        adv, gid, torch.ones(16, dtype=torch.bool), kl="sample", num_samples=3, generator=torch.Generator().manual_seed(0)
    )
    uniform = torch.from_numpy(zero_advantage_groups(adv, gid))
    assert int((result.keep & uniform).sum()) == 3
    assert result.keep[~uniform].all()
    torch.testing.assert_close(kl_w[result.keep & uniform], torch.full((3,), 8 / 3))
    torch.testing.assert_close(kl_w[~(result.keep & uniform)], torch.ones(13))


def test_kl_sample_is_a_uniform_draw_so_the_weighted_kl_sum_is_unbiased():
    """catches: a sample that always takes the same rows (first in batch order), whose weighted KL
    sum is biased: each of the 8 uniform rows must be drawn about s / U = 1/4 of the time, and the
    mean of (U / s) x (sampled KL sum) over draws must approach the full KL sum."""
    adv, gid = _batch([[1] * 4, [0] * 4, [1, 0]])
    uniform = zero_advantage_groups(adv, gid)
    kl_rows = np.arange(10, dtype=np.float64) ** 2  # any per-row KL sums
    counts, estimates = np.zeros(10), []
    for seed in range(800):
        s, w = kl_sample(adv, gid, uniform, num_samples=2, generator=torch.Generator().manual_seed(seed))
        counts += s
        estimates.append(w * kl_rows[s].sum())
    np.testing.assert_allclose(counts[:8] / 800, 0.25, atol=0.06)
    assert counts[8:].sum() == 0
    assert np.mean(estimates) == pytest.approx(kl_rows[:8].sum(), rel=0.06)


def test_all_uniform_batch_still_trains_one_rollout_per_group():
    """catches: an empty keep mask when every group is uniform (the step would have no rows)."""
    adv, gid = _batch([[1, 1], [0, 0, 0]])
    result, _ = merge_uniform_drop(adv, gid, torch.zeros(5, dtype=torch.bool), kl="drop")
    assert result.keep.tolist() == [True, False, True, False, False]


def test_kl_row_weights_scale_each_rollouts_kl_terms():
    """catches: ``row_weights`` ignored by :func:`kl_loss` (the sampled uniform rows' KL unweighted)."""
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]])
    ref = torch.tensor([[-0.9, -2.5], [-0.7, -1.0]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    plain, _ = kl_loss(lp, ref, mask, global_denominator=4.0)
    weighted, _ = kl_loss(lp, ref, mask, global_denominator=4.0, row_weights=torch.tensor([1.0, 3.0]))
    row0, _ = kl_loss(lp[:1], ref[:1], mask[:1], global_denominator=4.0)
    row1 = plain - row0
    torch.testing.assert_close(weighted, row0 + 3.0 * row1)
    with pytest.raises(ValueError, match="row_weights"):
        kl_loss(lp, ref, mask, global_denominator=4.0, row_weights=torch.ones(3))


def test_near_copies_merge_inside_a_bucket_only():
    """catches: clusters that cross advantage buckets (a right and a wrong answer with the same text
    merged), or a strict ``>`` at the threshold (a pair at exactly J = threshold left apart)."""
    base = list(range(100, 110))
    responses = [base, base, base[:9] + [999], list(range(200, 210)), base]
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0, -2.0])
    gid = torch.zeros(5, dtype=torch.long)
    # 5-grams: base has 6, base[:9] + [999] shares 5 of them, union 7: J = 5/7
    assert near_duplicate_clusters(adv, gid, responses, threshold=5 / 7).tolist() == [0, 0, 0, 3, 4]
    assert near_duplicate_clusters(adv, gid, responses, threshold=0.72).tolist() == [0, 0, 2, 3, 4]


def test_near_duplicate_clusters_do_not_depend_on_the_data_parallel_layout():
    """catches: clusters keyed by row position across groups (e.g. the representative chosen by the
    batch-wide row order), which differ between DP=1's and DP=2's gathered batch."""
    rng = np.random.default_rng(0)
    responses = [list(rng.integers(0, 4, size=12)) for _ in range(24)]
    adv = torch.tensor([1.0, -1.0] * 12)
    gid = torch.arange(4).repeat_interleave(6)
    one = near_duplicate_clusters(adv, gid, responses, ngram=2, threshold=0.3)
    perm = torch.cat([torch.nonzero(gid % 2 == r).flatten() for r in (0, 1)])
    two = near_duplicate_clusters(adv[perm], gid[perm], [responses[i] for i in perm.tolist()], ngram=2, threshold=0.3)
    assert (one != np.arange(24)).any()  # something merged
    assert perm[torch.from_numpy(two)].tolist() == one[perm.numpy()].tolist()
