"""The GPU memory torch allocates beyond the outputs of an all-gather, in its two forms.

The memory plan's save phase (:func:`fastrl.models.memory_plan.save_gather_gib`) assumes that an
``all_gather`` into a list of separate tensors -- what megatron-core's ``fully_reshardable`` save
calls -- goes through one flat output buffer that torch allocates and copies out of, while an
``all_gather_into_tensor`` into one flat tensor needs none. :func:`staging_probe` measures both on a
real process group, one shard size at a time; ``bench/gpu_memory_timeline.py`` runs it on one GPU.

Unlike :mod:`fastrl.distributed.collectives` (whose collectives are identities over a group of one
rank), these always call torch.distributed, so that a one-rank NCCL group on a single GPU runs the
backend's own code path.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist


def _peak_extra_bytes(fn: Callable[[], Any], cuda: bool) -> int | None:
    """Peak bytes torch's CUDA allocator held beyond what was allocated before ``fn`` ran (None off CUDA)."""
    if not cuda:
        fn()
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def gather_staging(nbytes: int, device: torch.device, group: dist.ProcessGroup | None = None) -> dict[str, Any]:
    """One fp32 shard of ``nbytes`` bytes (rounded down to whole elements) gathered over ``group``
    (default: the world) into a list of tensors and into one flat tensor, the outputs allocated
    before each call.

    Returns:
        ``list_extra_bytes`` / ``flat_extra_bytes``: the peak bytes beyond the shard and the
        outputs (None off CUDA); ``status``: ``"ok"`` when every output holds the shard, else a
        line starting with ``"WRONG"``.
    """
    cuda = device.type == "cuda"
    world = dist.get_world_size(group)
    shard = torch.full((nbytes // 4,), 1.5, dtype=torch.float32, device=device)
    outputs = [torch.empty_like(shard) for _ in range(world)]
    list_extra = _peak_extra_bytes(lambda: dist.all_gather(outputs, shard, group=group), cuda)
    flat = torch.empty(world * shard.numel(), dtype=shard.dtype, device=device)
    flat_extra = _peak_extra_bytes(lambda: dist.all_gather_into_tensor(flat, shard, group=group), cuda)
    same = all(torch.equal(o, shard) for o in outputs) and all(torch.equal(c, shard) for c in flat.chunk(world))
    return {"list_extra_bytes": list_extra, "flat_extra_bytes": flat_extra,
            "status": "ok" if same else "WRONG: a gathered output differs from the shard"}


def staging_probe(device: torch.device, sizes: tuple[int, ...], budget_s: float,
                  group: dist.ProcessGroup | None = None) -> list[dict[str, Any]]:
    """:func:`gather_staging` for each shard size in ``sizes`` (bytes), one row each with the
    backend, the group's size, the shard's bytes and the seconds it took; a size that would start
    after ``budget_s`` seconds is skipped (its status says so), and an error becomes the row's status
    (``"out of memory: ..."`` or ``"failed: ..."``) before the next size runs. The CUDA cache is
    emptied after each size."""
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for nbytes in sizes:
        row: dict[str, Any] = {"backend": str(dist.get_backend(group)), "world_size": dist.get_world_size(group),
                               "shard_bytes": nbytes}
        rows.append(row)
        if time.perf_counter() - start > budget_s:
            row["status"] = f"skipped (the probe's {budget_s:g} s were spent)"
            continue
        t0 = time.perf_counter()
        try:
            row.update(gather_staging(nbytes, device, group))
        except Exception as error:  # noqa: BLE001 -- recorded in the row; the next size runs
            oom = isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()
            row["status"] = f"{'out of memory' if oom else 'failed'}: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
        row["seconds"] = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows
