"""Worker of tests/distributed/test_run_dir_lock.py (importable by spawned processes)."""

from __future__ import annotations

from pathlib import Path


def lock_worker(run_dir: Path) -> str:
    """``lock_run_dir`` on this rank of a gloo world: ``"locked"``, ``"not rank 0"`` or the refusal."""
    import torch.distributed as dist

    from fastrl.checkpoint.run_lock import RunDirLocked
    from fastrl.training.run import lock_run_dir

    dist.init_process_group("gloo")
    try:
        lock = lock_run_dir(run_dir, dist.get_rank())
    except RunDirLocked as err:
        return f"refused: {err}"
    if lock is None:
        return "not rank 0"
    lock.release()
    return "locked"
