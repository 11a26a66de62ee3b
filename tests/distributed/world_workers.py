"""Workers of tests/distributed/test_world_max.py and test_computed_on_source.py (importable by
spawned processes)."""

from __future__ import annotations

from typing import Any


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


class KeywordOnlyError(Exception):
    """An exception pickle cannot rebuild: its ``__init__`` takes a keyword-only argument, so
    unpickling's ``KeywordOnlyError(*args)`` raises TypeError."""

    def __init__(self, *, detail: str) -> None:
        super().__init__(f"bad detail {detail}")


def computed_on_source_worker(src: int) -> dict[str, Any]:
    """Three :func:`fastrl.distributed.collectives.computed_on_source` calls over the world group
    with source ``src``, each function recording where it ran: one that returns this rank's value,
    one that raises ValueError, one that raises an exception pickle cannot rebuild; then an
    all-gather, which lines up only if every rank made the same collectives."""
    import torch.distributed as dist

    from fastrl.distributed.collectives import computed_on_source

    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        ran: list[str] = []

        def value() -> dict[str, Any]:
            ran.append("value")
            return {"from": rank, "payload": [rank] * 3}

        def fails() -> None:
            ran.append("fails")
            raise ValueError(f"no tokens on rank {rank}")

        def unpicklable() -> None:
            ran.append("unpicklable")
            raise KeywordOnlyError(detail=f"rank {rank}")

        out: dict[str, Any] = {"value": computed_on_source(value, group=dist.group.WORLD, src=src, what="the value")}
        for name, fn in (("fails", fails), ("unpicklable", unpicklable)):
            try:
                out[name] = computed_on_source(fn, group=dist.group.WORLD, src=src, what=f"the {name} case")
            except Exception as err:  # noqa: BLE001 - what each rank raised is the result
                out[name] = (type(err).__name__, str(err), list(getattr(err, "__notes__", [])))
        after: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(after, rank)
        out.update(ran=ran, after=after)
        return out
    finally:
        dist.destroy_process_group()
