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
    GlobalPruningInputs,
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
class _Selection:
    """What the selection (a function of the gathered batch, the same on every DP rank) hands back
    to :func:`prune` through :func:`~fastrl.distributed.dp_pruning.dp_global_prune`; ``keep`` is
    what that function checks."""

    result: PruneResult
    dropped: int = 0
    padding: int = 0
    ars_counts: dict[int, int] | None = None
    selected_fraction: float | None = None
    rule_keep: torch.Tensor | None = None
    kl_weights: torch.Tensor | None = None
    clusters: object = None
    metrics: dict | None = None

    @property
    def keep(self) -> torch.Tensor:
        return self.result.keep


@dataclass(frozen=True)
class PruneOutcome:
    """What pruning decided for the step's global batch of N rollouts (identical on every DP rank).

    Attributes:
        inputs: what the selection saw: the gathered batch in DP-rank order
            (:class:`~fastrl.distributed.dp_pruning.GlobalPruningInputs`: owners, local rows, group
            ids, advantages, token loads, response lengths).
        keep: bool [N], the rollouts that train (after the fit to whole micro-batches).
        kept_per_group: group id -> kept count, what the adaptive sampler records (with
            ``pruning.apply=false`` the rule's choice, although every rollout trains).
        rule_keep: bool [N], the selection rule's own Phase-1 mask (also with ``pruning.apply=false``),
            or None where no rule ran (a batch shorter than one micro-batch per rank).
        weights: float [N] per-rollout advantage weights (``pruning.weighting``, or the method's
            own) or None.
        kl_weights: float32 [N] per-rollout KL-loss weights (``pruning.zero_adv_kl='sample'``) or None.
        padding: zero-weight rows added at the re-partition so that a kept set smaller than
            ``dp_size x micro_batch_size`` (a short DAPO batch) fills one micro-batch per DP rank
            (:func:`~fastrl.training.geometry.fit_to_micro_batches`); 0 otherwise.
        dropped: rollouts the fit to whole micro-batches dropped (``prune/dropped_for_geometry``).
    """

    inputs: GlobalPruningInputs
    keep: torch.Tensor
    kept_per_group: dict[int, int]
    rule_keep: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    kl_weights: torch.Tensor | None = None
    padding: int = 0
    dropped: int = 0

    @property
    def response_lengths(self) -> torch.Tensor:
        """int64 [N]: response tokens of each rollout (``inputs.response_lengths``, counted once)."""
        return self.inputs.response_lengths

    @property
    def indices(self) -> torch.Tensor:
        """int64 [K]: the kept rollouts' global rows, ascending."""
        return torch.nonzero(self.keep).flatten()


def prune(
    cfg: RunConfig, scored: AdvantagedRollouts, batch: PolicyBatch, *, step: int, geometry: StepGeometry
) -> tuple[PruneOutcome, Metrics]:
    """DP-global pruning: gather the metadata over the ``geometry.dp_size`` DP ranks, run the same
    selection on every rank, and fit the kept count to ``geometry`` (the step's
    :class:`~fastrl.training.geometry.StepGeometry`: ``refill_multiple``, ``kept_unit``).

    The response lengths are counted once, here (``scored.response_lengths``), and every later use
    reads them from :attr:`PruneOutcome.response_lengths`.

    A global batch smaller than ``dp_size x micro_batch_size`` (a DAPO step that collected few
    informative groups) is neither pruned nor trimmed: every rollout is kept and the re-partition
    pads it with zero-weight rows (``PruneOutcome.padding``, metric ``prune/num_padding``).
    """
    pc = cfg.pruning
    multiple, whole = geometry.refill_multiple, geometry.kept_unit
    responses = list(scored.rollouts.response_token_ids)
    common = dict(
        group_ids=scored.group_ids, advantages=scored.advantages, lengths=batch.lengths,
        response_lengths=scored.response_lengths,
    )
    if pc.method in MDAP_METHODS and pc.similarity_mode == "minhash":
        sig, _ = minhash_sketch(responses, num_bins=pc.minhash_num_perm, ngram=pc.ngram).to_tensors()
        local = LocalPruningInputs(**common, signatures=sig)
    else:
        local = LocalPruningInputs(**common, responses=responses)
    generator = torch.Generator().manual_seed(derive_seed(pc.seed, step))

    def select(g: GlobalPruningInputs) -> _Selection:  # a function of the gathered batch: the same on every DP rank
        resp = g.responses
        if resp is None:
            resp = ResponseSketch.from_tensors(g.signatures, g.response_lengths, ngram=pc.ngram, seed=0)
        counts, selected, rule, picked = None, None, None, None
        if len(g) < whole:  # shorter than one micro-batch per rank (DAPO): keep all, pad
            result = keep_all(g.group_ids, g.response_lengths)
        else:
            mult = whole if len(g) < multiple else multiple  # a short batch (DAPO): whole micro-batches
            picked = select_step(
                pc, g.advantages.float(), g.group_ids, resp, response_lengths=g.response_lengths, multiple=mult,
                generator=generator,
            )
            result = picked.result
            rule = result.phase1_keep
            if not pc.apply:  # statistics only (ARS-only ablation): every rollout trains
                counts, selected = dict(result.kept_per_group), result.num_kept / max(len(g), 1)
                result = keep_all(g.group_ids, g.response_lengths)
        result, dropped, padding = fit_to_micro_batches(result, g.advantages, g.group_ids, whole)
        extra = {} if picked is None or not pc.apply else dict(
            kl_weights=picked.kl_weights, clusters=picked.clusters, metrics=picked.metrics)
        return _Selection(result, dropped=dropped, padding=padding, ars_counts=counts, selected_fraction=selected,
                          rule_keep=rule, **extra)

    g, chosen = dp_global_prune(local, select, dp_size=geometry.dp_size)
    result, padding, keep, lengths = chosen.result, chosen.padding, chosen.keep, g.response_lengths
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
    kept_adv = g.advantages[keep].double()
    weights = None
    if pc.method == "budget_stratified" and pc.apply:  # members / kept of each bucket (near-copies merged)
        weights = stratified_weights(
            g.advantages.float(), g.group_ids, keep, clusters=chosen.clusters, lengths=lengths,
            semantics=pc.semantics, adv_tolerance=pc.adv_tolerance,
        )
    elif pc.weighting == "inverse_keep" or pc.method == "fastrl_unbiased":  # importance-weighted MDAP
        weights = inverse_keep_weights(
            g.advantages.float(), g.group_ids, keep, lengths=lengths,
            semantics=pc.semantics, adv_tolerance=pc.adv_tolerance,
        )
    elif pc.weighting == "bucket_size":
        weights = bucket_size_weights(
            g.advantages.float(), g.group_ids, keep, semantics=pc.semantics, adv_tolerance=pc.adv_tolerance
        )
    if weights is not None:
        kept_w = weights[keep].double()
        kept_adv = kept_adv * kept_w
        m["prune/weight_max"] = float(kept_w.max())
    # What the update sees: the kept set's mean advantage (0 for an unpruned GRPO batch) and response length.
    m["prune/kept_advantage_mean"] = float(kept_adv.mean())
    if result.kept_tokens is not None:
        m["prune/kept_response_length_mean"] = result.kept_tokens / max(result.num_kept, 1)
    kept_per_group = chosen.ars_counts if chosen.ars_counts is not None else result.kept_per_group
    outcome = PruneOutcome(
        inputs=g, keep=keep, kept_per_group=kept_per_group, rule_keep=chosen.rule_keep, weights=weights,
        kl_weights=chosen.kl_weights, padding=padding, dropped=chosen.dropped,
    )
    return outcome, m


def repartition_kept(batch: PolicyBatch, outcome: PruneOutcome) -> tuple[PolicyBatch, Metrics]:
    """The kept rollouts this DP rank trains on: equal counts on every rank and near-equal token
    loads, moving as few rollouts between ranks as a balanced partition allows."""
    if outcome.weights is not None:  # pruning.weighting: each rank scales its own rows first
        batch = scale_local_advantages(batch, outcome.inputs, outcome.weights)
    if outcome.kl_weights is not None:  # pruning.zero_adv_kl=sample: this rank's rows' KL weights
        mine = outcome.inputs.rows_of(collectives.dp_rank())
        batch = batch.with_tensors(kl_weights=outcome.kl_weights[mine].float())
    out = repartition(batch, outcome.inputs, outcome.keep) if outcome.padding == 0 else _repartition_padded(batch, outcome)
    return out, {"prune/kept_rows_this_rank": float(len(out))}


def _repartition_padded(batch: PolicyBatch, outcome: PruneOutcome) -> PolicyBatch:
    """:func:`repartition` with ``outcome.padding`` zero-weight rows appended to the DP rank that
    holds the most rollouts (the lowest such rank: the same choice on every rank), as if that rank
    had generated them; the balanced re-partition then gives every rank the same count."""
    inputs, keep = outcome.inputs, outcome.keep
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
