"""Worker of test_budget_dp: the pruning phase with pruning.drop_uniform_groups, zero_adv_kl=sample
and method=budget_stratified over DP ranks (issue 49)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fastrl.config import ParallelConfig

#: 8 groups of 4: groups 0, 3 and 6 uniform; group 5 holds two copies of one right answer
REWARDS = [[1, 1, 1, 1], [1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 0, 1], [1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]]


def responses() -> list[list[int]]:
    out = [[10 + i, 11 + i, 12 + i, 13 + i, 14 + i, 15 + i, 16 + i] for i in range(32)]
    out[21] = list(out[20])
    return out


def scored_rollouts(groups: list[int]):
    """The :class:`AdvantagedRollouts` of ``groups`` (GRPO advantages; group ids are global)."""
    from fastrl.algorithms.advantages import grpo_advantages
    from fastrl.rollout.engine import PromptInputs, RolloutPrompt, Rollouts
    from fastrl.training.rollout_batch import ScoredRollouts

    rows = [4 * g + j for g in groups for j in range(4)]
    resp = [responses()[i] for i in rows]
    ro = Rollouts(
        prompts=[RolloutPrompt(text=f"q{g}") for g in groups],
        prompt_inputs=[PromptInputs(input_ids=torch.tensor([1, 2 + g])) for g in groups],
        n_per_prompt=[4] * len(groups), prompt_index=[k for k in range(len(groups)) for _ in range(4)],
        response_token_ids=[torch.tensor(r) for r in resp], logprobs=[-torch.ones(len(r)) for r in resp],
        finish_reasons=["stop"] * len(rows), response_texts=[f"text {i}" for i in rows],
    )
    gid = torch.tensor(groups).repeat_interleave(4)
    r = torch.tensor([float(x) for g in groups for x in REWARDS[g]])
    scored = ScoredRollouts(
        ro, group_ids=gid, rewards=r, accuracy=r, valid=torch.ones(len(rows), dtype=torch.bool),
        formatted=torch.ones(len(rows), dtype=torch.bool),
    )
    return scored.with_advantages(grpo_advantages(r, gid))


def pruning_config():
    from recipes.registry import get_recipe

    base = get_recipe("easyvqa_tiny_budget_grpo_cpu")
    return dataclasses.replace(base, pruning=dataclasses.replace(
        base.pruning, budget_fraction=0.5, drop_uniform_groups=True, zero_adv_kl="sample", zero_adv_kl_samples=3))


def budget_worker(groups_of_rank: list[list[int]]) -> dict[str, Any]:
    """Prune this rank's groups with the whole DP group and return what it trains on."""
    from fastrl.distributed import parallel_state
    from fastrl.training.geometry import step_geometry
    from fastrl.training.prune_phase import prune, repartition_kept
    from fastrl.training.rollout_batch import to_policy_batch

    ctx = parallel_state.initialize(ParallelConfig(backend="gloo"), seed=1)
    cfg = pruning_config()
    scored = scored_rollouts(groups_of_rank[ctx.dp_rank])
    batch = to_policy_batch(scored, range(len(scored)), pad_token_id=0)
    outcome, metrics = prune(cfg, scored, batch, step=3, geometry=step_geometry(cfg, ctx.dp_size, 4))
    mine, _ = repartition_kept(batch, outcome)
    return {
        "dp_rank": ctx.dp_rank,
        "keep": outcome.keep,
        "selection": outcome.rule_keep,
        "group_ids": outcome.inputs.group_ids,
        "local_index": outcome.inputs.local_index,
        "input_ids": mine.input_ids,
        "advantages": mine.advantages,
        "kl_weights": mine.kl_weights,
        "group_of_row": mine.input_ids[:, 1] - 2,  # the prompt's second token is 2 + group
        "metrics": metrics,
    }
