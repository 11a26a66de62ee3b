"""The collectives the trainer uses, each over an explicit megatron-core group.

Every function is a no-op (or an identity) when its group has one member, so single-process runs
take the same code path.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Sequence, TypeVar

import torch
import torch.distributed as dist

_WIDENED = (torch.int16, torch.int8, torch.uint8, torch.bool)

T = TypeVar("T")


def _dist_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


def comm_device(group: dist.ProcessGroup | None, like: torch.device) -> torch.device:
    """Where a tensor must be for a collective over ``group``: the current CUDA device for NCCL,
    ``like`` (the tensor's own device) for gloo. Callers move there and back, so the trainer may
    keep batches and metrics on the CPU under either backend."""
    if group is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return like


def dp_group() -> dist.ProcessGroup | None:
    """megatron-core's data-parallel group of this rank (None without torch.distributed)."""
    if not _dist_ready():
        return None
    from megatron.core import parallel_state as mpu

    return mpu.get_data_parallel_group()


def dp_size() -> int:
    group = dp_group()
    return 1 if group is None else dist.get_world_size(group)


def dp_rank() -> int:
    group = dp_group()
    return 0 if group is None else dist.get_rank(group)


def pipeline_is_last_stage() -> bool:
    if not _dist_ready():
        return True
    from megatron.core import parallel_state as mpu

    return mpu.is_pipeline_last_stage()


def pipeline_size() -> int:
    """Pipeline-parallel stages of this rank's model replica (1 without torch.distributed)."""
    if not _dist_ready():
        return 1
    from megatron.core import parallel_state as mpu

    return mpu.get_pipeline_model_parallel_world_size()


def all_reduce_sum_dp(value: torch.Tensor) -> torch.Tensor:
    """Sum of ``value`` over the data-parallel group (a new tensor on ``value``'s device)."""
    return all_reduce_dp(value, "sum")


def all_reduce_dp(value: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``value`` reduced over the data-parallel group with ``op`` in {'sum', 'max', 'min'}."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if op not in ops:
        raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
    group = dp_group()
    if group is None or dist.get_world_size(group) == 1:
        return value.detach().clone()
    out = value.detach().to(comm_device(group, value.device), copy=True)
    dist.all_reduce(out, op=ops[op], group=group)
    return out.to(value.device)


def all_gather_dp(value: torch.Tensor) -> list[torch.Tensor]:
    """One tensor per DP rank (in DP-rank order) from tensors of possibly different first dimension.

    Shapes beyond the first dimension and the dtype must agree across ranks. Moves the first
    dimension sizes (one int64 per rank) and then ``max_rows x row_bytes`` per rank.
    """
    group = dp_group()
    if group is None or dist.get_world_size(group) == 1:
        return [value.detach().clone()]
    if value.dtype in _WIDENED:  # gloo cannot gather these dtypes: exchange them as int32
        return [t.to(value.dtype) for t in all_gather_dp(value.to(torch.int32))]
    world = dist.get_world_size(group)
    device = comm_device(group, value.device)
    n = torch.tensor([value.shape[0]], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=group)
    counts = [int(s.item()) for s in sizes]
    rows = max(counts)
    padded = torch.zeros((rows, *value.shape[1:]), dtype=value.dtype, device=device)
    padded[: value.shape[0]] = value.detach()
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    return [t[:c].to(value.device) for t, c in zip(out, counts)]


def all_gather_objects_dp(obj: Any) -> list[Any]:
    """Picklable objects, one per DP rank in DP-rank order."""
    group = dp_group()
    if group is None or dist.get_world_size(group) == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def exchange_objects_dp(outgoing: Sequence[Any], counts: Sequence[Sequence[int]]) -> list[Any]:
    """Point-to-point exchange of picklable objects inside the DP group.

    Args:
        outgoing: ``outgoing[d]`` is sent to DP rank ``d`` when ``counts[me][d] > 0`` and ``d != me``.
        counts: ``counts[s][d]``, the same matrix on every rank (items rank ``s`` sends to ``d``);
            pairs with zero items exchange nothing.

    Returns:
        ``incoming[s]``: the object DP rank ``s`` sent here (None where nothing was sent).

    Every rank walks the (sender, receiver) pairs in the same order, so the blocking sends and
    receives cannot deadlock.
    """
    group = dp_group()
    world = 1 if group is None else dist.get_world_size(group)
    incoming: list[Any] = [None] * world
    if world == 1:
        return incoming
    me = dist.get_rank(group)
    for src in range(world):
        for dst in range(world):
            if src == dst or counts[src][dst] == 0 or me not in (src, dst):
                continue
            if me == src:
                dist.send_object_list([outgoing[dst]], dst=dist.get_global_rank(group, dst), group=group)
            else:
                box: list[Any] = [None]
                dist.recv_object_list(box, src=dist.get_global_rank(group, src), group=group)
                incoming[src] = box[0]
    return incoming


def broadcast_from_last_pipeline_stage(
    tensor: torch.Tensor | None,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``tensor`` (given on the last pipeline stage) on every stage of this pipeline.

    Args:
        tensor: the value on the last stage; ignored (may be None) elsewhere.
        shape, dtype: of the tensor, known on every stage; device: where it lives.
    """
    if not _dist_ready():
        assert tensor is not None
        return tensor
    from megatron.core import parallel_state as mpu

    if mpu.get_pipeline_model_parallel_world_size() == 1:
        assert tensor is not None
        return tensor
    group = mpu.get_pipeline_model_parallel_group()
    on = comm_device(group, torch.device(device))
    if mpu.is_pipeline_last_stage():
        buf = tensor.detach().to(device=on, dtype=dtype).contiguous()
    else:
        buf = torch.empty(tuple(shape), dtype=dtype, device=on)
    dist.broadcast(buf, src=mpu.get_pipeline_model_parallel_last_rank(), group=group)
    return buf.to(device)


def broadcast_object_from_last_pipeline_stage(obj: Any) -> Any:
    """A picklable object given on the last pipeline stage, on every stage of this pipeline."""
    if not _dist_ready():
        return obj
    from megatron.core import parallel_state as mpu

    if mpu.get_pipeline_model_parallel_world_size() == 1:
        return obj
    box = [obj if mpu.is_pipeline_last_stage() else None]
    dist.broadcast_object_list(
        box, src=mpu.get_pipeline_model_parallel_last_rank(), group=mpu.get_pipeline_model_parallel_group()
    )
    return box[0]


def model_parallel_group() -> dist.ProcessGroup | None:
    """megatron-core's model-parallel group (the TP x PP ranks that hold one model replica; one DP
    rank's worth of ranks); None without torch.distributed."""
    if not _dist_ready():
        return None
    from megatron.core import parallel_state as mpu

    return mpu.get_model_parallel_group()


def model_parallel_size() -> int:
    group = model_parallel_group()
    return 1 if group is None else dist.get_world_size(group)


def is_model_parallel_source() -> bool:
    """True on the first rank of this model-parallel group (TP rank 0 of pipeline stage 0), the rank
    that produces what :func:`broadcast_object_model_parallel` hands to its peers; True without
    model parallelism."""
    group = model_parallel_group()
    return group is None or dist.get_rank(group) == 0


def broadcast_object_model_parallel(obj: Any) -> Any:
    """A picklable object given on the first rank of this model-parallel group (see
    :func:`is_model_parallel_source`), on every rank of the group; ``obj`` itself (no communication)
    when the group has one member. Other ranks' ``obj`` is ignored (pass None).

    The peers first wait for the first rank on the wait group
    (:func:`fastrl.distributed.parallel_state.model_parallel_wait_group`: gloo, NCCL runs only), so
    that however long it worked alone (engine start, generation) no peer sits in an NCCL collective."""
    from fastrl.distributed.parallel_state import model_parallel_wait_group

    group = model_parallel_group()
    if group is None or dist.get_world_size(group) == 1:
        return obj
    wait = model_parallel_wait_group()
    if wait is not None:
        dist.barrier(group=wait)
    box = [obj if dist.get_rank(group) == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]


def all_gather_objects_model_parallel(obj: Any) -> list[Any]:
    """Picklable objects, one per rank of this model-parallel group in group-rank order (the first
    is the source's, :func:`is_model_parallel_source`); ``[obj]`` without model parallelism."""
    group = model_parallel_group()
    if group is None or dist.get_world_size(group) == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


# ---- the source computes, the group receives ------------------------------------------------------


def computed_on_source(fn: Callable[[], T], *, group: dist.ProcessGroup | None, src: int = 0, what: str) -> T:
    """``fn()`` run on rank ``src`` of ``group`` only, its result on every rank of the group.

    If ``fn`` raises (an ``Exception``), every rank raises: the source its own exception, with its
    traceback, once the group has been sent a copy; the other ranks that copy (same type, arguments
    and message, with a note naming ``what`` and the source), or a ``RuntimeError`` naming its type
    and message when it does not survive pickling. So no rank waits for a value that will not come,
    and the group's next collective lines up on every rank. A ``BaseException`` that is not an
    ``Exception`` (``KeyboardInterrupt``, ``SystemExit``) is not shared.

    Args:
        fn: no arguments; run on the source only. Its result must be picklable (it travels by
            ``torch.distributed.broadcast_object_list``) and must not be an exception.
        group: the process group; None or a group of one member: ``fn()`` here, no communication.
        src: the source's rank within ``group``.
        what: the computation's name in the other ranks' errors ("the refit probe").

    Raises:
        Exception: whatever ``fn`` raised on the source, on every rank of the group.
        TypeError: ``fn`` returned an exception instead of raising it.

    Collective over ``group``: every rank calls it, in the same order as the group's other collectives.
    """
    if group is None or dist.get_world_size(group) == 1:
        return fn()
    source = dist.get_global_rank(group, src)

    def broadcast(obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=source, group=group)
        return box[0]

    return _shared_from_source(fn, is_source=dist.get_rank(group) == src, broadcast=broadcast,
                               where=f"{what} on global rank {source}")


def computed_on_model_parallel_source(fn: Callable[[], T], *, what: str) -> T:
    """:func:`computed_on_source` over this rank's model-parallel group, the source being its first
    rank (:func:`is_model_parallel_source`: the rank that holds the rollout engine); the peers first
    wait on the wait group (:func:`broadcast_object_model_parallel`). ``fn()`` alone without model
    parallelism."""
    if model_parallel_size() == 1:
        return fn()
    return _shared_from_source(fn, is_source=is_model_parallel_source(), broadcast=broadcast_object_model_parallel,
                               where=f"{what} on the first rank of the model-parallel group")


def computed_on_last_pipeline_stage(fn: Callable[[], T], *, what: str) -> T:
    """:func:`computed_on_source` over this rank's pipeline, the source being its last stage (the one
    holding the loss and the log-probs); ``fn()`` alone without pipeline parallelism."""
    if pipeline_size() == 1:
        return fn()
    return _shared_from_source(fn, is_source=pipeline_is_last_stage(), broadcast=broadcast_object_from_last_pipeline_stage,
                               where=f"{what} on the last pipeline stage")


def _shared_from_source(fn: Callable[[], T], *, is_source: bool, broadcast: Callable[[Any], Any], where: str) -> T:
    """The protocol of :func:`computed_on_source`: ``broadcast(obj)`` sends the source's ``obj`` and
    returns it on every rank (the other ranks pass None)."""
    if not is_source:
        shared = broadcast(None)
        if isinstance(shared, BaseException):
            raise shared
        return shared
    try:
        result = fn()
        if isinstance(result, BaseException):
            raise TypeError(f"{where}: the function returned the exception {result!r}; raise it instead")
    except Exception as err:
        broadcast(_portable_error(err, where))
        raise
    broadcast(result)
    return result


def _portable_error(err: Exception, where: str) -> Exception:
    """A copy of ``err`` that survives pickling (same type and arguments; a note names ``where``),
    or a ``RuntimeError`` naming its type and message when it does not."""
    try:
        copy = pickle.loads(pickle.dumps(err))
    except Exception:  # noqa: BLE001 - an unpicklable exception, or one whose __init__ its args do not fit
        return RuntimeError(f"{type(err).__name__} raised by {where}: {err}")
    copy.add_note(f"raised by {where}")
    return copy
