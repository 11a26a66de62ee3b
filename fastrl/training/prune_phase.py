"""Phases 5-7 of a step: DP-global pruning (MDAP or a baseline), refill/trim to the update
geometry, the optional bucket-size weights, and the re-partition of the kept rollouts over DP."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.algorithms.minhash import ResponseSketch, minhash_sketch
from fastrl.algorithms.prune_weights import bucket_size_weights
from fastrl.algorithms.pruning import PruneResult
from fastrl.batch import PolicyBatch
from fastrl.config import RunConfig
from fastrl.distributed.dp_pruning import (
    DPPruneOutcome,
    LocalPruningInputs,
    dp_global_prune,
    repartition,
    scale_local_advantages,
)
from fastrl.training.geometry import refill_multiple, trim_to_multiple, whole_micro_batches
from fastrl.training.pruner import select_rollouts
from fastrl.training.rollout_batch import ScoredRollouts
from fastrl.training.seeds import derive_seed

Metrics = dict[str, float]


@dataclass(frozen=True)
class PruneOutcome:
    """What pruning decided for the step's global batch.

    Attributes:
        dp: the gathered inputs and the keep mask, identical on every DP rank.
        result: the pruner's :class:`PruneResult` (after trimming to whole micro-batches).
        weights: float [N] per-rollout advantage weights (``pruning.weighting='bucket_size'``) or None.
    """

    dp: DPPruneOutcome
    result: PruneResult
    weights: torch.Tensor | None


def prune(
    cfg: RunConfig, scored: ScoredRollouts, batch: PolicyBatch, *, step: int, n: int, dp_size: int
) -> tuple[PruneOutcome, Metrics]:
    """DP-global pruning: gather the metadata over DP, run the same selection on every rank."""
    pc = cfg.pruning
    multiple = refill_multiple(cfg, dp_size, n)
    whole = whole_micro_batches(cfg, dp_size)
    responses = list(scored.rollouts.response_token_ids)
    common = dict(group_ids=scored.group_ids, advantages=scored.advantages, lengths=batch.lengths)
    if pc.method == "fastrl" and pc.similarity_mode == "minhash":
        sig, lens = minhash_sketch(responses, num_bins=pc.minhash_num_perm, ngram=pc.ngram).to_tensors()
        local = LocalPruningInputs(**common, signatures=sig, response_lengths=lens)
    else:
        local = LocalPruningInputs(**common, responses=responses)
    generator = torch.Generator().manual_seed(derive_seed(pc.seed, step))
    m: Metrics = {}

    def select(g):
        mult = whole if len(g) < multiple else multiple  # a short batch (DAPO): whole micro-batches
        resp = g.responses
        if resp is None:
            resp = ResponseSketch.from_tensors(g.signatures, g.response_lengths, ngram=pc.ngram, seed=0)
        result = select_rollouts(pc, g.advantages.float(), g.group_ids, resp, multiple=mult, generator=generator)
        result, dropped = trim_to_multiple(result, g.advantages, g.group_ids, whole)
        m["prune/dropped_for_geometry"] = float(dropped)
        return result

    outcome = dp_global_prune(local, select)
    result = outcome.result
    m.update(result.metrics())
    kept_adv = outcome.inputs.advantages[outcome.keep].double()
    weights = None
    if pc.weighting == "bucket_size":
        g = outcome.inputs
        weights = bucket_size_weights(
            g.advantages.float(), g.group_ids, outcome.keep, semantics=pc.semantics, adv_tolerance=pc.adv_tolerance
        )
        kept_w = weights[outcome.keep].double()
        kept_adv = kept_adv * kept_w
        m["prune/weight_max"] = float(kept_w.max())
    # What the update sees: the kept set's mean advantage (0 for an unpruned GRPO batch) and response length.
    m["prune/kept_advantage_mean"] = float(kept_adv.mean())
    if result.kept_tokens is not None:
        m["prune/kept_response_length_mean"] = result.kept_tokens / max(result.num_kept, 1)
    return PruneOutcome(outcome, result, weights), m


def repartition_kept(batch: PolicyBatch, outcome: PruneOutcome) -> tuple[PolicyBatch, Metrics]:
    """The kept rollouts this DP rank trains on: equal counts on every rank and near-equal token
    loads, moving as few rollouts between ranks as a balanced partition allows."""
    if outcome.weights is not None:  # pruning.weighting: each rank scales its own rows first
        batch = scale_local_advantages(batch, outcome.dp, outcome.weights)
    out = repartition(batch, outcome.dp)
    return out, {"prune/kept_rows_this_rank": float(len(out))}
