"""Budget-stratified selection and its weights (pruning.method=budget_stratified, issue 49 item 2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastrl.algorithms.advantages import grpo_advantages
from fastrl.algorithms.budget_select import budget_stratified_select, stratified_weights


def _batch(rewards_per_group):
    r = torch.tensor([x for g in rewards_per_group for x in g], dtype=torch.float32)
    gid = torch.tensor([i for i, g in enumerate(rewards_per_group) for _ in g])
    return grpo_advantages(r, gid), gid


def _random_batch(seed, groups=12, n=8):
    rng = np.random.default_rng(seed)
    rewards = [rng.integers(0, 2, size=n).tolist() for _ in range(groups)]
    rewards[0] = [1] * n  # one uniform group at least
    return _batch(rewards)


def _buckets(adv, gid):
    """(group, rounded advantage) -> rows, for the informative buckets (advantage not 0)."""
    out = {}
    for i, (a, g) in enumerate(zip(adv.tolist(), gid.tolist())):
        if round(a, 4) != 0:
            out.setdefault((g, round(a, 4)), []).append(i)
    return out


def _select(adv, gid, seed=0, **kw):
    return budget_stratified_select(adv, gid, generator=torch.Generator().manual_seed(seed), **kw)


def test_no_informative_bucket_is_emptied_even_by_a_tiny_budget():
    """catches: the level-0 floor not forced past the budget (``take = min(budget, ...)``), which
    empties buckets when the budget is smaller than the number of informative buckets."""
    for seed in range(5):
        adv, gid = _random_batch(seed)
        r = _select(adv, gid, seed=seed, budget_fraction=0.01)
        for rows in _buckets(adv, gid).values():
            assert r.phase1_keep[rows].any(), f"seed {seed}: bucket {rows} emptied"


def test_every_informative_bucket_gets_min_per_bucket_when_the_budget_allows():
    """catches: the level capped at 1 instead of ``min_per_bucket`` (``np.minimum(rank, 1)``): the
    second rollout of a bucket then competes with every other row and buckets get one."""
    for seed in range(5):
        adv, gid = _random_batch(seed)
        buckets = _buckets(adv, gid)
        need = sum(min(2, len(rows)) for rows in buckets.values())
        r = _select(adv, gid, seed=seed, budget_fraction=need / len(adv), min_per_bucket=2)
        for rows in buckets.values():
            assert int(r.phase1_keep[rows].sum()) >= min(2, len(rows)), f"seed {seed}: bucket {rows}"


def test_the_budget_is_not_exceeded_in_rollouts_or_tokens():
    """catches: an off-by-one budget (``int(fraction x N) + 1``) or a token prefix that may overrun
    (``cumsum <= budget + longest``)."""
    for seed in range(5):
        adv, gid = _random_batch(seed)
        lengths = torch.from_numpy(np.random.default_rng(seed).integers(5, 60, size=len(adv)))
        for fraction in (0.3, 0.5, 0.8):
            r = _select(adv, gid, seed=seed, budget_fraction=fraction, response_lengths=lengths)
            assert int(r.phase1_keep.sum()) == int(fraction * len(adv))  # floor (<= 24 buckets) fits
            t = _select(adv, gid, seed=seed, budget_fraction=fraction, budget_unit="tokens", response_lengths=lengths)
            assert int(lengths[t.phase1_keep].sum()) <= int(fraction * int(lengths.sum()))


def test_uniform_groups_get_budget_only_after_every_informative_rollout():
    """catches: zero-advantage rows ranked with the informative ones past the floor (level ``k``
    instead of ``k + 1``)."""
    adv, gid = _random_batch(3)
    informative = torch.tensor([round(a, 4) != 0 for a in adv.tolist()])
    for fraction in (0.4, 0.6, 0.9):
        r = _select(adv, gid, budget_fraction=fraction)
        if (r.phase1_keep & ~informative).any():
            assert r.phase1_keep[informative].all()
    r = _select(adv, gid, budget_fraction=float(informative.sum()) / len(adv))
    assert torch.equal(r.phase1_keep, informative)


def test_choice_within_a_bucket_is_uniform():
    """catches: members ranked by batch position instead of the keyed draw (always the first rows of
    a bucket): each of a bucket's 6 members must be kept about 2/6 of the time."""
    adv, gid = _batch([[1, 1, 1, 1, 1, 1, 0, 0]])
    counts = np.zeros(8)
    for seed in range(600):
        counts += _select(adv, gid, seed=seed, budget_fraction=4 / 8, min_per_bucket=2).phase1_keep.numpy()
    assert counts[6] == counts[7] == 600  # the wrong pair: both kept (k = 2)
    np.testing.assert_allclose(counts[:6] / 600, 2 / 6, atol=0.07)


def test_same_decision_on_every_data_parallel_layout():
    """catches: draws made per row position (``torch.rand(N)`` in row order, or ``local`` replaced
    by the row index), which make DP=2's gathered batch (the ranks' groups in rank order) decide
    otherwise than DP=1's for the same rollouts."""
    adv, gid = _random_batch(7, groups=8)
    lengths = torch.arange(len(adv)) % 13 + 3
    # DP=2: rank 0 generated groups 0, 2, 4, 6 and rank 1 groups 1, 3, 5, 7
    perm = torch.cat([torch.nonzero(gid % 2 == r).flatten() for r in (0, 1)])
    for kw in (dict(budget_fraction=0.3), dict(budget_fraction=0.4, budget_unit="tokens"), dict(budget_fraction=0.3, multiple=2)):
        one = _select(adv, gid, seed=11, response_lengths=lengths, **kw)
        two = _select(adv[perm], gid[perm], seed=11, response_lengths=lengths[perm], **kw)
        assert torch.equal(one.keep[perm], two.keep), kw
        assert one.kept_per_group == two.kept_per_group


def test_same_seed_same_choice_other_seed_other_choice():
    """catches: a selection that ignores the generator (no randomness) or reads global random state."""
    adv, gid = _random_batch(1)
    torch.manual_seed(0)
    a = _select(adv, gid, seed=5, budget_fraction=0.3)
    torch.manual_seed(1)
    assert torch.equal(a.keep, _select(adv, gid, seed=5, budget_fraction=0.3).keep)
    assert any(not torch.equal(a.keep, _select(adv, gid, seed=s, budget_fraction=0.3).keep) for s in range(6, 10))


def test_only_candidates_are_chosen():
    """catches: the candidate mask (near-duplicate representatives) ignored by the selection."""
    adv, gid = _random_batch(2)
    cand = torch.arange(len(adv)) % 3 != 1
    r = _select(adv, gid, budget_fraction=0.6, candidates=cand)
    assert not (r.phase1_keep & ~cand).any()


def test_weights_restore_every_bucket_sum_and_the_zero_group_sum():
    """catches: weights that do not restore the group's advantage sum (``1 / kept`` or ``members``
    alone instead of ``members / kept``)."""
    adv, gid = _batch([[1, 1, 1, 1, 1, 1, 0, 0], [1, 0, 0, 0]])
    keep = torch.tensor([1, 1, 0, 0, 0, 0, 1, 0, 1, 1, 0, 0], dtype=torch.bool)
    w = stratified_weights(adv, gid, keep)
    # raw members / kept: 3, 3, 2 | 1, 3 -> times T_K / T_hat = 5 / 12
    torch.testing.assert_close(w, torch.tensor([3, 3, 0, 0, 0, 0, 2, 0, 1, 3, 0, 0]) * 5 / 12)
    for g in (0, 1):
        rows = gid == g
        assert float((adv * w)[rows].sum()) == pytest.approx(0.0, abs=1e-5)
    for rows in _buckets(adv, gid).values():  # each bucket: sum of weights = members x (T_K / T_hat)
        assert float(w[rows].sum()) == pytest.approx(len(rows) * 5 / 12)


def test_weights_count_a_merged_cluster_by_its_size():
    """catches: near-duplicate clusters ignored by the weights (every kept row weighted as one rollout)."""
    adv, gid = _batch([[1, 1, 1, 1, 1, 0, 0, 0]])
    clusters = torch.tensor([0, 0, 0, 3, 4, 5, 6, 7])  # rows 0-2: one cluster of three copies
    keep = torch.tensor([1, 0, 0, 1, 0, 1, 0, 0], dtype=torch.bool)
    w = stratified_weights(adv, gid, keep, clusters=clusters)
    # right bucket (5 members): masses 3 (row 0) and 1 (row 3) -> 15/4, 5/4; wrong bucket: 3; T_K / T_hat = 3 / 8
    torch.testing.assert_close(w, torch.tensor([15 / 4, 0, 0, 5 / 4, 0, 3, 0, 0]) * 3 / 8)
    assert float((adv * w).sum()) == pytest.approx(0.0, abs=1e-5)


def test_bad_options_are_refused():
    adv, gid = _batch([[1, 0]])
    with pytest.raises(ValueError, match="budget_fraction"):
        _select(adv, gid, budget_fraction=0.0)
    with pytest.raises(ValueError, match="needs `response_lengths`"):
        _select(adv, gid, budget_unit="tokens")
    with pytest.raises(ValueError, match="`candidates` has 3 rows"):
        _select(adv, gid, candidates=[True] * 3)
    with pytest.raises(ValueError, match="min_per_bucket"):
        _select(adv, gid, min_per_bucket=0)
