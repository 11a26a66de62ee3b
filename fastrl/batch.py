"""The tensors the actor consumes: prompt + response token rows, masks, and images.

Layout: one row per rollout, right-padded: ``[prompt tokens | response tokens | padding]``. Every
per-token quantity (log-probs, advantages when per token, masks) is a [N, T] tensor aligned with
``input_ids``: column ``t`` belongs to token ``input_ids[:, t]`` (its log-prob is predicted from
the tokens before it, so column 0 is never a response token).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator, Sequence

import torch


@dataclass
class PolicyBatch:
    """Rollouts as model input.

    Attributes:
        input_ids: int64 [N, T], right-padded.
        attention_mask: bool [N, T], True on real (prompt or response) tokens.
        response_mask: bool [N, T], True on response tokens (what the loss sees).
        pixel_values: per rollout, the flattened image patches of its images (float
            [patches, C x temporal x patch x patch] as the Qwen2.5-VL processor makes them) or None
            for a text-only rollout; None for a text-only model.
        image_grid_thw: per rollout, int64 [images, 3] (temporal, height, width patches) or None.
        tensors: extra per-rollout tensors (first dimension N): advantages, old / reference /
            engine log-probs, ...
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    pixel_values: list[torch.Tensor | None] | None = None
    image_grid_thw: list[torch.Tensor | None] | None = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n, t = self.input_ids.shape
        for name in ("attention_mask", "response_mask"):
            if getattr(self, name).shape != (n, t):
                raise ValueError(f"PolicyBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected {(n, t)}")
        for name in ("pixel_values", "image_grid_thw"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"PolicyBatch.{name} has {len(value)} entries for {n} rollouts")
        for key, value in self.tensors.items():
            if value.shape[0] != n:
                raise ValueError(f"PolicyBatch.tensors[{key!r}] has first dimension {value.shape[0]}, expected {n}")

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_length(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def lengths(self) -> torch.Tensor:
        """int64 [N]: real tokens per rollout (prompt + response): the token load of a rollout."""
        return self.attention_mask.sum(dim=1).to(torch.int64)

    def select(self, index: Sequence[int] | torch.Tensor) -> "PolicyBatch":
        """The rollouts at ``index`` (in that order)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        pick = lambda xs: None if xs is None else [xs[int(i)] for i in idx]  # noqa: E731
        return PolicyBatch(
            input_ids=self.input_ids[idx],
            attention_mask=self.attention_mask[idx],
            response_mask=self.response_mask[idx],
            pixel_values=pick(self.pixel_values),
            image_grid_thw=pick(self.image_grid_thw),
            tensors={k: v[idx] for k, v in self.tensors.items()},
        )

    def to(self, device: torch.device | str) -> "PolicyBatch":
        """The batch on ``device`` (every tensor, images included); ``self`` when already there."""
        device = torch.device(device)
        if self.input_ids.device == device:
            return self
        move = lambda xs: None if xs is None else [None if x is None else x.to(device) for x in xs]  # noqa: E731
        return PolicyBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            response_mask=self.response_mask.to(device),
            pixel_values=move(self.pixel_values),
            image_grid_thw=move(self.image_grid_thw),
            tensors={k: v.to(device) for k, v in self.tensors.items()},
        )

    def with_tensors(self, **tensors: torch.Tensor) -> "PolicyBatch":
        """A copy with ``tensors`` added (or replaced)."""
        return replace(self, tensors={**self.tensors, **tensors})

    def micro_batches(self, size: int) -> Iterator["PolicyBatch"]:
        """Consecutive micro-batches of ``size`` rollouts.

        Raises:
            ValueError: ``len(self)`` is not a multiple of ``size`` (pipeline schedules need equal
                micro-batches; the refill makes the kept batch a multiple).
        """
        if size < 1 or len(self) % size:
            raise ValueError(f"{len(self)} rollouts cannot be split into micro-batches of {size}")
        for start in range(0, len(self), size):
            yield self.select(range(start, start + size))

    def model_inputs(self) -> dict[str, torch.Tensor | None]:
        """Keyword arguments of the megatron model's forward (images concatenated over rollouts)."""
        n, t = self.input_ids.shape
        inputs: dict[str, torch.Tensor | None] = {
            "input_ids": self.input_ids,
            "position_ids": torch.arange(t, dtype=torch.long, device=self.input_ids.device).expand(n, t),
            "attention_mask": None,
        }
        if self.image_grid_thw is not None:
            pixels = [p for p in (self.pixel_values or []) if p is not None]
            grids = [g for g in self.image_grid_thw if g is not None]
            inputs["pixel_values"] = torch.cat(pixels) if pixels else None
            inputs["image_grid_thw"] = torch.cat(grids) if grids else None
        return inputs
