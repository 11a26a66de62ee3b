"""Uniform groups out of the expensive passes (``pruning.drop_uniform_groups``, issue 49 item 1).

A group whose responses all got the same reward has advantage 0 on every row (GRPO, Dr. GRPO,
RLOO): it adds nothing to the policy gradient, only to the KL term and to the loss denominator, yet
it costs old / reference log-prob passes and update compute. With binary rewards about half of the
SmolLM2 word-problem rollouts sit in such groups. Any selector can run on the other groups only;
this module gives the pieces (pure):

- :func:`zero_advantage_groups`: the rows of uniform groups (every advantage rounds to 0 at 4
  decimals, the reference's bucket key).
- :func:`kl_sample`: ``pruning.zero_adv_kl="sample"``: a fixed-size seeded sample of those rows that
  stays in the update for the KL term, each weighted ``U / s``.
- :func:`merge_uniform_drop`: the final selection on the whole batch: the selector's keep mask on
  the mixed rows, plus the KL sample, then MDAP's Phase 2 refill to the update geometry.

What each KL treatment does, with ``T_K`` the kept response tokens (the token-mean denominator),
``kl_i`` a rollout's summed KL terms, ``U`` the uniform rows and ``S`` the sample (``s`` rows):

- ``drop``: the KL term is ``(1 / T_K) sum_{i kept} kl_i``; the uniform prompts (those the policy
  already answers all right, or all wrong) are not held to the reference at this step, and since
  ``T_K`` no longer counts their tokens, every kept token weighs more in both loss terms than it
  would with them in the batch.
- ``sample``: ``(1 / D) [sum_{i kept, mixed} kl_i + (U / s) sum_{i in S} kl_i]`` with
  ``D = T_mixed + (U / s) T_S`` (the kept mixed rows' tokens plus the sample's, weighted alike). Each
  uniform row is in ``S`` with probability ``s / U``, so the bracket's expectation over the draw is
  the KL sum the batch had with all ``U`` rows, and ``D``'s is its token count (Horvitz-Thompson;
  together a ratio estimator of the per-token KL over the kept and the uniform rows, as an unpruned
  token-mean loss weighs it). Their advantage is 0, so the policy-gradient term is the same as with
  ``drop`` up to that denominator, which counts the uniform tokens as an unpruned batch does.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from fastrl.algorithms._checks import check_choice, check_positive_int
from fastrl.algorithms._prune_batch import Refill, prepare_batch, start_pruner, to_numpy
from fastrl.algorithms.budget_select import generator_seed, keyed_uniforms
from fastrl.algorithms.pruning import PruneResult, finish_pruner

__all__ = ["KL_TREATMENTS", "kl_sample", "merge_uniform_drop", "zero_advantage_groups"]

KL_TREATMENTS = ("drop", "sample")


def _zero(adv: np.ndarray) -> np.ndarray:
    return np.round(adv.astype(np.float64), 4) == 0


def zero_advantage_groups(advantages: Any, group_ids: Any) -> np.ndarray:
    """bool [N]: rows of uniform groups, i.e. groups where every advantage rounds (4 decimals) to 0.

    Raises:
        ValueError / TypeError: as :func:`~fastrl.algorithms._prune_batch.prepare_batch`.
    """
    b = prepare_batch(advantages, group_ids)
    informative = np.bincount(b.gidx, weights=(~_zero(b.adv)).astype(np.float64), minlength=b.uniq_groups.shape[0])
    return informative[b.gidx] == 0


def kl_sample(advantages: Any, group_ids: Any, uniform: Any, *, num_samples: int, generator: torch.Generator) -> tuple[np.ndarray, float]:
    """A seeded simple random sample of ``s = min(num_samples, U)`` of the ``U`` rows in
    ``uniform``, and their KL weight ``U / s`` (module docstring).

    The sample is the ``s`` rows with the smallest keyed draw
    (:func:`~fastrl.algorithms.budget_select.keyed_uniforms`, stream 2, seeded by one draw of
    ``generator``; ties by group id and position in the group): the same rollouts on every
    data-parallel layout.

    Returns:
        ``(sample, weight)``: bool [N], and ``U / s`` (1.0 when there is no uniform row).

    Raises:
        ValueError: ``num_samples < 1`` or ``uniform`` of another length.
    """
    num_samples = check_positive_int(num_samples, "num_samples")
    b = prepare_batch(advantages, group_ids)
    uni = to_numpy(uniform).astype(bool).reshape(-1)
    if uni.shape[0] != b.n:
        raise ValueError(f"`uniform` has {uni.shape[0]} rows but `advantages` has {b.n}; they must match")
    rows = np.nonzero(uni)[0]
    sample = np.zeros(b.n, dtype=bool)
    if rows.size == 0:
        return sample, 1.0
    u = keyed_uniforms(generator_seed(generator), b.group_ids, b.local, 2)
    s = min(num_samples, int(rows.size))
    sample[rows[np.lexsort((b.local[rows], b.group_ids[rows], u[rows]))][:s]] = True
    return sample, rows.size / s


def merge_uniform_drop(
    advantages: Any,
    group_ids: Any,
    mixed_keep: Any,
    *,
    kl: Literal["drop", "sample"],
    generator: torch.Generator | None = None,
    num_samples: int = 4,
    num_buckets: int = 0,
    multiple: int = 1,
    refill: Refill = "round_robin",
    allow_padding: bool = False,
    response_lengths: Any = None,
) -> tuple[PruneResult, torch.Tensor | None]:
    """The step's selection with the uniform groups dropped.

    Phase 1 is ``mixed_keep`` (the selector's choice, made on the mixed groups only) on the mixed
    rows, False on the uniform rows, plus the KL sample (``kl="sample"``). A batch whose groups are
    all uniform keeps, with ``kl="drop"``, the first rollout (batch order) of each group, so that the
    step still trains (its KL term alone, as ``zero_adv_skip``). Then MDAP's Phase 2 refill on the
    whole batch (largest ``|a|`` first: uniform rows only when no mixed row is left).

    Args:
        advantages: float [N]; group_ids: int [N].
        mixed_keep: bool [N], the selector's keep mask (its values on uniform rows are ignored).
        kl: "drop" or "sample"; generator: seeded, for ``"sample"``; num_samples: ``s``.
        num_buckets: reported in the result (the selector's buckets; each uniform group is one more).
        multiple, refill, allow_padding, response_lengths: Phase 2, as
            :func:`~fastrl.algorithms.baseline_pruners.cppo_select`.

    Returns:
        ``(result, kl_weights)``: the :class:`PruneResult`, and float32 [N] KL weights (``U / s`` on
        the sample, 1 elsewhere) for ``"sample"``, None for ``"drop"``.

    Raises:
        ValueError: an unknown ``kl``, ``mixed_keep`` of another length, ``"sample"`` without a generator.
    """
    check_choice(kl, "kl", KL_TREATMENTS)
    call = start_pruner(
        advantages, group_ids, multiple=multiple, refill=refill, allow_padding=allow_padding,
        response_lengths=response_lengths,
    )
    b = call.batch
    sel = to_numpy(mixed_keep).astype(bool).reshape(-1)
    if sel.shape[0] != b.n:
        raise ValueError(f"`mixed_keep` has {sel.shape[0]} rows but `advantages` has {b.n}; they must match")
    uniform = zero_advantage_groups(b.adv, b.group_ids)
    phase1 = sel & ~uniform
    weights = None
    if kl == "sample":
        if generator is None:
            raise ValueError("`kl='sample'` needs a seeded `generator`")
        sample, w = kl_sample(b.adv, b.group_ids, uniform, num_samples=num_samples, generator=generator)
        phase1 |= sample
        weights = torch.from_numpy(np.where(sample, w, 1.0).astype(np.float32))
    if not phase1.any():  # every group uniform: each group's first row, so that the step trains
        phase1[np.sort(b.order[np.r_[0, np.cumsum(b.group_sizes)[:-1]]])] = True
    groups_uniform = int(np.unique(b.gidx[uniform]).size)
    return finish_pruner(call, phase1, num_buckets=num_buckets + groups_uniform, pruner="drop_uniform_groups"), weights
