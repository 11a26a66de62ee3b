"""Worker of test_short_batch_padding_dp: a short kept batch padded over two DP ranks."""

from __future__ import annotations

from typing import Any

from fastrl.config import ParallelConfig


def padded_repartition_worker(sizes: list[int], padding: int) -> dict[str, Any]:
    """Keep every rollout of a :func:`workers.make_rollouts` batch split ``sizes`` over the DP
    ranks, add ``padding`` zero-weight rows and re-partition (the trainer's short-DAPO path)."""
    import torch
    from workers import make_rollouts

    from fastrl.distributed import dp_pruning, parallel_state
    from fastrl.training.prune_phase import PruneOutcome, repartition_kept
    from fastrl.training.pruner import keep_all

    ctx = parallel_state.initialize(ParallelConfig(backend="gloo"), seed=1)
    batch, group_ids, advantages, responses = make_rollouts(2, sum(sizes) // 2)
    start = sum(sizes[: ctx.dp_rank])
    rows = list(range(start, start + sizes[ctx.dp_rank]))
    local_batch = batch.select(rows)
    local = dp_pruning.LocalPruningInputs(
        group_ids=group_ids[rows], advantages=advantages[rows], lengths=local_batch.lengths,
        response_lengths=torch.tensor([len(responses[i]) for i in rows]), responses=[responses[i] for i in rows],
    )  # fmt: skip
    inputs, result = dp_pruning.dp_global_prune(local, lambda g: keep_all(g.group_ids, g.response_lengths), dp_size=ctx.dp_size)
    mine, _ = repartition_kept(local_batch, PruneOutcome(
        inputs=inputs, keep=result.keep, kept_per_group=result.kept_per_group, padding=padding))
    return {
        "dp_rank": ctx.dp_rank,
        "input_ids": mine.input_ids,
        "response_mask": mine.response_mask,
        "advantages": mine.advantages,
        "all_input_ids": batch.input_ids,
        "all_advantages": advantages,
    }
