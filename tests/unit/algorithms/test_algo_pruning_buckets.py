"""MDAP "paper" semantics in buckets of three and more members: only *kept* members veto a
candidate (spec section 2). The property test of test_algo_pruning.py draws advantages from eight
levels over up to six groups, so it rarely puts three members in one bucket; the strategy here
puts most rows of a batch in one or two buckets."""

import torch
from _algo_settings import PROPERTY
from _mdap_reference import mdap_reference
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl.algorithms.pruning import mdap_select


def t(*tokens):
    return torch.tensor(tokens, dtype=torch.int64)


def test_a_pruned_member_does_not_veto_a_later_one():
    """catches: the paper semantics' ``~prev_kept |`` term dropped in
    ``fastrl/algorithms/pruning.py`` (pruned members veto too): the vector of issue 46.

    A=[1,2], B=[1,2,3,4], C=[3,4,5] in one bucket, visited in that order (|a| descending), tau 0.2:
    J(A,B) = 0.5 prunes B; J(A,C) = 0 keeps C although J(B,C) = 0.4, since B is not kept."""
    adv = torch.tensor([0.9, 0.8, 0.7])
    responses = [t(1, 2), t(1, 2, 3, 4), t(3, 4, 5)]
    res = mdap_select(adv, torch.zeros(3, dtype=torch.int64), responses, semantics="paper",
                      adv_tolerance=0.15, similarity_threshold=0.2)
    assert res.num_buckets == 1
    assert res.phase1_keep.tolist() == [True, False, True]
    assert res.keep.tolist() == [True, False, True]


@st.composite
def large_buckets(draw, max_rows=16):
    """One or two groups whose members mostly share an advantage level (big buckets), responses
    from a small vocabulary (similar ones, so that some members are pruned and later ones are
    compared with them)."""
    n = draw(st.integers(3, max_rows))
    gids = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    levels = draw(st.lists(st.sampled_from([0.5, 0.5, 0.5, 0.50005, -1.0]), min_size=n, max_size=n))
    responses = [torch.tensor(draw(st.lists(st.integers(0, 5), min_size=1, max_size=5)), dtype=torch.int64)
                 for _ in range(n)]
    return torch.tensor(levels, dtype=torch.float32), torch.tensor(gids), responses


@settings(PROPERTY, max_examples=200)
@given(large_buckets(), st.sampled_from([0.2, 0.34, 0.5]))
def test_property_paper_semantics_in_large_buckets_match_python_sets(batch, threshold):
    """catches: the same break as above, on generated batches (a bucket of >= 3 members where a
    pruned member is similar to a later candidate); checked against the plain Python-set
    implementation of spec section 2 (tests/unit/algorithms/_mdap_reference.py)."""
    adv, gid, responses = batch
    keep, phase1, nb = mdap_reference(adv.numpy(), gid.tolist(), responses, threshold=threshold, semantics="paper")
    res = mdap_select(adv, gid, responses, similarity_threshold=threshold, semantics="paper")
    assert res.phase1_keep.tolist() == phase1
    assert res.keep.tolist() == keep and res.num_buckets == nb
