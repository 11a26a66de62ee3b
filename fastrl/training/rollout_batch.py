"""A step's rollouts with their rewards and advantages, and their conversion to a PolicyBatch.

Group ids are positions in the step's *global* prompt batch, so they are unique across DP ranks
(every rank draws the same global batch from the sampler and generates its own slice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fastrl.rollout.engine import Rollouts
from fastrl.training.policy_batch import PolicyBatch


@dataclass
class ScoredRollouts:
    """Rollouts of one rank with per-rollout scores.

    Attributes:
        rollouts: the engine's output (prompt ``i``'s responses consecutive).
        group_ids: int64 [R], global group (prompt) id of each rollout.
        rewards / accuracy: float32 [R] (0 where grading failed).
        valid: bool [R], False where grading failed (excluded from advantage statistics).
        formatted: bool [R], format reward earned.
        advantages: float32 [R], filled by the advantage estimator.
    """

    rollouts: Rollouts
    group_ids: torch.Tensor
    rewards: torch.Tensor
    accuracy: torch.Tensor
    valid: torch.Tensor
    formatted: torch.Tensor
    advantages: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.rollouts)

    @property
    def response_lengths(self) -> torch.Tensor:
        """int64 [R]: response tokens (stop token included)."""
        return torch.tensor(self.rollouts.lengths, dtype=torch.long)


def to_policy_batch(scored: ScoredRollouts, rows: Sequence[int], *, pad_token_id: int) -> PolicyBatch:
    """Rows ``rows`` of ``scored`` as right-padded ``[prompt | response | pad]`` model input.

    Tensors: ``advantages`` float32 [N], ``engine_log_probs`` float32 [N, T] (aligned with
    ``input_ids``: column ``t`` is the log-prob of token ``t``; 0 outside responses), ``group_ids``.
    """
    ro = scored.rollouts
    seqs, starts, pixels, grids = [], [], [], []
    for r in rows:
        p = ro.prompt_inputs[ro.prompt_index[r]]
        resp = ro.response_token_ids[r]
        seqs.append(torch.cat([p.input_ids, resp]))
        starts.append((p.input_ids.numel(), resp.numel()))
        pixels.append(p.pixel_values)
        grids.append(p.image_grid_thw)
    longest = max(int(s.numel()) for s in seqs)
    n = len(seqs)
    ids = torch.full((n, longest), pad_token_id, dtype=torch.long)
    attn = torch.zeros((n, longest), dtype=torch.bool)
    resp_mask = torch.zeros((n, longest), dtype=torch.bool)
    engine_lp = torch.zeros((n, longest), dtype=torch.float32)
    for b, (seq, (plen, rlen), r) in enumerate(zip(seqs, starts, rows)):
        ids[b, : seq.numel()] = seq
        attn[b, : seq.numel()] = True
        resp_mask[b, plen : plen + rlen] = True
        engine_lp[b, plen : plen + rlen] = ro.logprobs[r]
    index = torch.as_tensor(list(rows), dtype=torch.long)
    has_images = any(p is not None for p in pixels)
    tensors = {"engine_log_probs": engine_lp, "group_ids": scored.group_ids[index]}
    if scored.advantages is not None:
        tensors["advantages"] = scored.advantages[index].float()
    return PolicyBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp_mask,
        pixel_values=pixels if has_images else None,
        image_grid_thw=grids if has_images else None,
        tensors=tensors,
    )
