"""DP-global pruning: every data-parallel rank prunes the same global batch, then rebalances.

Each DP rank holds the rollouts it generated. Pruning (MDAP and the baselines of
:mod:`fastrl.algorithms.pruning`) must see whole groups and the whole batch, so:

1. :func:`gather_pruning_metadata` all-gathers, over the DP group only, per rollout: group id,
   advantage, token length, and either the response token ids (exact Jaccard; ragged, sent
   flattened with their lengths) or a MinHash signature (approximate; fixed size). Rows are
   concatenated in DP-rank order, so every rank builds the identical global batch.
2. The caller's pruner (a pure function of that batch) runs on every rank and gives the same keep
   mask everywhere (:func:`dp_global_prune`, which returns the gathered inputs and the pruner's
   result side by side).
3. :func:`repartition` moves kept rollouts so that every DP rank holds the same number with
   near-equal token loads (:mod:`fastrl.distributed.partition`); only rollouts whose target rank
   differs from their owner travel, point to point inside the DP group.

Tensor-parallel and pipeline-parallel peers of a DP rank hold the same rollouts and make the same
decisions; the partition count is the DP size, never the world size. The DP size is the caller's
(the trainer's step geometry, :class:`fastrl.training.geometry.StepGeometry`): the gather checks
it against the DP group, and every later function reads it from the gathered inputs or the offsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

import torch

from fastrl.batch import PolicyBatch
from fastrl.distributed import collectives
from fastrl.distributed.partition import balanced_assignment


@dataclass
class LocalPruningInputs:
    """This DP rank's rollouts, as the pruner needs them.

    Attributes:
        group_ids: int64 [n], prompt group of each rollout (globally unique ids).
        advantages: float [n], one scalar per rollout.
        lengths: int64 [n], token load of each rollout (prompt + response tokens).
        response_lengths: int64 [n], response tokens of each rollout (the one count every later
            use reads: kept-token statistics, length-aware weights, the split of gathered responses).
        responses: n unpadded 1-D int64 tensors of response token ids (exact similarity), or None.
        signatures: int16 [n, bins] MinHash signatures (``ResponseSketch.to_tensors()``), or None.

    Raises:
        ValueError: a tensor of another shape, not exactly one of responses / signatures, or
            responses whose lengths are not ``response_lengths``.
    """

    group_ids: torch.Tensor
    advantages: torch.Tensor
    lengths: torch.Tensor
    response_lengths: torch.Tensor
    responses: list[torch.Tensor] | None = None
    signatures: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = int(self.group_ids.shape[0])
        for name in ("advantages", "lengths", "response_lengths"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"LocalPruningInputs.{name} has shape {tuple(getattr(self, name).shape)}, expected ({n},)")
        if (self.responses is None) == (self.signatures is None):
            raise ValueError("LocalPruningInputs needs exactly one of responses (exact) or signatures (minhash)")
        if self.responses is not None:
            if len(self.responses) != n:
                raise ValueError(f"{len(self.responses)} responses for {n} rollouts")
            wrong = [i for i, (r, k) in enumerate(zip(self.responses, self.response_lengths.tolist())) if int(r.numel()) != k]
            if wrong:
                raise ValueError(f"response {wrong[0]} has {int(self.responses[wrong[0]].numel())} tokens, "
                                 f"response_lengths says {int(self.response_lengths[wrong[0]])}")
        if self.signatures is not None and self.signatures.shape[0] != n:
            raise ValueError(f"signatures have {self.signatures.shape[0]} rows for {n} rollouts")


@dataclass
class GlobalPruningInputs:
    """The whole DP group's rollouts, concatenated in DP-rank order (identical on every rank)."""

    dp_size: int
    """The DP ranks whose rollouts these are (the caller's, checked against the DP group)."""
    group_ids: torch.Tensor
    advantages: torch.Tensor
    lengths: torch.Tensor
    response_lengths: torch.Tensor
    """int64 [N]: response tokens of each rollout (gathered once, as the owners counted them)."""
    owners: torch.Tensor
    """int64 [N]: DP rank holding each rollout."""
    local_index: torch.Tensor
    """int64 [N]: row of each rollout in its owner's local batch."""
    responses: list[torch.Tensor] | None
    signatures: torch.Tensor | None

    def __len__(self) -> int:
        return int(self.group_ids.shape[0])

    def rows_of(self, dp_rank: int) -> torch.Tensor:
        """bool [N]: the rollouts DP rank ``dp_rank`` holds (its local rows, in order)."""
        return self.owners == dp_rank


def gather_pruning_metadata(local: LocalPruningInputs, *, dp_size: int) -> GlobalPruningInputs:
    """All-gather the pruning metadata over the DP group of ``dp_size`` ranks.

    Bytes moved per rollout (received by every DP rank from every other): 8 (group id) + 8
    (advantage, float64) + 8 (length) + either 8 x response tokens + 8 (exact mode) or
    2 x MinHash bins + 8 (minhash mode).

    Raises:
        ValueError: the DP group does not have ``dp_size`` ranks.
    """
    ints = torch.stack([local.group_ids.to(torch.int64), local.lengths.to(torch.int64)], dim=1)
    parts_int = collectives.all_gather_dp(ints)
    if len(parts_int) != dp_size:
        raise ValueError(f"the data-parallel group has {len(parts_int)} ranks, the step geometry says dp_size={dp_size}")
    parts_adv = collectives.all_gather_dp(local.advantages.to(torch.float64))
    owners = torch.cat([torch.full((len(p),), r, dtype=torch.int64) for r, p in enumerate(parts_int)])
    local_index = torch.cat([torch.arange(len(p), dtype=torch.int64) for p in parts_int])
    all_int = torch.cat(parts_int)
    response_lengths = torch.cat(collectives.all_gather_dp(local.response_lengths.to(torch.int64)))
    responses = signatures = None
    if local.responses is not None:
        flat = torch.cat([r.to(torch.int64).reshape(-1) for r in local.responses]) if local.responses else torch.zeros(0, dtype=torch.int64)
        flat_all = torch.cat(collectives.all_gather_dp(flat))
        responses = list(torch.split(flat_all, response_lengths.tolist()))
    else:
        signatures = torch.cat(collectives.all_gather_dp(local.signatures))
    return GlobalPruningInputs(
        dp_size=dp_size,
        group_ids=all_int[:, 0],
        advantages=torch.cat(parts_adv),
        lengths=all_int[:, 1],
        response_lengths=response_lengths,
        owners=owners,
        local_index=local_index,
        responses=responses,
        signatures=signatures,
    )


R = TypeVar("R")


def dp_global_prune(
    local: LocalPruningInputs, prune: Callable[[GlobalPruningInputs], R], *, dp_size: int
) -> tuple[GlobalPruningInputs, R]:
    """Gather the metadata over the ``dp_size`` DP ranks (:func:`gather_pruning_metadata`) and run
    ``prune`` (a pure function of the global batch) on every rank: the gathered inputs and the
    pruner's result, identical on every rank.

    ``prune(global_inputs)`` returns an object with a ``keep`` bool [N] attribute (``PruneResult``).

    Raises:
        ValueError: the pruner's mask has the wrong length, or the DP group is not ``dp_size`` ranks.
    """
    inputs = gather_pruning_metadata(local, dp_size=dp_size)
    result = prune(inputs)
    keep = torch.as_tensor(result.keep, dtype=torch.bool)
    if keep.shape != (len(inputs),):
        raise ValueError(f"the pruner returned a keep mask of shape {tuple(keep.shape)} for {len(inputs)} rollouts")
    return inputs, result


def scale_local_advantages(batch: PolicyBatch, inputs: GlobalPruningInputs, weights: torch.Tensor) -> PolicyBatch:
    """``batch`` with each rollout's advantage multiplied by its global weight.

    Args:
        batch: this rank's local rollouts (the rows ``LocalPruningInputs`` described).
        inputs: the gathered inputs (:func:`dp_global_prune`).
        weights: float [N], one weight per global rollout (DP-rank order, identical on every rank),
            e.g. :func:`fastrl.algorithms.prune_weights.bucket_size_weights`.

    Raises:
        ValueError: ``weights`` does not have one value per global rollout.
    """
    if weights.shape != (len(inputs),):
        raise ValueError(f"weights of shape {tuple(weights.shape)} for {len(inputs)} rollouts")
    adv = batch.advantages
    if adv is None:
        raise ValueError("scale_local_advantages needs a batch with advantages")
    mine = weights[inputs.rows_of(collectives.dp_rank())].to(adv)
    return batch.with_tensors(advantages=adv * mine)


def repartition(batch: PolicyBatch, inputs: GlobalPruningInputs, keep: torch.Tensor) -> PolicyBatch:
    """This rank's share of the kept rollouts after balancing (same count on every DP rank).

    Args:
        batch: this rank's local rollouts (the rows ``LocalPruningInputs`` described).
        inputs: the gathered inputs (:func:`dp_global_prune`; their ``dp_size`` is the partition count).
        keep: bool [N], the global keep mask (DP-rank order, identical on every rank).

    Returns:
        The kept rollouts assigned to this rank, ordered by global index (DP rank, local row).
        Only moved rollouts travel: a point-to-point transfer per (sender, receiver) pair in the DP
        group, pickled :class:`PolicyBatch` rows (their tensors' bytes plus a small header).

    Raises:
        ValueError: the kept count is not a positive multiple of the DP size, or ``batch`` does not
            hold the rows this rank reported.
    """
    keep = torch.as_tensor(keep, dtype=torch.bool)
    if keep.shape != (len(inputs),):
        raise ValueError(f"a keep mask of shape {tuple(keep.shape)} for {len(inputs)} rollouts")
    return _move_kept(batch, keep, inputs.owners, inputs.local_index, inputs.lengths, inputs.dp_size)


def repartition_kept(batch: PolicyBatch, keep: torch.Tensor, offsets: Sequence[int]) -> PolicyBatch:
    """:func:`repartition` from a global keep mask over rollouts concatenated in DP-rank order.

    Args:
        batch: every local rollout of this rank (kept or not), in the order used for ``keep``.
        keep: bool [N], the global keep mask (identical on every rank).
        offsets: DP rank ``r`` owns global rows ``offsets[r]:offsets[r + 1]`` (``dp_size + 1``
            values: the offsets give the DP size).

    Token lengths are all-gathered over DP here (8 bytes per rollout).

    Raises:
        ValueError: the offsets do not split the mask, or the DP group has another size.
    """
    ranks = len(offsets) - 1
    if ranks < 1 or offsets[0] != 0 or offsets[-1] != len(keep) or any(b < a for a, b in zip(offsets[:-1], offsets[1:])):
        raise ValueError(f"offsets {list(offsets)} do not split {len(keep)} rollouts over DP ranks")
    owners = torch.cat([torch.full((offsets[r + 1] - offsets[r],), r, dtype=torch.int64) for r in range(ranks)])
    local_index = torch.cat([torch.arange(offsets[r + 1] - offsets[r], dtype=torch.int64) for r in range(ranks)])
    parts = collectives.all_gather_dp(batch.lengths)
    if len(parts) != ranks:
        raise ValueError(f"offsets {list(offsets)} describe {ranks} DP ranks, the data-parallel group has {len(parts)}")
    lengths = torch.cat(parts)
    return _move_kept(batch, torch.as_tensor(keep, dtype=torch.bool), owners, local_index, lengths, ranks)


def _move_kept(
    batch: PolicyBatch, keep: torch.Tensor, owners: torch.Tensor, local_index: torch.Tensor, lengths: torch.Tensor,
    ranks: int,
) -> PolicyBatch:
    kept = torch.nonzero(keep).flatten().tolist()
    kept_owners = owners[kept].tolist()
    targets = balanced_assignment(lengths[kept].tolist(), kept_owners, ranks)
    me = collectives.dp_rank()
    if len(batch) != int((owners == me).sum()):
        raise ValueError(f"this rank holds {len(batch)} rollouts but reported {int((owners == me).sum())} for pruning")
    plan = [[[] for _ in range(ranks)] for _ in range(ranks)]  # plan[src][dst] -> global indices
    for g, src, dst in zip(kept, kept_owners, targets):
        plan[src][dst].append(g)
    outgoing: list[PolicyBatch | None] = [None] * ranks
    for dst in range(ranks):
        if plan[me][dst] and dst != me:
            outgoing[dst] = batch.select([int(local_index[g]) for g in plan[me][dst]])
    counts = [[len(plan[s][d]) for d in range(ranks)] for s in range(ranks)]
    incoming = collectives.exchange_objects_dp(outgoing, counts)
    pieces: list[PolicyBatch] = []
    for src in range(ranks):
        if not plan[src][me]:
            continue
        if src == me:
            pieces.append(batch.select([int(local_index[g]) for g in plan[me][me]]))
        else:
            pieces.append(incoming[src])
    return concat_batches(pieces)


def concat_batches(batches: Sequence[PolicyBatch]) -> PolicyBatch:
    """Rows of ``batches`` in order, right-padded to the longest sequence.

    Per-token tensors (second dimension equal to the batch's sequence length) are padded with
    zeros; per-rollout tensors are concatenated as they are.

    Raises:
        ValueError: no batches, or batches that carry different per-rollout tensors.
    """
    if not batches:
        raise ValueError("no batches to concatenate")
    names = list(batches[0].row_tensors())
    for b in batches[1:]:
        if list(b.row_tensors()) != names:
            raise ValueError(f"cannot concatenate batches with per-rollout tensors {names} and {list(b.row_tensors())}")
    t = max(b.seq_length for b in batches)

    def pad(x: torch.Tensor, seq_length: int) -> torch.Tensor:
        if x.dim() >= 2 and x.shape[1] == seq_length and seq_length < t:
            return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, t - seq_length))
        return x

    def cat(get) -> torch.Tensor:
        return torch.cat([pad(get(b), b.seq_length) for b in batches])

    def cat_list(name: str) -> list | None:
        values = [getattr(b, name) for b in batches]
        return None if all(v is None for v in values) else [x for v in values for x in v]

    return PolicyBatch(
        input_ids=cat(lambda b: b.input_ids),
        attention_mask=cat(lambda b: b.attention_mask),
        response_mask=cat(lambda b: b.response_mask),
        pixel_values=cat_list("pixel_values"),
        image_grid_thw=cat_list("image_grid_thw"),
        **{k: cat(lambda b, k=k: getattr(b, k)) for k in names},
    )


def gather_for_logging(values: torch.Tensor) -> torch.Tensor:
    """Per-rollout values (rewards, advantages, lengths) of every DP rank, in DP-rank order.

    Only DP ranks hold distinct rollouts; TP/PP peers pass the same values and get the same result.
    """
    return torch.cat(collectives.all_gather_dp(values))
