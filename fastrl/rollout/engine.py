"""The rollout-engine interface: prompts in, groups of sampled responses with log-probs out.

Two engines implement it: :class:`fastrl.rollout.hf_engine.HFRolloutEngine` (in-process Hugging
Face model, CPU recipes and tests) and :class:`fastrl.rollout.engine_client.EngineProcessClient`
(vLLM in its own process and environment). Both return the same :class:`Rollouts`.

Log-probs returned by an engine are those of the sampled tokens under the *policy at the sampling
temperature*: ``log softmax(logits / T)`` over the full vocabulary (``T = 1`` for greedy decoding),
before top-k / top-p truncation and before token suppression -- the quantity the trainer computes
for the same tokens (:func:`fastrl.models.logprobs.token_log_probs_from_logits`), so that the
engine/trainer mismatch measures numerics and stale weights only. One exception: the vLLM engine
at a temperature other than 0 and 1 reports vLLM's processed log-probs, a softmax over the tokens
sampling may produce, ``-log(1 - q)`` above this definition (``q``: the tempered probability of the
suppressed tokens; :mod:`fastrl.rollout.engine_client`).

Weight versions: every engine counts the refits it has loaded (``weight_version``, 0 for the
weights it was built with) and every ``generate`` call may carry the trainer's policy version (its
count of refits, :attr:`fastrl.training.actor.Actor.policy_version`). An engine whose loaded
version is behind refuses with :class:`StaleWeightsError` (:func:`check_weight_version`; the
engine process runs the same check, :func:`fastrl.rollout.engine_wire.stale_weights_message`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch.nn.utils.rnn import pad_sequence

from fastrl.config import RolloutConfig
from fastrl.rollout.engine_wire import stale_weights_message

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How responses are sampled.

    ``temperature == 0`` is greedy decoding. ``top_k <= 0`` and ``top_p == 1`` switch those filters
    off. ``stop_token_ids`` end a response (the stop token is kept as its last token, since the
    policy must learn to emit it); ``None`` uses the model's end-of-sequence tokens (its generation
    config). ``seed`` makes one call reproducible; ``None`` continues the engine's own seeded
    random stream.
    """

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop_token_ids: tuple[int, ...] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @classmethod
    def for_training(cls, rollout: RolloutConfig, *, seed: int | None = None) -> "SamplingParams":
        """Training rollouts: ``rollout.temperature / top_p / top_k / max_response_length``."""
        return cls(
            temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
            max_tokens=rollout.max_response_length, seed=seed,
        )

    @classmethod
    def for_validation(cls, rollout: RolloutConfig, *, seed: int | None = None) -> "SamplingParams":
        """Validation: ``rollout.val_temperature`` (0: greedy), no top-k / top-p truncation."""
        return cls(
            temperature=rollout.val_temperature, top_p=1.0, top_k=-1,
            max_tokens=rollout.max_response_length, seed=seed,
        )

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the reported log-probs (1 for greedy decoding)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass(frozen=True)
class RolloutPrompt:
    """One prompt: chat-formatted text and its images.

    ``text`` is the full prompt string as the chat template renders it, with one image placeholder
    (``<|vision_start|><|image_pad|><|vision_end|>`` for Qwen2.5-VL) per image, in order; the
    engine's processor expands each placeholder into the image's tokens. ``images`` are PIL images
    (empty for text-only prompts).
    """

    text: str
    images: tuple[Any, ...] = ()


@dataclass(frozen=True)
class PromptInputs:
    """A prompt as the model sees it (the processor's output for one prompt).

    Attributes:
        input_ids: int64 [L], image placeholders expanded (one token per merged patch group).
        pixel_values: float32 [num_patches, C * temporal_patch * patch * patch], or None.
        image_grid_thw: int64 [num_images, 3] (temporal, height, width patch grid), or None.
    """

    input_ids: torch.Tensor
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None


@dataclass
class Rollouts:
    """Sampled responses, grouped by prompt: prompt ``i``'s ``n_per_prompt[i]`` responses are
    consecutive, in prompt order.

    Attributes:
        prompts: the prompts, as given (images passed through).
        prompt_inputs: per prompt, what the model saw (token ids with image tokens expanded, pixels).
        n_per_prompt: responses per prompt (group sizes); ``sum(n_per_prompt) == len(self)``.
        prompt_index: int, per response: index of its prompt.
        response_token_ids: per response, int64 [length] (stop token included when it stopped).
        logprobs: per response, float32 [length]: log-probs of the sampled tokens (module docstring).
        finish_reasons: per response, "stop" (a stop token) or "length" (max_tokens reached).
        response_texts: per response, decoded text without special tokens.
    """

    prompts: list[RolloutPrompt]
    prompt_inputs: list[PromptInputs]
    n_per_prompt: list[int]
    prompt_index: list[int]
    response_token_ids: list[torch.Tensor]
    logprobs: list[torch.Tensor]
    finish_reasons: list[FinishReason]
    response_texts: list[str]
    metrics: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.response_token_ids)

    @property
    def lengths(self) -> list[int]:
        """Response lengths in tokens."""
        return [int(t.numel()) for t in self.response_token_ids]

    def group_slices(self) -> list[slice]:
        """Per prompt, the slice of its responses."""
        out, start = [], 0
        for n in self.n_per_prompt:
            out.append(slice(start, start + n))
            start += n
        return out

    def padded(self, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Right-padded responses.

        Returns:
            ``(token_ids int64 [R, Lmax], logprobs float32 [R, Lmax], mask bool [R, Lmax])``;
            padded positions hold ``pad_token_id``, log-prob 0 and mask False.
        """
        if not len(self):
            return torch.zeros((0, 0), dtype=torch.long), torch.zeros((0, 0)), torch.zeros((0, 0), dtype=torch.bool)
        masks = [torch.ones(n, dtype=torch.bool) for n in self.lengths]
        return (
            pad_sequence(self.response_token_ids, batch_first=True, padding_value=pad_token_id),
            pad_sequence(self.logprobs, batch_first=True, padding_value=0.0),
            pad_sequence(masks, batch_first=True, padding_value=False),
        )


class StaleWeightsError(RuntimeError):
    """A generate request carried a policy version newer than the weights the engine has loaded:
    a refit did not reach the engine."""


def check_weight_version(engine: str, loaded: int, requested: int | None) -> None:
    """Refuse to generate from stale weights (module docstring).

    Raises:
        StaleWeightsError: ``requested`` is not None and ``loaded < requested``.
    """
    message = stale_weights_message(engine, loaded, requested)
    if message is not None:
        raise StaleWeightsError(message)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from a rollout engine: the Hugging Face engine, the vLLM engine
    process's client, and a rank's :class:`~fastrl.training.engine_placement.EnginelessPeer` all
    provide every member (the trainer never probes for one)."""

    weight_version: int
    """Refits loaded so far (0: the weights the engine was built with)."""
    tokenizer: Any
    """The policy's tokenizer (prompt rendering, decoding, the refit probe)."""
    pad_token_id: int
    """Right-padding id of the trainer's batches."""
    suppressed_ids: Sequence[int]
    """Token ids the engine never samples (vision tokens; special tokens unless allowed)."""
    refit_metrics: dict[str, float]
    """Transfer metrics of the last refit (``refit/bytes``, ``refit/time_s``, ...; empty when the
    engine measures none)."""
    verify_every: int
    """Refit-verification period (``rollout.verify_refit_every``; 0: never verified)."""
    verify_tolerance: float
    """Bound of the refit verification (``rollout.verify_refit_tolerance``)."""

    @property
    def export_to_cpu(self) -> bool:
        """Where the trainer's weight export puts its tensors for :meth:`update_weights` (True:
        the CPU; False: the trainer's GPU, for CUDA IPC)."""
        ...

    @property
    def verify_due(self) -> bool:
        """Whether the refit just loaded is to be verified (:class:`VerifiableEngine`)."""
        ...

    def generate(
        self, prompts: Sequence[RolloutPrompt], n_per_prompt: int | Sequence[int], sampling: SamplingParams,
        *, weight_version: int | None = None,
    ) -> Rollouts:
        """Sample ``n_per_prompt`` responses per prompt (an int for all, or one per prompt; it may
        change from call to call). Raises ``ValueError`` for an empty prompt list, a negative group
        size, or ``len(n_per_prompt) != len(prompts)``, and :class:`StaleWeightsError` when
        ``weight_version`` (the trainer's policy version; None: unchecked) is ahead of the weights
        the engine has loaded, before generating anything."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Refit: copy weights given by Hugging Face checkpoint names (``model.layers.*``,
        ``visual.*``, ``lm_head.weight``), consumed one tensor at a time, then advance
        ``weight_version`` by one. Returns the number of tensors loaded. Raises ``KeyError`` for an
        unknown name, ``ValueError`` for a shape mismatch."""
        ...

    def sleep(self) -> None:
        """Release accelerator memory (weights and KV cache) while the trainer runs."""
        ...

    def wake(self) -> None:
        """Regain the memory released by :meth:`sleep` before the next :meth:`generate`."""
        ...


class VerifiableEngine(RolloutEngine, Protocol):
    """An engine whose refits can be verified (:mod:`fastrl.training.refit_verify`): the vLLM
    engine process's client."""

    last_group_sums: dict[str, float]
    """Per parameter group, the sum of squares of the last verified refit as the trainer sent it."""

    def score(self, sequences: Sequence[Sequence[int]], starts: Sequence[int]) -> list[torch.Tensor]:
        """float32 log-probs of ``sequences[i][starts[i]:]`` under the engine's weights (temperature 1)."""
        ...

    def group_sums(self) -> dict[str, float]:
        """Per parameter group, the sum of squares of the weights the engine holds."""
        ...

    def loaded_weight_version(self) -> int:
        """The refits the engine itself has loaded (``weight_version`` counts those sent to it)."""
        ...


def normalize_group_sizes(num_prompts: int, n_per_prompt: int | Sequence[int]) -> list[int]:
    """``n_per_prompt`` as one group size per prompt.

    Raises:
        ValueError: no prompts, a negative size, or a list whose length differs from the prompts.
    """
    if num_prompts < 1:
        raise ValueError("generate() needs at least one prompt")
    if isinstance(n_per_prompt, int):
        sizes = [n_per_prompt] * num_prompts
    else:
        sizes = [int(n) for n in n_per_prompt]
        if len(sizes) != num_prompts:
            raise ValueError(f"n_per_prompt has {len(sizes)} entries for {num_prompts} prompts")
    bad = [(i, n) for i, n in enumerate(sizes) if n < 0]
    if bad:
        raise ValueError(f"group sizes must be >= 0; prompt {bad[0][0]} has n={bad[0][1]}")
    return sizes


def assemble_rollouts(
    prompts: Sequence[RolloutPrompt],
    prompt_inputs: list[PromptInputs],
    sizes: list[int],
    tokens: list[torch.Tensor],
    logprobs: list[torch.Tensor],
    finish: list[FinishReason],
    tokenizer: Any,
    elapsed: float,
    **extra_metrics: float,
) -> Rollouts:
    """The :class:`Rollouts` of an engine's sampled responses (prompt ``i``'s ``sizes[i]`` responses
    consecutive), the texts decoded once here, and the generation metrics (``elapsed`` in s).
    ``extra_metrics`` are added under ``rollout/<name>``."""
    generated = sum(int(t.numel()) for t in tokens)
    return Rollouts(
        prompts=list(prompts),
        prompt_inputs=prompt_inputs,
        n_per_prompt=sizes,
        prompt_index=[i for i, n in enumerate(sizes) for _ in range(n)],
        response_token_ids=tokens,
        logprobs=logprobs,
        finish_reasons=finish,
        response_texts=tokenizer.batch_decode([t.tolist() for t in tokens], skip_special_tokens=True),
        metrics={
            "rollout/generated_tokens": float(generated),
            "rollout/time_s": elapsed,
            "rollout/tokens_per_s": generated / elapsed if elapsed > 0 else 0.0,
            **{f"rollout/{k}": float(v) for k, v in extra_metrics.items()},
        },
    )
