"""Phases 5-7 of a step: DP-global pruning (MDAP or a baseline; optionally without the uniform
groups), refill/trim to the update geometry, the optional advantage and KL weights, and the
re-partition of the kept rollouts over DP."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from fastrl.algorithms.budget_select import stratified_weights
from fastrl.algorithms.minhash import ResponseSketch, minhash_sketch
from fastrl.algorithms.prune_weights import bucket_size_weights, inverse_keep_weights
from fastrl.algorithms.pruning import PruneResult
from fastrl.batch import PolicyBatch
from fastrl.config import RunConfig
from fastrl.distributed import collectives
from fastrl.distributed.dp_pruning import (
    DPPruneOutcome,
    LocalPruningInputs,
    concat_batches,
    dp_global_prune,
    repartition,
    scale_local_advantages,
)
from fastrl.distributed.dp_pruning import repartition_kept as repartition_global_mask
from fastrl.training.geometry import StepGeometry, fit_to_micro_batches
from fastrl.training.pruner import MDAP_METHODS, keep_all, select_step
from fastrl.training.rollout_batch import AdvantagedRollouts, padding_rows
from fastrl.training.seeds import derive_seed

logger = logging.getLogger("fastrl.trainer")

Metrics = dict[str, float]


@dataclass(frozen=True)
class Selection:
    """The pruner's choice on the gathered batch (what :func:`prune`'s selection returns to
    :func:`~fastrl.distributed.dp_pruning.dp_global_prune`).

    Attributes:
        result: the :class:`PruneResult` after trimming to whole micro-batches.
        dropped: rollouts the trim to whole micro-batches dropped.
        padding: zero-weight rows the re-partition adds (a short DAPO batch).
        ars_counts / selected_fraction: with ``pruning.apply=false``, the pruner's kept count per
            group and kept fraction (every rollout trains); None otherwise.
        selection: bool [N], the selection rule's own Phase-1 mask (also with ``pruning.apply=false``,
            where every rollout trains); None where no rule ran (a batch shorter than one
            micro-batch per rank).
        kl_weights: float32 [N] KL-loss weights (``pruning.zero_adv_kl='sample'``) or None.
        clusters: int64 [N] near-duplicate representatives (budget_stratified) or None.
        metrics: the selection's own counts (``prune/uniform_*``, ``prune/duplicate_*``).
    """

    result: PruneResult
    dropped: int = 0
    padding: int = 0
    ars_counts: dict[int, int] | None = None
    selected_fraction: float | None = None
    selection: torch.Tensor | None = None
    kl_weights: torch.Tensor | None = None
    clusters: object = None
    metrics: dict | None = None

    @property
    def keep(self) -> torch.Tensor:
        return self.result.keep


@dataclass(frozen=True)
class PruneOutcome:
    """What pruning decided for the step's global batch.

    Attributes:
        dp: the gathered inputs and the keep mask, identical on every DP rank.
        result: the pruner's :class:`PruneResult` (after trimming to whole micro-batches).
        weights: float [N] per-rollout advantage weights (``pruning.weighting``, or the method's own) or None.
        kl_weights: float [N] per-rollout KL-loss weights (``pruning.zero_adv_kl='sample'``) or None.
        padding: zero-weight rows added at the re-partition so that a kept set smaller than
            ``dp_size x micro_batch_size`` (a short DAPO batch) fills one micro-batch per DP rank
            (:func:`~fastrl.training.geometry.fit_to_micro_batches`); 0 otherwise.
        selection: bool [N], the selection rule's Phase-1 mask (:attr:`Selection.selection`), or None.
    """

    dp: DPPruneOutcome
    result: PruneResult
    weights: torch.Tensor | None
    padding: int = 0
    ars_counts: dict[int, int] | None = None
    selection: torch.Tensor | None = None
    kl_weights: torch.Tensor | None = None

    @property
    def kept_per_group(self) -> dict[int, int]:
        """What the adaptive sampler records: the pruner's kept count per group (with
        ``pruning.apply=false`` the pruner's choice, although every rollout trains)."""
        return self.ars_counts if self.ars_counts is not None else self.result.kept_per_group


def prune(
    cfg: RunConfig, scored: AdvantagedRollouts, batch: PolicyBatch, *, step: int, geometry: StepGeometry
) -> tuple[PruneOutcome, Metrics]:
    """DP-global pruning: gather the metadata over the ``geometry.dp_size`` DP ranks, run the same
    selection on every rank, and fit the kept count to ``geometry`` (the step's
    :class:`~fastrl.training.geometry.StepGeometry`: ``refill_multiple``, ``kept_unit``).

    A global batch smaller than ``dp_size x micro_batch_size`` (a DAPO step that collected few
    informative groups) is neither pruned nor trimmed: every rollout is kept and the re-partition
    pads it with zero-weight rows (``PruneOutcome.padding``, metric ``prune/num_padding``).
    """
    pc = cfg.pruning
    multiple, whole = geometry.refill_multiple, geometry.kept_unit
    responses = list(scored.rollouts.response_token_ids)
    common = dict(group_ids=scored.group_ids, advantages=scored.advantages, lengths=batch.lengths)
    if pc.method in MDAP_METHODS and pc.similarity_mode == "minhash":
        sig, lens = minhash_sketch(responses, num_bins=pc.minhash_num_perm, ngram=pc.ngram).to_tensors()
        local = LocalPruningInputs(**common, signatures=sig, response_lengths=lens)
    else:
        local = LocalPruningInputs(**common, responses=responses)
    generator = torch.Generator().manual_seed(derive_seed(pc.seed, step))

    def select(g) -> Selection:  # a function of the gathered batch: the same on every DP rank
        resp = g.responses
        if resp is None:
            resp = ResponseSketch.from_tensors(g.signatures, g.response_lengths, ngram=pc.ngram, seed=0)
        counts, selected, rule, picked = None, None, None, None
        if len(g) < whole:  # shorter than one micro-batch per rank (DAPO): keep all, pad
            lengths = g.response_lengths if g.responses is None else torch.tensor([int(r.numel()) for r in resp])
            result = keep_all(g.group_ids, lengths)
        else:
            mult = whole if len(g) < multiple else multiple  # a short batch (DAPO): whole micro-batches
            picked = select_step(pc, g.advantages.float(), g.group_ids, resp, multiple=mult, generator=generator)
            result = picked.result
            rule = result.phase1_keep
            if not pc.apply:  # statistics only (ARS-only ablation): every rollout trains
                counts, selected = dict(result.kept_per_group), result.num_kept / max(len(g), 1)
                result = keep_all(g.group_ids, torch.as_tensor(
                    [int(r.numel()) for r in resp] if g.responses is not None else g.response_lengths))
        result, dropped, padding = fit_to_micro_batches(result, g.advantages, g.group_ids, whole)
        extra = {} if picked is None or not pc.apply else dict(
            kl_weights=picked.kl_weights, clusters=picked.clusters, metrics=picked.metrics)
        return Selection(result, dropped=dropped, padding=padding, ars_counts=counts, selected_fraction=selected,
                         selection=rule, **extra)

    outcome = dp_global_prune(local, select, dp_size=geometry.dp_size)
    chosen: Selection = outcome.result
    result, padding = chosen.result, chosen.padding
    m: Metrics = {"prune/dropped_for_geometry": float(chosen.dropped)}
    if chosen.selected_fraction is not None:
        m["prune/selected_fraction"] = chosen.selected_fraction
    if padding:
        logger.warning(
            "step %d: only %d rollouts are left for the update, fewer than dp_size x micro_batch_size = %d; "
            "training on all of them, padded with %d zero-weight rows (response mask 0: no loss, no gradient) "
            "so that every DP rank has a whole micro-batch", step, result.num_kept, whole, padding,
        )
    m.update(result.metrics())
    m.update(chosen.metrics or {})
    kept_adv = outcome.inputs.advantages[outcome.keep].double()
    weights = None
    g = outcome.inputs
    resp_len = g.response_lengths if g.responses is None else torch.tensor([int(r.numel()) for r in g.responses])
    if pc.method == "budget_stratified" and pc.apply:  # members / kept of each bucket (near-copies merged)
        weights = stratified_weights(
            g.advantages.float(), g.group_ids, outcome.keep, clusters=chosen.clusters, lengths=resp_len,
            semantics=pc.semantics, adv_tolerance=pc.adv_tolerance,
        )
    elif pc.weighting == "inverse_keep" or pc.method == "fastrl_unbiased":  # importance-weighted MDAP
        weights = inverse_keep_weights(
            g.advantages.float(), g.group_ids, outcome.keep, lengths=resp_len,
            semantics=pc.semantics, adv_tolerance=pc.adv_tolerance,
        )
    elif pc.weighting == "bucket_size":
        weights = bucket_size_weights(
            g.advantages.float(), g.group_ids, outcome.keep, semantics=pc.semantics, adv_tolerance=pc.adv_tolerance
        )
    if weights is not None:
        kept_w = weights[outcome.keep].double()
        kept_adv = kept_adv * kept_w
        m["prune/weight_max"] = float(kept_w.max())
    # What the update sees: the kept set's mean advantage (0 for an unpruned GRPO batch) and response length.
    m["prune/kept_advantage_mean"] = float(kept_adv.mean())
    if result.kept_tokens is not None:
        m["prune/kept_response_length_mean"] = result.kept_tokens / max(result.num_kept, 1)
    return PruneOutcome(outcome, result, weights, padding, chosen.ars_counts, chosen.selection, chosen.kl_weights), m


def repartition_kept(batch: PolicyBatch, outcome: PruneOutcome) -> tuple[PolicyBatch, Metrics]:
    """The kept rollouts this DP rank trains on: equal counts on every rank and near-equal token
    loads, moving as few rollouts between ranks as a balanced partition allows."""
    if outcome.weights is not None:  # pruning.weighting: each rank scales its own rows first
        batch = scale_local_advantages(batch, outcome.dp, outcome.weights)
    if outcome.kl_weights is not None:  # pruning.zero_adv_kl=sample: this rank's rows' KL weights
        mine = outcome.dp.inputs.owners == collectives.dp_rank()
        batch = batch.with_tensors(kl_weights=outcome.kl_weights[mine].float())
    out = repartition(batch, outcome.dp) if outcome.padding == 0 else _repartition_padded(batch, outcome)
    return out, {"prune/kept_rows_this_rank": float(len(out))}


def _repartition_padded(batch: PolicyBatch, outcome: PruneOutcome) -> PolicyBatch:
    """:func:`repartition` with ``outcome.padding`` zero-weight rows appended to the DP rank that
    holds the most rollouts (the lowest such rank: the same choice on every rank), as if that rank
    had generated them; the balanced re-partition then gives every rank the same count."""
    inputs, keep = outcome.dp.inputs, outcome.dp.keep
    ranks = inputs.dp_size
    counts = [int((inputs.owners == r).sum()) for r in range(ranks)]
    host = max(range(ranks), key=lambda r: (counts[r], -r))
    if collectives.dp_rank() == host:
        batch = concat_batches([batch, padding_rows(batch, outcome.padding)])
    segments, offsets = [], [0]
    for r in range(ranks):
        pad = outcome.padding if r == host else 0
        segments.append(torch.cat([keep[inputs.owners == r], torch.ones(pad, dtype=torch.bool)]))
        offsets.append(offsets[-1] + counts[r] + pad)
    return repartition_global_mask(batch, torch.cat(segments), offsets)
