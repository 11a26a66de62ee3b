"""A step's rollouts with their rewards (:class:`ScoredRollouts`), then with their advantages
(:class:`AdvantagedRollouts`), and their conversion to a PolicyBatch.

Group ids are positions in the step's *global* prompt batch, so they are unique across DP ranks
(every rank draws the same global batch from the sampler and generates its own slice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from fastrl.algorithms.filters import dynamic_sampling_keep
from fastrl.batch import PolicyBatch
from fastrl.config import ParallelConfig, PrecisionConfig
from fastrl.rollout.engine import Rollouts


@dataclass(frozen=True)
class ScoredRollouts:
    """Rollouts of one rank with per-rollout scores, before the advantages (made by
    :func:`fastrl.training.scoring.score`; DAPO's filter and :func:`~fastrl.training.scoring.kl_in_reward`
    read it; :func:`~fastrl.training.scoring.compute_advantages` turns it into :class:`AdvantagedRollouts`).

    Attributes:
        rollouts: the engine's output (prompt ``i``'s responses consecutive).
        group_ids: int64 [R], global group (prompt) id of each rollout.
        rewards / accuracy: float32 [R] (0 where grading failed).
        valid: bool [R], False where grading failed (excluded from advantage statistics).
        formatted: bool [R], format reward earned.
    """

    rollouts: Rollouts
    group_ids: torch.Tensor
    rewards: torch.Tensor
    accuracy: torch.Tensor
    valid: torch.Tensor
    formatted: torch.Tensor

    def __len__(self) -> int:
        return len(self.rollouts)

    @property
    def response_lengths(self) -> torch.Tensor:
        """int64 [R]: response tokens (stop token included)."""
        return torch.tensor(self.rollouts.lengths, dtype=torch.long)

    def with_advantages(self, advantages: torch.Tensor) -> "AdvantagedRollouts":
        """These rollouts with ``advantages`` (float [R], stored as float32); ``self`` is unchanged."""
        if advantages.shape != (len(self),):
            raise ValueError(f"advantages of shape {tuple(advantages.shape)} for {len(self)} rollouts")
        scores = {f.name: getattr(self, f.name) for f in fields(ScoredRollouts)}
        return AdvantagedRollouts(**scores, advantages=advantages.float())


@dataclass(frozen=True)
class AdvantagedRollouts(ScoredRollouts):
    """Scored rollouts with their advantages (made by :meth:`ScoredRollouts.with_advantages` in
    :func:`~fastrl.training.scoring.compute_advantages`; read by :func:`to_policy_batch` and
    :func:`~fastrl.training.prune_phase.prune`).

    Attributes:
        advantages: float32 [R], one advantage per rollout.
    """

    advantages: torch.Tensor


def sequence_multiple(precision: PrecisionConfig, parallel: ParallelConfig) -> int:
    """The multiple every padded sequence length ``T`` of a step is rounded up to (1: none).

    The one place this is chosen. Transformer Engine's FP8 GEMMs (``assert_dim_for_fp8_exec``) need
    the product of an operand's leading dimensions divisible by 8 and its last dimension by 16; the
    token dimension ``micro_batch_size x T`` is a leading dimension in the forward and data-gradient
    GEMMs and the contracted (last) one in the weight-gradient GEMM, so ``T`` is padded to a multiple
    of 16 (32 for the MXFP8 and blockwise recipes, whose scales cover blocks of 32 elements), which
    holds for every micro-batch size. With sequence parallelism each TP rank holds ``T / TP`` of the
    tokens: megatron-core's scatter to the sequence-parallel region asserts that ``T`` divides by TP
    (``tensor_parallel.mappings._split_along_first_dim``, in every precision), and under FP8 each
    rank's share must itself be a multiple of 16 / 32, so the multiple is scaled by TP. Hidden
    dimensions are properties of the model (Qwen2.5-VL's are multiples of 128). bf16 / fp32 runs
    without sequence parallelism are not padded.
    """
    multiple = 1
    if precision.mode == "fp8":
        multiple = 32 if precision.fp8_recipe in ("mxfp8", "blockwise") else 16
    if parallel.sequence_parallel:
        multiple *= parallel.tensor_model_parallel_size
    return multiple


def to_policy_batch(
    scored: ScoredRollouts | AdvantagedRollouts, rows: Sequence[int], *, pad_token_id: int, pad_to_multiple: int = 1
) -> PolicyBatch:
    """Rows ``rows`` of ``scored`` as right-padded ``[prompt | response | pad]`` model input.

    ``T`` is the longest row rounded up to ``pad_to_multiple`` (:func:`sequence_multiple`); padding
    columns hold ``pad_token_id`` with attention, response mask and log-probs off, so losses,
    log-probs and KL see only real tokens (right padding never changes a real token's causal
    attention).

    Per-rollout tensors: ``engine_log_probs`` float32 [N, T] (aligned with ``input_ids``: column
    ``t`` is the log-prob of token ``t``; 0 outside responses), ``group_ids``, and ``advantages``
    float32 [N] when ``scored`` is :class:`AdvantagedRollouts` (else None).
    """
    if pad_to_multiple < 1:
        raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
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
    longest = -(-longest // pad_to_multiple) * pad_to_multiple
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
    advantages = scored.advantages[index].float() if isinstance(scored, AdvantagedRollouts) else None
    return PolicyBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp_mask,
        pixel_values=pixels if has_images else None,
        image_grid_thw=grids if has_images else None,
        group_ids=scored.group_ids[index],
        advantages=advantages,
        engine_log_probs=engine_lp,
    )


def padding_rows(batch: PolicyBatch, count: int) -> PolicyBatch:
    """``count`` zero-weight rows to pad ``batch`` to whole micro-batches: copies of its shortest
    row (fewest prompt + response tokens, the first such row; real tokens, so the forward pass sees
    an ordinary sequence) with the response mask all False and the advantages (when present) 0, so
    they add nothing to any loss term, denominator or gradient. Other per-rollout tensors
    (log-probs, group ids) are copied. The shortest row, because a micro-batch runs at its longest
    row (:func:`fastrl.models.logprobs.fit_micro_batches`): a copy of a long row appended to a
    length-sorted batch would run the last micro-batch, the one of the shortest rows, at that
    length.

    Raises:
        ValueError: ``batch`` is empty or ``count < 1``.
    """
    if len(batch) == 0 or count < 1:
        raise ValueError(f"cannot make {count} padding rows from a batch of {len(batch)} rollouts")
    shortest = int(torch.argmin(batch.lengths))  # the first minimum
    rows = batch.select([shortest] * count)
    advantages = None if rows.advantages is None else torch.zeros_like(rows.advantages)
    return replace(rows, response_mask=torch.zeros_like(rows.response_mask), advantages=advantages)


def num_groups(scored: ScoredRollouts | None) -> int:
    """Prompts (groups) in ``scored``; 0 for None."""
    return 0 if scored is None else len(scored.rollouts.n_per_prompt)


def filter_informative(scored: ScoredRollouts) -> ScoredRollouts | None:
    """The groups whose accuracy varies (DAPO's filter), or None when there is none."""
    keep = dynamic_sampling_keep(scored.accuracy, scored.group_ids, valid=scored.valid)
    rows = torch.nonzero(keep).view(-1).tolist()
    return select_scored(scored, rows) if rows else None


def concat_scored(a: ScoredRollouts | None, b: ScoredRollouts | None) -> ScoredRollouts | None:
    """``a`` followed by ``b`` (prompt indices of ``b`` shifted)."""
    if a is None or b is None:
        return a if b is None else b
    ra, rb = a.rollouts, b.rollouts
    shift = len(ra.prompts)
    rollouts = Rollouts(
        prompts=ra.prompts + rb.prompts,
        prompt_inputs=ra.prompt_inputs + rb.prompt_inputs,
        n_per_prompt=ra.n_per_prompt + rb.n_per_prompt,
        prompt_index=ra.prompt_index + [p + shift for p in rb.prompt_index],
        response_token_ids=ra.response_token_ids + rb.response_token_ids,
        logprobs=ra.logprobs + rb.logprobs,
        finish_reasons=ra.finish_reasons + rb.finish_reasons,
        response_texts=ra.response_texts + rb.response_texts,
        metrics={k: ra.metrics.get(k, 0.0) + rb.metrics.get(k, 0.0) for k in ra.metrics},
    )
    cat = lambda x, y: torch.cat([x, y])  # noqa: E731
    return ScoredRollouts(
        rollouts, cat(a.group_ids, b.group_ids), cat(a.rewards, b.rewards), cat(a.accuracy, b.accuracy),
        cat(a.valid, b.valid), cat(a.formatted, b.formatted),
    )


def select_scored(scored: ScoredRollouts, rows: list[int]) -> ScoredRollouts:
    """The rows ``rows`` of ``scored`` (whole groups), with the rollouts regrouped (their
    advantages too when ``scored`` is :class:`AdvantagedRollouts`)."""
    ro = scored.rollouts
    keep_prompts = sorted({ro.prompt_index[r] for r in rows})
    remap = {p: i for i, p in enumerate(keep_prompts)}
    sizes = [0] * len(keep_prompts)
    for r in rows:
        sizes[remap[ro.prompt_index[r]]] += 1
    idx = torch.as_tensor(rows, dtype=torch.long)
    new = Rollouts(
        prompts=[ro.prompts[p] for p in keep_prompts],
        prompt_inputs=[ro.prompt_inputs[p] for p in keep_prompts],
        n_per_prompt=sizes,
        prompt_index=[remap[ro.prompt_index[r]] for r in rows],
        response_token_ids=[ro.response_token_ids[r] for r in rows],
        logprobs=[ro.logprobs[r] for r in rows],
        finish_reasons=[ro.finish_reasons[r] for r in rows],
        response_texts=[ro.response_texts[r] for r in rows],
        metrics=dict(ro.metrics),
    )
    out = ScoredRollouts(
        new, scored.group_ids[idx], scored.rewards[idx], scored.accuracy[idx], scored.valid[idx], scored.formatted[idx],
    )
    return out.with_advantages(scored.advantages[idx]) if isinstance(scored, AdvantagedRollouts) else out
