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


def _padded(lengths, sizes):
    out, start = 0, 0
    for size in sizes:
        out += max(lengths[start : start + size]) * size
        start += size
    return out


def _fits(lengths, sizes, budget, cap, peak=None):
    start = 0
    for size in sizes:
        rows = lengths[start : start + size]
        if not (1 <= size <= cap and (size == 1 or sum(rows) <= budget)):
            return False
        if peak is not None and size * max(rows) > peak:
            return False
        start += size
    return start == len(lengths)


def _greedy(lengths, budget, cap):
    sizes, rows, tokens = [], 0, 0
    for length in lengths:
        if rows and (tokens + length > budget or rows >= cap):
            sizes.append(rows)
            rows = tokens = 0
        rows, tokens = rows + 1, tokens + length
    return [*sizes, rows]


def _peak(lengths, sizes):
    out, start = 0, 0
    for size in sizes:
        out = max(out, size * max(lengths[start : start + size]))
        start += size
    return out


def _compositions(n):
    if n == 0:
        yield []
        return
    for first in range(1, n + 1):
        for rest in _compositions(n - first):
            yield [first, *rest]


def test_token_budget_cut_is_the_fewest_padded_of_the_fewest_micro_batches():
    """The token-budget cut makes the fewest micro-batches that fit the budget and the row cap, and
    among those, with no micro-batch padded beyond the greedy fill's largest, the one with the
    fewest padded tokens: checked against every cut of random rows (sorted longest first as the
    passes run them, and unsorted).

    catches: the padded width taken from the micro-batch's first row (right only for sorted rows;
    tools/mutants.toml ``token-cut-first-row-width``), the padding ignored (the greedy fill,
    ``token-cut-greedy``), the count ignored (more micro-batches, ``token-cut-count-ignored``) and
    the peak unbounded (``token-cut-peak-unbounded``)."""
    import random

    rng = random.Random(0)
    # the greedy fill joins 3 to the 10 and 8; two micro-batches padded to 20 + 9 tokens, not 30 + 6
    assert G.token_micro_batches([10, 8, 3, 3, 3], 21) == [2, 3]
    # the fewest padded tokens alone, [1, 2, 5], would pad one micro-batch to 35 > the greedy fill's 28
    assert G.token_micro_batches([11, 8, 8, 7, 7, 4, 2, 1], 21, max_rows=5) == [2, 2, 4]
    for trial in range(400):
        n = rng.randint(1, 9)
        lengths = [rng.randint(1, 12) for _ in range(n)]
        if trial % 2:
            lengths.sort(reverse=True)
        budget, cap = rng.randint(8, 30), rng.randint(1, 5)
        peak = _peak(lengths, _greedy(lengths, budget, cap))
        sizes = G.token_micro_batches(lengths, budget, max_rows=cap)
        assert _fits(lengths, sizes, budget, cap, peak), (lengths, budget, cap, sizes)
        fewest = min(len(c) for c in _compositions(n) if _fits(lengths, c, budget, cap))
        assert len(sizes) == fewest, (lengths, budget, cap, sizes)
        allowed = [c for c in _compositions(n) if len(c) == fewest and _fits(lengths, c, budget, cap, peak)]
        assert _padded(lengths, sizes) == min(_padded(lengths, c) for c in allowed), (lengths, sizes)


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
    assert G.equal_micro_batches(pp) and G.kept_unit(pp, 2) == 2 * cfg.parallel.micro_batch_size


def test_update_plan_of_a_step():
    import dataclasses

    from recipes.registry import get_recipe

    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")  # 32 prompts / 16 per mini-batch: 2 updates, micro 16
    budget = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, micro_batch_tokens=10))
    plan = G.step_geometry(budget, 1, 8).plan_update([4, 4, 4, 9, 3], step=3)
    assert plan.update_rows == (3, 2) and plan.micro_batches == ((2, 1), (1, 1)) and plan.updates == 2
    assert plan.lr_positions == (5, 6)  # step 3 of U = 2 units per step ends at 6
    # no token budget: micro-batches of parallel.micro_batch_size rows (the last shorter)
    assert G.step_geometry(cfg, 1, 8).plan_update([5] * 20, step=1).micro_batches == ((10,), (10,))
    # the paper's mini-batch geometry: one update per mini-batch of 16 prompts x n / dp rows,
    # equal micro-batches (None: parallel.micro_batch_size rows each)
    paper = dataclasses.replace(cfg, pruning=dataclasses.replace(cfg.pruning, refill_to="mini_batch"))
    plan = G.step_geometry(paper, 1, 8).plan_update([5] * 128, step=1)
    assert plan.update_rows == (128,) and plan.micro_batches == (None,) and plan.lr_positions == (2,)
    ppo = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, ppo_epochs=2))
    assert G.step_geometry(ppo, 1, 8).plan_update([5] * 4, step=1).lr_positions == (1, 2, 3, 4)


def test_one_step_geometry_decides_the_cuts_and_the_dp_size():
    """:class:`StepGeometry` is the step's one source of the DP size, the kept-count rules, the
    old / reference passes' cut and the update plan (which hands the DP size to the actor).

    catches: the token-budget log-prob passes capped at ``micro_batch_size`` rows instead of
    ``log_prob_max_rows`` (``StepGeometry.log_prob_cut`` in ``fastrl/training/geometry.py``)."""
    import dataclasses

    from recipes.registry import get_recipe

    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    mbs = cfg.parallel.micro_batch_size
    budget = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, micro_batch_tokens=100_000))
    g = G.step_geometry(budget, 2, 8)
    assert (g.dp_size, g.n, g.kept_unit, g.refill_multiple) == (2, 8, 2, 2)
    assert g.log_prob_max_rows == G.LOG_PROB_MICRO_BATCH_FACTOR * mbs
    rows = 2 * g.log_prob_max_rows + mbs
    assert g.log_prob_cut([1] * rows) == [g.log_prob_max_rows, g.log_prob_max_rows, mbs]
    assert G.step_geometry(cfg, 2, 8).log_prob_cut([1] * rows) is None  # no token budget: micro_batch_size rows
    plan = g.plan_update([3] * 6, step=1)
    assert plan.dp_size == 2 and plan.update_rows == (3, 3)
    paper = G.step_geometry(dataclasses.replace(cfg, pruning=dataclasses.replace(cfg.pruning, refill_to="mini_batch")), 2, 8)
    assert paper.updates_per_pass is None and paper.mini_batch_rows == G.rank_mini_batch_rows(cfg, 2, 8)
    assert paper.kept_unit == 2 * mbs and paper.refill_multiple == cfg.update_multiple(2, n=8)
    with pytest.raises(ValueError, match="micro_batch_tokens=100000: must be >= 0, and 0 with equal micro-batches"):
        dataclasses.replace(g, equal_micro_batches=True)
    with pytest.raises(ValueError, match="exactly one of updates_per_pass"):
        dataclasses.replace(g, mini_batch_rows=4)
    with pytest.raises(ValueError, match="dp_size must be >= 1, got 0"):
        dataclasses.replace(g, dp_size=0)
    with pytest.raises(ValueError, match="dp_size >= 1 and n >= 1"):
        G.step_geometry(cfg, 0, 8)


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


def test_rows_are_grouped_by_length_within_each_update():
    """Each update keeps its rows; inside it they run longest first, so the token-budget cut packs
    rows of similar length and the padding the passes compute on shrinks.

    catches: sorting across updates (``length_grouped_order`` over all rows: a row changes
    mini-batch), the micro-batch cut computed on the unsorted lengths, the sort dropped."""
    import dataclasses

    from recipes.registry import get_recipe

    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")  # 2 updates per step
    budget = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, micro_batch_tokens=12))
    lens = [2, 9, 3, 8, 10, 1, 7]
    plan = G.step_geometry(budget, 1, 8).plan_update(lens, step=1)
    assert plan.update_rows == (4, 3)
    assert plan.row_order == (1, 3, 2, 0, 4, 6, 5)  # [9, 8, 3, 2] and [10, 7, 1]: rows stay in their update
    # cut over the sorted lengths: [9], [8], [3, 2] (padded to 23 tokens, not [9], [8, 3], [2]'s 27); [10], [7, 1]
    assert plan.micro_batches == ((1, 1, 2), (1, 2))
    assert G.length_grouped_order([1, 5, 5, 2], [4]) == [1, 2, 3, 0]  # ties keep their order
    off = dataclasses.replace(budget, trainer=dataclasses.replace(budget.trainer, group_by_length=False))
    assert G.step_geometry(off, 1, 8).plan_update(lens, step=1).row_order == tuple(range(7))  # the ablation
    with pytest.raises(ValueError, match="do not split"):
        G.length_grouped_order([1, 2, 3], [2])
    # padding: micro-batches of two rows at their own longest row
    assert G.padded_token_share([2, 9, 3, 8], [2, 2]) == (22, 34)
    order = G.length_grouped_order([2, 9, 3, 8], [4])
    assert G.padded_token_share([[2, 9, 3, 8][i] for i in order], [2, 2]) == (22, 24)
    assert G.padded_token_share([2, 9, 3, 8], [2, 2], multiple=16) == (22, 64)  # FP8: each at 16 columns
    with pytest.raises(ValueError, match="do not split"):
        G.padded_token_share([1, 2], [3])


def test_old_log_probs_setting_is_checked():
    """``trainer.old_log_probs=engine`` with log-probs before pruning is refused; the on-policy
    first update is used exactly when the old log-probs are not needed before the advantages.

    catches: ``on_policy_first_update`` true with ``algorithm.kl_in_reward`` (the KL penalty would
    read placeholder old log-probs), or true under ``recompute``."""
    import dataclasses

    from fastrl.config import ConfigError
    from recipes.registry import get_recipe

    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    assert cfg.trainer.old_log_probs == "auto" and cfg.on_policy_first_update

    def with_(trainer=None, algorithm=None):
        return dataclasses.replace(
            cfg, trainer=dataclasses.replace(cfg.trainer, **(trainer or {})),
            algorithm=dataclasses.replace(cfg.algorithm, **(algorithm or {})),
        )

    assert not with_(trainer={"old_log_probs": "recompute"}).on_policy_first_update
    assert with_(trainer={"old_log_probs": "engine"}).on_policy_first_update
    assert not with_(algorithm={"kl_in_reward": True, "use_kl_loss": False}).on_policy_first_update
    assert not with_(trainer={"logprobs_before_pruning": True}).on_policy_first_update
    with pytest.raises(ConfigError, match="old_log_probs='engine'"):
        with_(trainer={"old_log_probs": "engine", "logprobs_before_pruning": True})
