"""MinHash sketches (approximate MDAP) and a realistic-size exactness check of the exact mode."""

import numpy as np
import pytest
import torch
from _mdap_reference import mdap_reference

from fastrl.algorithms.advantages import grpo_advantages
from fastrl.algorithms.minhash import ResponseSketch, estimate_jaccard, minhash_sketch
from fastrl.algorithms.pruning import jaccard, mdap_select


def _workload(num_groups=12, n=8, max_len=300, seed=0):
    """Groups of responses that copy one of a few "reasoning paths" with edits (near-duplicates)
    or follow another path (Jaccard near the 0.2 threshold)."""
    rng = np.random.default_rng(seed)
    responses, gids, rewards = [], [], []
    for g in range(num_groups):
        topic = rng.integers(0, 5000, 120)
        paths = []
        for _ in range(int(rng.integers(1, 4))):
            own = rng.integers(0, 5000, 400)
            length = int(rng.integers(max_len // 3, max_len))
            src = rng.random(length) < rng.uniform(0.4, 0.8)
            paths.append(
                (
                    np.where(src, topic[rng.integers(0, 120, length)], own[rng.integers(0, 400, length)]),
                    rng.random() < 0.5,
                )
            )
        for _ in range(n):
            tok, acc = paths[int(rng.integers(0, len(paths)))]
            tok = tok.copy()
            edit = rng.random(tok.size) < 0.1
            tok[edit] = rng.integers(0, 5000, int(edit.sum()))
            responses.append(torch.from_numpy(tok[: int(rng.integers(tok.size // 2, tok.size + 1))]))
            gids.append(g)
            rewards.append(float(acc) + 0.5 * (rng.random() < 0.8))
    gid = torch.tensor(gids)
    return grpo_advantages(torch.tensor(rewards), gid), gid, responses


@pytest.mark.parametrize("semantics", ["reference", "paper"])
@pytest.mark.parametrize("ngram", [1, 2])
def test_exact_mode_matches_python_sets_on_realistic_batch(semantics, ngram):
    adv, gid, responses = _workload()
    keep, phase1, nb = mdap_reference(
        adv.numpy(), gid.tolist(), responses, semantics=semantics, ngram=ngram, multiple=16
    )
    res = mdap_select(adv, gid, responses, semantics=semantics, ngram=ngram, multiple=16)
    assert res.keep.tolist() == keep and res.phase1_keep.tolist() == phase1 and res.num_buckets == nb
    assert 0 < int(res.phase1_keep.sum()) < len(responses)  # the workload exercises both outcomes


def test_sketch_basics():
    a = list(range(100))
    sk = minhash_sketch([a, a, list(range(1000, 1100)), [], []], num_bins=128)
    assert sk.signatures.dtype == np.uint16 and sk.signatures.shape == (5, 128)
    assert sk.bytes_per_rollout == 256 and sk.lengths.tolist() == [100, 100, 100, 0, 0]
    est = estimate_jaccard(sk.signatures[[0, 0, 3, 0]], sk.signatures[[1, 2, 4, 3]])
    assert est[0] == 1.0  # identical sets
    assert est[1] < 0.05  # disjoint sets: only 16-bit collisions
    assert est[2] == 1.0 and est[3] == 0.0  # empty/empty and empty/non-empty, as jaccard()


def test_sketch_estimates_jaccard():
    rng = np.random.default_rng(0)
    errors = []
    for _ in range(200):
        base = rng.integers(0, 20000, 600)
        other = np.concatenate([base[: int(rng.integers(0, 600))], rng.integers(0, 20000, int(rng.integers(0, 600)))])
        sk = minhash_sketch([base, other], num_bins=128, seed=7)
        errors.append(float(estimate_jaccard(sk.signatures[0], sk.signatures[1])) - jaccard(base, other))
    errors = np.abs(np.array(errors))
    assert errors.mean() < 0.035  # standard error ~ sqrt(J (1 - J) / 128) <= 0.044
    assert errors.max() < 0.15


def test_sketch_is_per_rollout_so_ranks_can_sketch_locally():
    _, _, responses = _workload(num_groups=4)
    whole = minhash_sketch(responses, ngram=2, seed=3)
    parts = [minhash_sketch(responses[i : i + 5], ngram=2, seed=3) for i in range(0, len(responses), 5)]
    joined = ResponseSketch.concat(parts)
    assert np.array_equal(joined.signatures, whole.signatures)
    assert np.array_equal(joined.lengths, whole.lengths)
    sig, lengths = whole.to_tensors()
    back = ResponseSketch.from_tensors(sig, lengths, ngram=2, seed=3)
    assert np.array_equal(back.signatures, whole.signatures)
    with pytest.raises(ValueError, match="seed"):
        ResponseSketch.concat([whole, minhash_sketch(responses[:2], ngram=2, seed=4)])


def test_mdap_on_sketches_agrees_with_exact_mode():
    adv, gid, responses = _workload(num_groups=24)
    exact = mdap_select(adv, gid, responses, multiple=16)
    approx = mdap_select(adv, gid, minhash_sketch(responses), multiple=16)
    agreement = float((exact.phase1_keep == approx.phase1_keep).double().mean())
    assert agreement >= 0.9
    assert approx.kept_tokens is not None and approx.total_tokens == exact.total_tokens
    with pytest.raises(ValueError, match="ngram=1 but mdap_select got ngram=2"):
        mdap_select(adv, gid, minhash_sketch(responses), ngram=2)
    with pytest.raises(ValueError, match="sketch has 5 rows"):
        mdap_select(adv, gid, minhash_sketch(responses[:5]))


def test_sketch_bad_input():
    with pytest.raises(ValueError, match="power of two"):
        minhash_sketch([[1]], num_bins=100)
    with pytest.raises(ValueError, match="ngram"):
        minhash_sketch([[1]], ngram=0)
    with pytest.raises(TypeError, match=r"responses\[0\]"):
        minhash_sketch([np.array([0.5])])
