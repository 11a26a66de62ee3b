"""Whole-world collectives of the trainer's control flow (barriers, agreement on stopping), this
process's rank, and the world size the launcher started.

No-ops in a single process, so single-process runs take the same code path.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from fastrl.distributed.collectives import comm_device, computed_on_source

T = TypeVar("T")


def _multi() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    """Wait for every rank."""
    if _multi():
        dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` of rank ``src`` on every rank (pickled)."""
    if not _multi():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def computed_on_rank0(fn: Callable[[], T], *, what: str) -> T:
    """``fn()`` run on global rank 0 only, its picklable result on every rank; an exception it
    raises is raised on every rank (:func:`fastrl.distributed.collectives.computed_on_source`, whose
    rules apply). ``fn()`` in a single process. Collective."""
    return computed_on_source(fn, group=dist.group.WORLD if _multi() else None, src=0, what=what)


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one (a MAX all-reduce of one int)."""
    if not _multi():
        return bool(flag)
    value = torch.tensor([int(bool(flag))], dtype=torch.int64, device=comm_device(dist.group.WORLD, torch.device("cpu")))
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def max_over_ranks(value: float) -> float:
    """The largest ``value`` over every rank (a MAX all-reduce of one float64): the same number on
    every rank, e.g. the step's time as its slowest rank measured it, so that decisions taken on a
    running sum of it (a training-time budget, a checkpoint grid) agree on every rank."""
    if not _multi():
        return float(value)
    box = torch.tensor([float(value)], dtype=torch.float64, device=comm_device(dist.group.WORLD, torch.device("cpu")))
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return float(box.item())


def rank() -> int:
    """This process's global rank (0 without a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def launched_world_size() -> int:
    """How many processes the launcher started, read from its environment (usable before the
    process group exists; collective under MPI)."""
    from fastrl.distributed.launch import launch_info_from_env

    return launch_info_from_env().world_size
