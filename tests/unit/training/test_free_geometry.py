"""The free update geometry (pruning.refill_to='free'): kept multiple, update shares, token-budget
micro-batches, LR-schedule length, and the dispatch of the peer selectors."""

from __future__ import annotations

import pytest
import torch

from fastrl.training import geometry as G
from fastrl.training.pruner import select_rollouts


def test_update_shares():
    assert G.update_shares(56, 2) == [28, 28]
    assert G.update_shares(57, 2) == [29, 28]
    assert G.update_shares(3, 4) == [1, 1, 1]          # fewer rows than updates: one row each
    assert G.update_shares(12, 2, micro=4) == [8, 4]   # whole micro-batches with pipeline parallelism
    with pytest.raises(ValueError):
        G.update_shares(10, 2, micro=4)


def test_token_micro_batches():
    assert G.token_micro_batches([5, 5, 5, 5], 10) == [2, 2]
    assert G.token_micro_batches([5, 20, 3, 3], 10) == [1, 1, 2]  # a long rollout alone
    assert G.token_micro_batches([1, 1, 1, 1, 1], 100, max_rows=2) == [2, 2, 1]
    assert G.token_micro_batches(torch.tensor([4, 4, 4]), 0, max_rows=2) == [2, 1]
    assert sum(G.token_micro_batches(list(range(1, 40)), 37)) == 39
    assert G.token_micro_batches([], 10) == []


def test_free_and_mini_batch_geometry_multiples():
    import dataclasses

    from recipes.registry import get_recipe

    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    assert cfg.pruning.refill_to == "free"  # the default
    assert get_recipe("easyvqa_tiny_fastrl_refill_grpo_cpu").pruning.refill_to == "mini_batch"  # the paper's
    assert G.refill_multiple(cfg, 1, 8) == 1 and G.refill_multiple(cfg, 4, 8) == 4
    assert G.kept_unit(cfg, 2) == 2
    assert G.updates_per_pass(cfg) == cfg.rollout.prompts_per_step // cfg.trainer.mini_batch_prompts
    old = dataclasses.replace(cfg, pruning=dataclasses.replace(cfg.pruning, refill_to="mini_batch"))
    assert G.refill_multiple(old, 1, 8) == cfg.update_multiple(1, n=8)
    assert G.kept_unit(old, 2) == 2 * cfg.parallel.micro_batch_size
    pp = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, pipeline_model_parallel_size=2))
    assert G.equal_micro_batches(pp) and G.kept_multiple(pp, 2) == 2 * cfg.parallel.micro_batch_size


def test_update_plan_of_a_step():
    import dataclasses

    from recipes.registry import get_recipe

    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")  # 32 prompts / 16 per mini-batch: 2 updates, micro 16
    budget = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, micro_batch_tokens=10))
    plan = G.plan_update(budget, [4, 4, 4, 9, 3], n=8, dp_size=1, step=3)
    assert plan.update_rows == (3, 2) and plan.micro_batches == ((2, 1), (1, 1)) and plan.updates == 2
    assert plan.lr_positions == (5, 6)  # step 3 of U = 2 units per step ends at 6
    # no token budget: micro-batches of parallel.micro_batch_size rows (the last shorter)
    assert G.plan_update(cfg, [5] * 20, n=8, dp_size=1, step=1).micro_batches == ((10,), (10,))
    # the paper's mini-batch geometry: one update per mini-batch of 16 prompts x n / dp rows,
    # equal micro-batches (None: parallel.micro_batch_size rows each)
    paper = dataclasses.replace(cfg, pruning=dataclasses.replace(cfg.pruning, refill_to="mini_batch"))
    plan = G.plan_update(paper, [5] * 128, n=8, dp_size=1, step=1)
    assert plan.update_rows == (128,) and plan.micro_batches == (None,) and plan.lr_positions == (2,)
    ppo = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, ppo_epochs=2))
    assert G.plan_update(ppo, [5] * 4, n=8, dp_size=1, step=1).lr_positions == (1, 2, 3, 4)


@pytest.mark.parametrize("method", ["pods", "zero_adv_skip", "fastrl_unbiased", "greso", "cppo", "random"])
def test_dispatch_of_every_method(method):

    from fastrl.config import PruningConfig

    g = torch.Generator().manual_seed(0)
    gid = torch.arange(4).repeat_interleave(4)
    rewards = torch.randint(0, 2, (16,), generator=g).double()
    from fastrl.algorithms import grpo_advantages

    adv = grpo_advantages(rewards, gid).float()
    responses = [torch.randint(10, 14, (int(torch.randint(2, 8, (1,), generator=g)),), generator=g) for _ in range(16)]
    cfg = PruningConfig(method=method)
    r = select_rollouts(cfg, adv, gid, responses, multiple=2, generator=torch.Generator().manual_seed(1))
    assert r.num_kept % 2 == 0 or method == "greso"
    assert sum(r.kept_per_group.values()) == r.num_kept
    if method == "greso":
        assert r.num_kept == 16  # pre-rollout skipping: every generated rollout trains
