"""The issue-49 rules over two DP ranks: the same decision per rollout as one process holding every
group in another order, and the advantage and KL weights travel with their rollouts through the
re-partition."""

from __future__ import annotations

import pytest
import torch
from budget_workers import budget_worker, pruning_config, scored_rollouts
from launcher import run_distributed

from fastrl.training.pruner import select_step
from fastrl.training.seeds import derive_seed

pytestmark = pytest.mark.distributed


def test_budget_rule_and_kl_sample_over_two_dp_ranks():
    """catches: a decision that depends on the DP layout (row-position draws), or KL / advantage
    weights that do not follow their rollouts to the rank that trains them."""
    two = run_distributed(budget_worker, 2, [[0, 2, 4, 6], [1, 3, 5, 7]])
    # one process, the groups in natural order, the same refill multiple (2) and step seed
    cfg = pruning_config().pruning
    scored = scored_rollouts(list(range(8)))
    one = select_step(cfg, scored.advantages.float(), scored.group_ids, list(scored.rollouts.response_token_ids),
                      response_lengths=scored.response_lengths, multiple=2,
                      generator=torch.Generator().manual_seed(derive_seed(cfg.seed, 3)))
    want = {(int(g), i % 4): bool(k) for i, (g, k) in enumerate(zip(scored.group_ids, one.result.keep))}
    for r in two:
        got = {(int(g), int(i) % 4): bool(k) for g, i, k in zip(r["group_ids"], r["local_index"], r["keep"])}
        assert got == want
    kept = [(int(g), float(a), float(w)) for r in two for g, a, w in zip(r["group_of_row"], r["advantages"], r["kl_weights"])]
    assert len(kept) == int(one.result.keep.sum()) and len(two[0]["input_ids"]) == len(two[1]["input_ids"])
    sampled = [k for k in kept if k[2] != 1.0]
    assert len(sampled) == 3 and all(g in (0, 3, 6) and a == 0.0 and w == pytest.approx(12 / 3) for g, a, w in sampled)
    refilled = [k for k in kept if k[0] in (0, 3, 6) and k[2] == 1.0]
    assert len(refilled) <= 1  # at most dp_size - 1 rows of Phase 2 refill
    for g in (1, 2, 4, 5, 7):  # the weighted advantages of every mixed group sum to 0
        assert sum(a for gg, a, _ in kept if gg == g) == pytest.approx(0.0, abs=1e-5)
    assert two[0]["metrics"]["prune/uniform_groups"] == 3 and two[0]["metrics"]["prune/duplicate_rows"] == 1
