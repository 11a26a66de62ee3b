"""Pruning dispatch and update geometry helpers of the trainer."""

import pytest
import torch

from fastrl.config import PruningConfig
from fastrl.training.geometry import mini_batch_sizes, trim_to_multiple
from fastrl.training.pruner import keep_all, select_rollouts

ADV = torch.tensor([1.157664, 1.157664, -0.526211, -0.526211, -0.526211, -1.368148, 1.157664, -0.526211])
GIDS = torch.zeros(8, dtype=torch.long)
RESP = [torch.tensor([1, 2, 3])] * 8


def test_none_keeps_everything_with_statistics():
    r = select_rollouts(PruningConfig(method="none"), ADV, GIDS, RESP, multiple=4, generator=torch.Generator())
    assert r.num_kept == 8 and r.kept_per_group == {0: 8} and r.f1 == 8.0 and r.f2 == 8
    assert r.kept_tokens == r.total_tokens == 24


def test_cppo_dispatch_matches_spec_vector():
    r = select_rollouts(PruningConfig(method="cppo", keep_ratio=0.5), ADV, GIDS, RESP, multiple=1, generator=torch.Generator())
    assert r.indices.tolist() == [0, 1, 5, 6]


def test_fastrl_dispatch_prunes_identical_responses_to_one_per_bucket():
    r = select_rollouts(PruningConfig(method="fastrl"), ADV, GIDS, RESP, multiple=1, generator=torch.Generator())
    assert r.num_kept == 3  # three advantage levels, identical token sets
    sketch = select_rollouts(
        PruningConfig(method="fastrl", similarity_mode="minhash", minhash_num_perm=64), ADV, GIDS, RESP,
        multiple=1, generator=torch.Generator(),
    )
    assert sketch.num_kept == 3


def test_random_and_advantage_only_are_seeded():
    for method in ("random", "advantage_only"):
        a = select_rollouts(PruningConfig(method=method), ADV, GIDS, RESP, multiple=1, generator=torch.Generator().manual_seed(3))
        b = select_rollouts(PruningConfig(method=method), ADV, GIDS, RESP, multiple=1, generator=torch.Generator().manual_seed(3))
        assert torch.equal(a.keep, b.keep)


def test_trim_to_multiple_drops_smallest_abs_advantage():
    r = keep_all(torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([1] * 6))
    adv = torch.tensor([0.5, -0.1, 0.9, 0.0, 2.0, -0.3])
    trimmed, dropped = trim_to_multiple(r, adv, torch.tensor([0, 0, 0, 1, 1, 1]), 4)
    assert dropped == 2
    assert trimmed.indices.tolist() == [0, 2, 4, 5]
    assert trimmed.kept_per_group == {0: 2, 1: 2} and trimmed.f2 == 2
    same, none = trim_to_multiple(r, adv, torch.tensor([0, 0, 0, 1, 1, 1]), 3)
    assert none == 0 and same is r
    with pytest.raises(ValueError, match="fewer than dp_size x micro_batch_size = 8"):
        trim_to_multiple(r, adv, torch.tensor([0, 0, 0, 1, 1, 1]), 8)


def test_mini_batch_sizes():
    assert mini_batch_sizes(64, 16, 2) == [16, 16, 16, 16]
    assert mini_batch_sizes(40, 16, 2) == [20, 20]
    assert mini_batch_sizes(6, 16, 2) == [6]
    assert sum(mini_batch_sizes(90, 32, 3)) == 90 and all(s % 3 == 0 for s in mini_batch_sizes(90, 32, 3))
    assert mini_batch_sizes(14, 7, 2) == [8, 6]  # n=7 from adaptive sampling, micro-batch 2
    assert mini_batch_sizes(4, 16, 4) == [4]
    with pytest.raises(ValueError, match="micro-batches of 4"):
        mini_batch_sizes(10, 8, 4)


def test_matched_peers_keep_mdaps_count_chosen_by_their_rule():
    # MDAP keeps 3 (one per advantage level); the matched peers keep 3 as well, by their own rule.
    # Breakage caught: a dispatch that runs the peer at its own keep_ratio (4 of 8) or returns MDAP's choice.
    top = select_rollouts(PruningConfig(method="matched_top_abs"), ADV, GIDS, RESP, multiple=1, generator=torch.Generator())
    assert top.indices.tolist() == [0, 1, 5]  # |-1.37|, then the first two of the tied 1.16s
    pods = select_rollouts(PruningConfig(method="matched_pods"), ADV, GIDS, RESP, multiple=1, generator=torch.Generator())
    assert pods.num_kept == 3 and 5 in pods.indices.tolist()
    draws = {
        tuple(select_rollouts(PruningConfig(method="matched_random"), ADV, GIDS, RESP, multiple=1,
                              generator=torch.Generator().manual_seed(s)).indices.tolist())
        for s in range(20)
    }
    assert all(len(d) == 3 for d in draws) and len(draws) > 5  # the same count, many different choices
