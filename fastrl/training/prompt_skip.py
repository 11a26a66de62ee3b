"""GRESO-style prompt skipping in the step (``pruning.method='greso'``): drop prompts before
generation from their zero-variance history, and record every generated group's rewards.

The :class:`~fastrl.algorithms.prompt_skipping.PromptSkipper` is part of the run's
``TrainState`` (``prompt_skipper``, built by :func:`build_prompt_skipper`), so a checkpoint
restores it. Every DP rank records the same
observations (gathered over DP), so every rank holds the same state.
"""

from __future__ import annotations

import torch

from fastrl.algorithms.prompt_skipping import PromptSkipper
from fastrl.config import RunConfig
from fastrl.distributed import collectives
from fastrl.training.seeds import derive_seed

Metrics = dict[str, float]


def build_prompt_skipper(cfg: RunConfig) -> PromptSkipper | None:
    """A new prompt skipper from ``pruning.greso_*``; None unless ``pruning.method='greso'``."""
    pc = cfg.pruning
    if pc.method != "greso":
        return None
    return PromptSkipper(explore_prob=pc.greso_explore_prob, max_skip_fraction=pc.greso_max_skip_fraction)


def skip_prompts(skipper: PromptSkipper, items: list, *, seed: int, step: int, dp_rank: int) -> tuple[list, Metrics]:
    """This rank's ``(group id, record)`` items that are generated (at least one is kept)."""
    gen = torch.Generator().manual_seed(derive_seed(seed, step, dp_rank))
    mask = skipper.skip_mask([rec.question_id for _, rec in items], gen)
    kept = [it for it, skip in zip(items, mask) if not skip] or items[:1]
    skipped = len(items) - len(kept)
    total = collectives.all_reduce_sum_dp(torch.tensor([float(skipped), float(len(items))], dtype=torch.float64))
    return kept, {"greso/skipped_prompts": float(total[0]), "greso/skipped_fraction": float(total[0] / max(total[1], 1))}


def record_rewards(skipper: PromptSkipper, items: list, group_ids: torch.Tensor, rewards: torch.Tensor) -> None:
    """Record each generated group's rewards (gathered over DP: the same state on every rank)."""
    qid = {int(g): rec.question_id for g, rec in items}
    local = [(qid[int(g)], rewards[group_ids == g].tolist()) for g in torch.unique(group_ids).tolist() if int(g) in qid]
    pairs = [p for part in collectives.all_gather_objects_dp(local) for p in part]
    skipper.record([q for q, _ in pairs], [r for _, r in pairs])
