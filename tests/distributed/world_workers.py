"""Worker of tests/distributed/test_world_max.py (importable by spawned processes)."""

from __future__ import annotations


def budget_worker(step_seconds_by_rank: list[list[float]], budget: float) -> list[bool]:
    """Each rank adds its own step times as the training loop does (through ``max_over_ranks``) and
    decides after each step whether the training-time budget is spent."""
    import torch.distributed as dist

    from fastrl.distributed import world
    from fastrl.training.time_grid import time_budget_spent

    dist.init_process_group("gloo")
    try:
        mine = step_seconds_by_rank[dist.get_rank()]
        total, decisions = 0.0, []
        for seconds in mine:
            total += world.max_over_ranks(seconds)
            decisions.append(time_budget_spent(budget, total))
        return decisions
    finally:
        dist.destroy_process_group()
