"""MDAP and the baseline pruners: spec section 7 vectors, exact agreement with a Python-set
implementation, invariants (hypothesis), bad input."""

import numpy as np
import pytest
import torch
from _algo_settings import PROPERTY
from _mdap_reference import mdap_reference
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fastrl.algorithms import token_sets
from fastrl.algorithms.advantages import grpo_advantages
from fastrl.algorithms.baseline_pruners import advantage_only_select, cppo_select, random_select
from fastrl.algorithms.pruning import jaccard, mdap_select, refill_need


def t(*tokens):
    return torch.tensor(tokens, dtype=torch.int64)


# ---------------------------------------------------------------------------------------------
# spec vectors
# ---------------------------------------------------------------------------------------------


def test_jaccard_spec_vectors():
    assert jaccard(t(1, 2, 3, 4), t(3, 4, 5, 6)) == 2 / 6
    assert jaccard([1, 1, 2], [2, 2, 1]) == 1.0
    assert jaccard(np.array([7, 8, 9]), t(10, 11, 12, 13)) == 0.0
    assert jaccard(list(range(1, 6)), list(range(5, 14))) == 1 / 13
    assert jaccard([], t()) == 1.0


def test_jaccard_ngrams():
    assert jaccard([1, 2, 3], [3, 2, 1]) == 1.0
    assert jaccard([1, 2, 3], [3, 2, 1], ngram=2) == 0.0  # {(1,2),(2,3)} vs {(3,2),(2,1)}
    assert jaccard([1, 2, 3], [1, 2, 4], ngram=2) == 1 / 3
    assert jaccard([1], [2], ngram=2) == 1.0  # both too short: two empty sets
    with pytest.raises(ValueError, match="ngram"):
        jaccard([1], [1], ngram=0)


def test_cppo_spec_vector():
    r = torch.tensor([1.5, 1.5, 0.5, 0.5, 0.5, 0, 1.5, 0.5])
    adv = grpo_advantages(r, torch.zeros(8, dtype=torch.int64))
    res = cppo_select(adv, torch.zeros(8, dtype=torch.int64), keep_ratio=0.5)
    assert res.indices.tolist() == [0, 1, 5, 6]
    assert res.kept_per_group == {0: 4} and res.f1 == 4.0 and res.f2 == 4


def test_refill_arithmetic_spec_vector():
    """256 prompts, n0 = 8, multiple 128, Phase 1 keeps 600 -> need 40 -> 640 kept."""
    assert refill_need(600, 128) == 40
    assert refill_need(640, 128) == 0
    # 88 groups with three advantage levels and 168 with two: 88 * 3 + 168 * 2 = 600 buckets; the
    # responses of a group are identical, so Phase 1 keeps exactly the 600 bucket seeds
    groups = [g for g in range(256) for _ in range(8)]
    advs = [float(k % (3 if g < 88 else 2)) - 1.0 for g in range(256) for k in range(8)]
    responses = [t(1, 2, 3)] * 2048
    res = mdap_select(torch.tensor(advs), torch.tensor(groups), responses, multiple=128)
    assert int(res.phase1_keep.sum()) == 600 and res.num_buckets == 600
    assert res.num_kept == 640 and res.num_refilled == 40
    refilled_groups = sorted({groups[i] for i in torch.nonzero(res.keep & ~res.phase1_keep).flatten().tolist()})
    assert refilled_groups == list(range(40))  # round robin: one from each group in ascending id order
    assert res.f1 == 640 / 256 and res.f2 == 4


# ---------------------------------------------------------------------------------------------
# hand-checked MDAP behaviour
# ---------------------------------------------------------------------------------------------


def test_reference_semantics_example():
    # one group, two buckets: a = +1 (rows 0, 1, 2) and a = -0.5 (rows 3, 4)
    adv = torch.tensor([1.0, 1.0, 1.0, -0.5, -0.5])
    responses = [
        t(1, 2, 3, 4),  # seed of the +1 bucket (first on the |a| tie)
        t(1, 2, 3, 5),  # J = 3/5 with the seed -> pruned
        t(9, 10, 11, 12, 13),  # J = 0 -> kept (a different reasoning path)
        t(1, 2),  # seed of the -0.5 bucket
        t(2, 3),  # J = 1/3 -> pruned
    ]
    res = mdap_select(adv, torch.zeros(5, dtype=torch.int64), responses)
    assert res.keep.tolist() == [True, False, True, True, False]
    assert res.num_buckets == 2 and res.kept_tokens == 4 + 5 + 2 and res.total_tokens == 17
    assert res.zero_advantage_kept == 0


def test_threshold_boundary_reference_prunes_paper_keeps():
    adv = torch.tensor([0.7, 0.7])
    responses = [t(1, 2, 3), t(3, 4, 5)]  # J = 1/5 = 0.2 exactly
    assert jaccard(*responses) == 0.2
    gid = torch.zeros(2, dtype=torch.int64)
    assert mdap_select(adv, gid, responses, semantics="reference").keep.tolist() == [True, False]
    assert mdap_select(adv, gid, responses, semantics="paper").keep.tolist() == [True, True]


def test_paper_semantics_compares_with_every_kept_member():
    adv = torch.tensor([0.9, 0.8, 0.7])  # one paper bucket with a wide tolerance, visited 0, 1, 2
    responses = [t(1, 2, 3), t(4, 5, 6), t(4, 5, 7)]  # 2 is disjoint from 0 but close to 1
    gid = torch.zeros(3, dtype=torch.int64)
    res = mdap_select(adv, gid, responses, semantics="paper", adv_tolerance=0.15)
    assert res.keep.tolist() == [True, True, False] and res.num_buckets == 1
    # reference semantics rounds to 4 decimals: three buckets, all seeds
    assert mdap_select(adv, gid, responses).num_buckets == 3


def test_paper_bucketing_is_single_link():
    adv = torch.tensor([0.0, 0.00008, 0.00016, 0.5], dtype=torch.float64)  # chain of gaps < 1e-4
    res = mdap_select(adv, torch.zeros(4, dtype=torch.int64), [t(1)] * 4, semantics="paper")
    assert res.num_buckets == 2
    assert res.keep.tolist() == [False, False, True, True]  # the largest |a| of the chain is visited first


def test_zero_variance_group_keeps_one():
    res = mdap_select(torch.zeros(4), torch.tensor([5, 5, 5, 5]), [t(1, 2)] * 4)
    assert res.keep.tolist() == [True, False, False, False]
    assert res.zero_advantage_kept == 1 and res.kept_per_group == {5: 1}


def test_refill_orders():
    # two groups; Phase 1 keeps the seeds (rows 0 and 4); multiple 4 needs 2 more
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0, -2.0, -2.0, -2.0, -2.0])
    adv_mod = adv.clone()
    gid = torch.tensor([3, 3, 3, 3, 1, 1, 1, 1])
    responses = [t(1)] * 8
    rr = mdap_select(adv_mod, gid, responses, multiple=4)
    assert torch.nonzero(rr.keep).flatten().tolist() == [0, 1, 4, 5]  # group 1 first, then group 3
    glob = mdap_select(adv_mod, gid, responses, multiple=4, refill="global_abs_adv")
    assert torch.nonzero(glob.keep).flatten().tolist() == [0, 4, 5, 6]  # the largest |a| anywhere


def test_padding_when_too_few_pruned():
    adv = torch.tensor([1.0, -1.0, 0.5])
    gid = torch.tensor([0, 0, 0])
    responses = [t(1), t(2), t(3)]  # three buckets: nothing is pruned
    with pytest.raises(ValueError, match=r"K=3 of 3 rollouts.*multiple=2.*needs 1 more but only 0"):
        mdap_select(adv, gid, responses, multiple=2)
    res = mdap_select(adv, gid, responses, multiple=2, allow_padding=True)
    assert res.num_kept == 3 and res.num_padding == 1
    res = mdap_select(adv, gid, responses, multiple=8, allow_padding=True)
    assert res.num_padding == 5


def test_determinism_and_no_global_rng():
    gen = np.random.default_rng(0)
    responses = [torch.from_numpy(gen.integers(0, 50, gen.integers(1, 30))) for _ in range(40)]
    gid = torch.from_numpy(gen.integers(0, 5, 40))
    adv = torch.from_numpy(gen.choice([-1.0, 0.0, 0.5, 1.0], 40)).float()
    torch.manual_seed(1)
    np.random.seed(1)
    a = mdap_select(adv, gid, responses, multiple=4)
    torch.manual_seed(2)
    np.random.seed(2)
    b = mdap_select(adv, gid, responses, multiple=4)
    assert a == b  # dataclass equality ignores the timing field


# ---------------------------------------------------------------------------------------------
# agreement with the Python-set implementation and invariants
# ---------------------------------------------------------------------------------------------


@st.composite
def batches(draw, max_rows=24, vocab=12, max_len=10):
    n = draw(st.integers(1, max_rows))
    gids = draw(st.lists(st.integers(-2, 3), min_size=n, max_size=n))
    levels = draw(
        st.lists(st.sampled_from([0.0, 0.5, -0.5, 1.0, 0.35355339, -1.2, 0.00004, 0.00012]), min_size=n, max_size=n)
    )
    responses = [
        torch.tensor(draw(st.lists(st.integers(0, vocab), min_size=0, max_size=max_len)), dtype=torch.int64)
        for _ in range(n)
    ]
    return torch.tensor(levels, dtype=torch.float32), torch.tensor(gids), responses


@settings(PROPERTY, max_examples=300)
@given(
    batches(),
    st.sampled_from(["reference", "paper"]),
    st.sampled_from(["round_robin", "global_abs_adv"]),
    st.integers(1, 3),
    st.sampled_from([0.0, 0.2, 0.34, 0.5, 1.0]),
    st.integers(1, 6),
)
def test_property_identical_to_python_sets(batch, semantics, refill, ngram, threshold, multiple):
    """Invariant: keep and Phase-1 masks and bucket counts equal the plain Python-set
    implementation of spec section 2 (both semantics, both refills, n-grams, any threshold)."""
    adv, gid, responses = batch
    kw = dict(threshold=threshold, semantics=semantics, ngram=ngram, multiple=multiple, refill=refill)
    try:
        keep, phase1, nb = mdap_reference(adv.numpy(), gid.tolist(), responses, **kw)
    except ValueError:
        assume(False)
    assume(multiple <= len(responses))
    res = mdap_select(
        adv,
        gid,
        responses,
        similarity_threshold=threshold,
        semantics=semantics,
        ngram=ngram,
        multiple=multiple,
        refill=refill,
    )
    assert res.keep.tolist() == keep
    assert res.phase1_keep.tolist() == phase1
    assert res.num_buckets == nb


@PROPERTY
@given(batches(max_rows=30), st.sampled_from(["reference", "paper"]), st.integers(1, 8))
def test_property_bookkeeping_invariants(batch, semantics, multiple):
    """Invariants: (1) the kept count is a multiple of `multiple` whenever enough rollouts were
    pruned (otherwise a clear error); (2) every advantage bucket of every group keeps at least one
    rollout in Phase 1; (3) Phase 1 is a subset of the final mask and Phase 2 adds exactly
    `num_refilled`; (4) kept_per_group, f1 and f2 describe the final mask."""
    adv, gid, responses = batch
    assume(multiple <= len(responses))
    try:
        res = mdap_select(adv, gid, responses, semantics=semantics, multiple=multiple)
    except ValueError as err:
        assert "needs" in str(err) and "were pruned" in str(err)
        return
    keep, p1 = res.keep, res.phase1_keep
    assert res.num_kept % multiple == 0
    assert bool((p1 & ~keep).sum() == 0)
    assert int((keep & ~p1).sum()) == res.num_refilled
    counts = {}
    for g, k in zip(gid.tolist(), keep.tolist()):
        counts[g] = counts.get(g, 0) + int(k)
    assert res.kept_per_group == dict(sorted(counts.items()))
    assert res.f1 == pytest.approx(sum(counts.values()) / len(counts)) and res.f2 == max(counts.values())
    # (2) with reference semantics a bucket is (group, rounded value)
    if semantics == "reference":
        buckets = {}
        for i, (g, a) in enumerate(zip(gid.tolist(), np.round(adv.numpy(), 4).tolist())):
            buckets.setdefault((g, a), []).append(i)
        assert len(buckets) == res.num_buckets
        for rows in buckets.values():
            assert any(p1[i] for i in rows)


@PROPERTY
@given(st.lists(st.integers(0, 3), min_size=2, max_size=12), st.data())
def test_property_paper_vs_reference_on_binary_similarities(classes, data):
    """With every similarity 0 or 1 (each response is one of a few disjoint token sets) and one
    bucket per group: for 0 < threshold < 1, `paper` keeps a subset of what `reference` keeps
    (paper keeps one response per distinct set, reference keeps every response that differs from
    the seed, duplicates among themselves included); for threshold 0 or 1 it is the other way
    round (reference never keeps at J = 0 < 0 / keeps J = 0 < 1 only, paper keeps J <= t)."""
    sets = {c: t(*range(10 * c, 10 * c + 3)) for c in range(4)}
    responses = [sets[c] for c in classes]
    n = len(classes)
    adv = torch.tensor(data.draw(st.lists(st.sampled_from([0.5, 0.25]), min_size=1, max_size=1)) * n)
    gid = torch.zeros(n, dtype=torch.int64)
    for threshold in (0.0, 0.2, 0.9, 1.0):
        ref = mdap_select(adv, gid, responses, similarity_threshold=threshold).phase1_keep
        pap = mdap_select(adv, gid, responses, similarity_threshold=threshold, semantics="paper").phase1_keep
        if 0 < threshold < 1:
            assert bool((pap & ~ref).sum() == 0)
            assert int(pap.sum()) == len(set(classes))
        else:
            assert bool((ref & ~pap).sum() == 0)


@PROPERTY
@given(batches(), st.floats(0, 1), st.floats(0, 1))
def test_property_reference_threshold_monotone(batch, t1, t2):
    """With reference semantics, raising the similarity threshold never drops a Phase-1 rollout."""
    adv, gid, responses = batch
    lo, hi = sorted((t1, t2))
    a = mdap_select(adv, gid, responses, similarity_threshold=lo).phase1_keep
    b = mdap_select(adv, gid, responses, similarity_threshold=hi).phase1_keep
    assert bool((a & ~b).sum() == 0)


@PROPERTY
@given(batches(), st.integers(0, 1000))
def test_property_group_relabeling(batch, offset):
    """Renaming group ids with an order-preserving map changes nothing but the dict keys."""
    adv, gid, responses = batch
    a = mdap_select(adv, gid, responses, multiple=1)
    b = mdap_select(adv, gid * 3 + offset, responses, multiple=1)
    assert a.keep.tolist() == b.keep.tolist()
    assert list(a.kept_per_group.values()) == list(b.kept_per_group.values())


# ---------------------------------------------------------------------------------------------
# exact kernels
# ---------------------------------------------------------------------------------------------


def _python_intersections(responses, group_sizes):
    out, start = [], 0
    for size in group_sizes:
        sets = [set(r.tolist()) for r in responses[start : start + size]]
        out.append([[len(a & b) for b in sets] for a in sets])
        start += size
    return out


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize(
    "group_sizes, low, high",
    [
        ([3, 1, 8, 2], 0, 20),  # small vocabulary: many shared items
        ([9, 17], 0, 40),  # more than 8 rows: several mask bytes
        ([70, 2], 0, 300),  # more than 64 rows: several mask words
        ([4, 5], -50, 50),  # negative ids
        ([6, 3], 2**40, 2**40 + 30),  # ids beyond a direct table (hashed kernel / renumbering)
    ],
)
def test_group_intersections_match_python_sets(backend, group_sizes, low, high):
    gen = np.random.default_rng(sum(group_sizes))
    responses = [torch.from_numpy(gen.integers(low, high, gen.integers(0, 25))) for _ in range(sum(group_sizes))]
    responses[1] = torch.zeros(0, dtype=torch.int64)  # an empty response
    flat, lengths = token_sets.flatten_responses(responses)
    inter = token_sets.group_intersections(flat, lengths, np.array(group_sizes), backend=backend)
    expected = _python_intersections(responses, group_sizes)
    for g, size in enumerate(group_sizes):
        assert inter[g, :size, :size].tolist() == expected[g]
        assert not inter[g, size:, :].any() and not inter[g, :, size:].any()


def test_numba_is_available_and_selected_by_default():
    assert token_sets.numba_available()  # numba is pinned in requirements.txt


def test_mdap_without_numba_gives_identical_results(monkeypatch):
    gen = np.random.default_rng(5)
    responses = [torch.from_numpy(gen.integers(0, 60, gen.integers(1, 40))) for _ in range(48)]
    gid = torch.from_numpy(np.repeat(np.arange(6), 8))
    adv = grpo_advantages(torch.from_numpy(gen.integers(0, 2, 48)).float(), gid)
    with_numba = mdap_select(adv, gid, responses, multiple=8)
    monkeypatch.setattr(token_sets, "_numba_kernels", lambda: None)
    without = mdap_select(adv, gid, responses, multiple=8)
    assert with_numba == without


# ---------------------------------------------------------------------------------------------
# baseline pruners
# ---------------------------------------------------------------------------------------------


def test_random_select_is_reproducible_and_per_group():
    gid = torch.tensor([0] * 8 + [1] * 5)
    adv = torch.arange(13, dtype=torch.float32)
    a = random_select(adv, gid, generator=torch.Generator().manual_seed(3), keep_ratio=0.5)
    b = random_select(adv, gid, generator=torch.Generator().manual_seed(3), keep_ratio=0.5)
    c = random_select(adv, gid, generator=torch.Generator().manual_seed(4), keep_ratio=0.5)
    assert a.keep.tolist() == b.keep.tolist()
    assert a.keep.tolist() != c.keep.tolist()
    assert a.kept_per_group == {0: 4, 1: 2}
    with pytest.raises(TypeError, match="torch.Generator"):
        random_select(adv, gid, generator=3)


def test_advantage_only_keeps_one_per_bucket():
    gid = torch.tensor([0] * 6 + [1] * 2)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0, 0.5, 0.0, 0.0])
    res = advantage_only_select(adv, gid, generator=torch.Generator().manual_seed(0), response_lengths=torch.arange(8))
    assert res.num_buckets == 4 and res.num_kept == 4
    keep = res.keep.tolist()
    assert sum(keep[0:2]) == 1 and sum(keep[2:5]) == 1 and keep[5] and sum(keep[6:8]) == 1
    assert res.total_tokens == 28
    res8 = advantage_only_select(adv, gid, generator=torch.Generator().manual_seed(0), multiple=8)
    assert res8.num_kept == 8


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, exc, match",
    [
        ((torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), [t(1)]), {}, ValueError, "responses` has 1 rows"),
        ((torch.tensor([1.0, 0.0]), torch.tensor([0]), [t(1), t(2)]), {}, ValueError, "group_ids` has 1 rows"),
        (
            (torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]), [t(1), t(2)]),
            {},
            ValueError,
            r"advantages\[1\]` is nan",
        ),
        ((torch.tensor([]), torch.tensor([], dtype=torch.int64), []), {}, ValueError, "empty"),
        (
            (torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), [t(1), t(2)]),
            {"multiple": 3},
            ValueError,
            r"multiple` \(3\) is larger than the batch \(2",
        ),
        ((torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), [t(1), t(2)]), {"multiple": 0}, ValueError, "multiple"),
        (
            (torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), [t(1), t(2)]),
            {"semantics": "exact"},
            ValueError,
            "semantics",
        ),
        ((torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), [t(1), t(2)]), {"refill": "greedy"}, ValueError, "refill"),
        (
            (torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), [t(1), t(2)]),
            {"similarity_threshold": 2},
            ValueError,
            "similarity_threshold",
        ),
        (
            (torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), [t(1), t(2)]),
            {},
            TypeError,
            "group_ids` must be integers",
        ),
        (
            (torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), [t(1), torch.ones(2, 2, dtype=torch.long)]),
            {},
            ValueError,
            r"responses\[1\]` must be a 1-D",
        ),
        (
            (torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), [t(1), torch.tensor([0.5])]),
            {},
            TypeError,
            r"responses\[1\]` must hold integer",
        ),
        (
            (torch.ones(2, 2), torch.tensor([0, 0]), [t(1), t(2)]),
            {},
            ValueError,
            "one scalar per rollout.*token_to_sequence",
        ),
        (
            (torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 4, dtype=torch.long)),
            {},
            ValueError,
            "unpadded 1-D",
        ),
    ],
)
def test_mdap_bad_input(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        mdap_select(*args, **kwargs)


def test_baseline_bad_input():
    adv, gid = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match="keep_ratio"):
        cppo_select(adv, gid, keep_ratio=0.0)
    with pytest.raises(ValueError, match="larger than the batch"):
        cppo_select(adv, gid, multiple=4)
    with pytest.raises(ValueError, match="response_lengths` has 3 rows"):
        cppo_select(adv, gid, response_lengths=torch.tensor([1, 2, 3]))


@pytest.mark.parametrize(
    "ngram, low, high",
    [(2, 0, 9), (3, -5, 5), (4, 0, 151_936), (2, 2**40, 2**40 + 6)],  # packed ids / iterative renumbering
)
def test_ngram_items_are_exact(ngram, low, high):
    gen = np.random.default_rng(ngram)
    rows = [gen.integers(low, high, gen.integers(0, 12)) for _ in range(30)]
    rows += [rows[0][::-1].copy(), np.concatenate([rows[1], rows[1]])]
    flat = np.concatenate(rows).astype(np.int64)
    items, counts = token_sets.ngram_items(flat, np.array([len(r) for r in rows]), ngram)
    assert counts.tolist() == [max(len(r) - ngram + 1, 0) for r in rows]
    grams = [tuple(r[p : p + ngram].tolist()) for r in rows for p in range(len(r) - ngram + 1)]
    assert len(grams) == len(items)
    id_of = {}
    for gram, item in zip(grams, items.tolist()):
        assert id_of.setdefault(gram, item) == item  # equal n-grams share an id
    assert len(set(id_of.values())) == len(id_of)  # different n-grams never do
