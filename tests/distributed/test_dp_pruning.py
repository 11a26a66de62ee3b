"""DP-global pruning: identical keep masks, equal to single-process pruning, balanced re-partition."""

from __future__ import annotations

import pytest
import torch
from launcher import run_distributed
from workers import make_rollouts, pruning_worker

from fastrl.algorithms.minhash import minhash_sketch
from fastrl.algorithms.prune_weights import bucket_size_weights
from fastrl.algorithms.pruning import mdap_select

pytestmark = pytest.mark.distributed


def _check(results, num_groups, n, multiple, mode, weighted=False):
    batch, group_ids, advantages, responses = make_rollouts(num_groups, n)
    sketch = responses if mode == "exact" else minhash_sketch(responses, num_bins=64)
    expected = mdap_select(advantages, group_ids, sketch, multiple=multiple).keep
    trained = advantages * bucket_size_weights(advantages, group_ids, expected).double() if weighted else advantages
    assert 0 < int(expected.sum()) < len(batch)  # the batch really is pruned
    for r in results:
        assert torch.equal(r["keep"], expected)
        torch.testing.assert_close(r["logged_advantages"], advantages.double())
    # one share per DP rank (TP peers hold the same share)
    shares = {}
    for r in results:
        if r["dp_rank"] in shares:
            assert torch.equal(shares[r["dp_rank"]]["input_ids"], r["input_ids"])
        shares[r["dp_rank"]] = r
    dp = len(shares)
    counts = [len(shares[k]["input_ids"]) for k in range(dp)]
    assert counts == [int(expected.sum()) // dp] * dp and counts[0] > 0
    lengths = batch.lengths[expected]
    mean = float(lengths.sum()) / dp
    for k in range(dp):
        assert abs(int(shares[k]["lengths"].sum()) - mean) <= int(lengths.max())
    # together the shares are exactly the kept rollouts, each once, with their own advantages
    got = sorted((tuple(row[row != 0].tolist()), float(a)) for k in range(dp) for row, a in zip(shares[k]["input_ids"], shares[k]["advantages"]))
    want = sorted((tuple(row[row != 0].tolist()), float(a)) for row, a in zip(batch.input_ids[expected], trained[expected]))
    assert [g[0] for g in got] == [w[0] for w in want]
    torch.testing.assert_close(torch.tensor([g[1] for g in got]), torch.tensor([w[1] for w in want]))
    return expected, trained[expected]


@pytest.mark.parametrize(
    "world, tp, mode",
    [
        pytest.param(2, 1, "exact", id="dp2-exact"),
        pytest.param(4, 1, "minhash", id="dp4-minhash"),
        pytest.param(4, 2, "exact", id="tp2xdp2-exact"),  # partition count is DP (2), not world (4)
    ],
)
def test_dp_global_pruning_matches_single_process(world, tp, mode):
    multiple = world // tp
    results = run_distributed(pruning_worker, world, tp, 6, 4, multiple, mode)
    _check(results, 6, 4, multiple, mode)


def test_nine_rollouts_over_four_ranks_leave_no_rank_empty():
    """9 rollouts (3 groups of 3) on 4 DP ranks (3, 2, 2, 2), refill multiple 4."""
    results = run_distributed(pruning_worker, 4, 1, 3, 3, 4, "exact")
    _check(results, 3, 3, 4, "exact")
    assert all(len(r["input_ids"]) >= 1 for r in results)


def test_bucket_size_weights_travel_with_their_rollouts():
    """Each rank scales its own rows by the global weights; after the re-partition every kept
    rollout carries advantage x weight, and each group's kept advantages sum to 0 again."""
    results = run_distributed(pruning_worker, 2, 1, 6, 4, 2, "exact", True)
    keep, trained = _check(results, 6, 4, 2, "exact", weighted=True)
    _, group_ids, advantages, _ = make_rollouts(6, 4)
    sums = torch.zeros(6, dtype=torch.float64).index_add_(0, group_ids[keep], trained)
    torch.testing.assert_close(sums, torch.zeros(6, dtype=torch.float64), atol=1e-6, rtol=0)
    unweighted = torch.zeros(6, dtype=torch.float64).index_add_(0, group_ids[keep], advantages[keep])
    assert unweighted.abs().max() > 0.1  # without the weights the kept set is not zero-sum
