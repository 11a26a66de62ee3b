"""The tensors the actor consumes: prompt + response token rows, masks, and images.

Layout: one row per rollout, right-padded: ``[prompt tokens | response tokens | padding]``. Every
per-token quantity (log-probs, advantages when per token, masks) is a [N, T] tensor aligned with
``input_ids``: column ``t`` belongs to token ``input_ids[:, t]`` (its log-prob is predicted from
the tokens before it, so column 0 is never a response token).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import torch

#: The optional per-rollout tensors of a :class:`PolicyBatch` (first dimension N), in field order.
ROW_TENSORS = ("group_ids", "advantages", "kl_weights", "engine_log_probs", "old_log_probs", "ref_log_probs")

#: Those of them that are per token, [N, T] aligned with ``input_ids``.
TOKEN_TENSORS = ("engine_log_probs", "old_log_probs", "ref_log_probs")


@dataclass(frozen=True)
class PolicyBatch:
    """Rollouts as model input. Immutable: a phase that adds a tensor returns a new batch
    (:meth:`with_tensors`); the tensors are shared, never written in place.

    Attributes:
        input_ids: int64 [N, T], right-padded.
        attention_mask: bool [N, T], True on real (prompt or response) tokens.
        response_mask: bool [N, T], True on response tokens (what the loss sees).
        pixel_values: per rollout, the flattened image patches of its images (float
            [patches, C x temporal x patch x patch] as the Qwen2.5-VL processor makes them) or None
            for a text-only rollout; None for a text-only model.
        image_grid_thw: per rollout, int64 [images, 3] (temporal, height, width patches) or None.
        group_ids: int64 [N], the global group (prompt) id of each rollout, or None.
        advantages: float32 [N], one advantage per rollout, or None (before the advantages).
        kl_weights: float32 [N], a weight on each rollout's KL-loss terms, or None (all 1):
            ``pruning.zero_adv_kl='sample'`` (:func:`fastrl.algorithms.budget_select.kl_sample`).
        engine_log_probs: float32 [N, T], the rollout engine's log-probs of the sampled tokens (0
            outside responses), or None.
        old_log_probs: float32 [N, T], the trainer's log-probs before the update (the PPO ratio's
            denominator), or None (before :func:`fastrl.training.update_phase.add_log_probs`).
        ref_log_probs: float32 [N, T], the reference policy's log-probs, or None (no reference).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    pixel_values: list[torch.Tensor | None] | None = None
    image_grid_thw: list[torch.Tensor | None] | None = None
    group_ids: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    kl_weights: torch.Tensor | None = None
    engine_log_probs: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n, t = self.input_ids.shape
        for name in ("attention_mask", "response_mask"):
            if getattr(self, name).shape != (n, t):
                raise ValueError(f"PolicyBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected {(n, t)}")
        for name in ("pixel_values", "image_grid_thw"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"PolicyBatch.{name} has {len(value)} entries for {n} rollouts")
        for name, value in self.row_tensors().items():
            if value.shape[0] != n:
                raise ValueError(f"PolicyBatch.{name} has first dimension {value.shape[0]}, expected {n}")
            if name in TOKEN_TENSORS and value.shape != (n, t):
                raise ValueError(f"PolicyBatch.{name} has shape {tuple(value.shape)}, expected {(n, t)}")

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_length(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def lengths(self) -> torch.Tensor:
        """int64 [N]: real tokens per rollout (prompt + response): the token load of a rollout."""
        return self.attention_mask.sum(dim=1).to(torch.int64)

    def row_tensors(self) -> dict[str, torch.Tensor]:
        """The per-rollout tensors that are set (:data:`ROW_TENSORS` order), in a new dict."""
        return {name: value for name in ROW_TENSORS if (value := getattr(self, name)) is not None}

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
            **{k: v[idx] for k, v in self.row_tensors().items()},
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
            **{k: v.to(device) for k, v in self.row_tensors().items()},
        )

    def with_tensors(self, **tensors: torch.Tensor | None) -> "PolicyBatch":
        """A new batch with the per-rollout ``tensors`` (names from :data:`ROW_TENSORS`) set or
        replaced; ``self`` is unchanged.

        Raises:
            TypeError: a name that is not a per-rollout tensor.
        """
        unknown = sorted(set(tensors) - set(ROW_TENSORS))
        if unknown:
            raise TypeError(f"PolicyBatch has no per-rollout tensor {unknown}; known: {list(ROW_TENSORS)}")
        return replace(self, **tensors)

    def trimmed(self, multiple: int = 1) -> "PolicyBatch":
        """The batch cut to its last column holding a real token of any row, rounded up to
        ``multiple`` (at most ``T``): the right padding that only a longer row elsewhere (another
        micro-batch) needed is dropped. Per-token tensors are cut alike; ``self`` when nothing is cut.

        Raises:
            ValueError: ``multiple < 1``.
        """
        if multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {multiple}")
        used = torch.nonzero(self.attention_mask.any(dim=0))
        last = int(used[-1]) + 1 if used.numel() else 1
        t = min(self.seq_length, -(-last // multiple) * multiple)
        if t == self.seq_length:
            return self
        return PolicyBatch(
            input_ids=self.input_ids[:, :t],
            attention_mask=self.attention_mask[:, :t],
            response_mask=self.response_mask[:, :t],
            pixel_values=self.pixel_values,
            image_grid_thw=self.image_grid_thw,
            **{k: (v[:, :t] if k in TOKEN_TENSORS else v) for k, v in self.row_tensors().items()},
        )

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
