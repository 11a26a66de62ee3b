"""One training step's data path on every rank (importable by spawned processes): prompts sliced
over DP, rollouts of a fixed stand-in engine, a stub grader, GRPO advantages, DP-global pruning
(``prune()``), the re-partition, and the PPO loss of the kept rows (``Actor.micro_batch_loss``
under log-probs fixed per rollout). No model: the same global rollouts on 1 or 2 ranks."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import torch

PROMPTS, N = 4, 4


def _response(question: int, k: int) -> list[int]:
    g = torch.Generator().manual_seed(1000 * question + k)
    return torch.randint(10, 16, (2 + (question + 3 * k) % 5,), generator=g).tolist()


def _reward(question: int, k: int) -> float:
    return ((question + 1) * (k + 1) % 3) / 2  # varied: 0, 0.5 or 1, a different mix per prompt


class _Sampler:
    def next_batch(self, count: int):
        return types.SimpleNamespace(indices=list(range(count)), epochs_completed=0)


class _Scorer:
    def __init__(self) -> None:
        self.last_stats = types.SimpleNamespace(as_metrics=dict)

    def score(self, texts, truths):
        from fastrl.rewards.result import RewardResult

        out = []
        for text in texts:
            q, k = map(int, text.split(":"))
            r = _reward(q, k)
            out.append(RewardResult(overall=r, format=0.0, accuracy=float(r == 1.0)))
        return out


def dp_step_worker(distributed: bool) -> dict[str, Any]:
    """The step on this rank; ``distributed``: in a gloo process group (DP = world size), else one
    process without any group. Rows are named ``"question:k"`` (the same on any number of ranks)."""
    from fastrl.algorithms.losses import loss_denominator
    from fastrl.data import Record
    from fastrl.distributed import collectives
    from fastrl.rollout.engine import PromptInputs, RolloutPrompt, Rollouts
    from fastrl.training.actor import Actor
    from fastrl.training.geometry import step_geometry
    from fastrl.training.prompting import PromptSource
    from fastrl.training.prune_phase import prune, repartition_kept
    from fastrl.training.rollout_batch import to_policy_batch
    from fastrl.training.scoring import compute_advantages, score
    from recipes.registry import get_recipe

    dp_size, dp_rank = 1, 0
    if distributed:
        from workers import _init

        _, ctx = _init(1, 1)
        dp_size, dp_rank = ctx.dp_size, ctx.dp_rank
    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")  # importance-weighted MDAP, reference semantics
    cfg = dataclasses.replace(cfg, pruning=dataclasses.replace(cfg.pruning, similarity_threshold=0.0))
    records = [Record(question_id=q, problem=f"q{q}", answer="a") for q in range(PROMPTS)]
    source = PromptSource(records, template="{{ problem }}", tokenizer=None, image_size=None)
    prompts = source.next_batch(_Sampler(), PROMPTS, dp_size=dp_size, dp_rank=dp_rank)
    questions = [rec.question_id for _, rec in prompts.items]
    names = [f"{q}:{k}" for q in questions for k in range(N)]
    responses = [_response(q, k) for q in questions for k in range(N)]
    rollouts = Rollouts(
        prompts=[RolloutPrompt(text=f"q{q}") for q in questions],
        prompt_inputs=[PromptInputs(input_ids=torch.tensor([3, 4 + q])) for q in questions],
        n_per_prompt=[N] * len(questions), prompt_index=[i for i in range(len(questions)) for _ in range(N)],
        response_token_ids=[torch.tensor(r) for r in responses], logprobs=[-0.1 * torch.ones(len(r)) for r in responses],
        finish_reasons=["stop"] * len(names), response_texts=names,
    )
    scored, _ = score(_Scorer(), prompts, rollouts, cfg)
    advantaged, adv_metrics = compute_advantages(scored, cfg.algorithm, step=1)
    batch = to_policy_batch(advantaged, range(len(names)), pad_token_id=0)
    geometry = step_geometry(cfg, dp_size, N)
    if not distributed:  # the DP=2 run's kept-count rules, so that both runs keep alike
        geometry = dataclasses.replace(geometry, refill_multiple=2, kept_unit=2)
    outcome, metrics = prune(cfg, advantaged, batch, step=1, geometry=geometry)
    kept, _ = repartition_kept(batch, outcome)
    # the loss of the kept rows under log-probs that depend on each row's tokens only
    old = kept.engine_log_probs.float()
    new = old + 0.05 * torch.sin(kept.input_ids.float()) * kept.response_mask
    actor = Actor.__new__(Actor)
    actor.algorithm = cfg.algorithm
    mb = kept.with_tensors(old_log_probs=old, ref_log_probs=old - 0.02 * kept.response_mask)  # KL loss: a reference
    den = collectives.all_reduce_sum_dp(loss_denominator(mb.response_mask, actor.agg_mode))
    loss, _ = actor.micro_batch_loss(mb, new, den)
    total = collectives.all_reduce_sum_dp(loss.detach().double().reshape(1))
    trained = sorted((tuple(row[m].tolist()), round(float(a), 6))
                     for row, m, a in zip(kept.input_ids, kept.response_mask, kept.advantages))
    return {
        "kept": sorted(n for n, k in zip(names, outcome.keep[outcome.inputs.rows_of(dp_rank)].tolist()) if k),
        "advantages": {n: float(a) for n, a in zip(names, advantaged.advantages)},
        "trained": trained,
        "metrics": {**metrics, **adv_metrics},
        "loss": float(total[0]),
    }
