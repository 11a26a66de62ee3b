"""One process of a launcher test: ``python dist_worker.py OUT_DIR [TP]``.

Started by mpirun, ``srun --mpi=pmix`` or plain ``srun``. It forms the torch.distributed gloo
group through :func:`fastrl.distributed.launch.init_process_group_from_env`, all-reduces
``rank + 1``, and (under MPI) gathers ragged arrays over the data-parallel groups of a TP=``TP``
layout both with :func:`mpi_allgatherv` and with ``torch.distributed.all_gather_object``. It writes
what it saw to ``OUT_DIR/rank<R>.json`` for the test to check.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from fastrl.distributed.launch import finalize_mpi, init_process_group_from_env, mpi_allgatherv, mpi_comm_for_group

LENGTHS = [3, 0, 5, 2, 1, 4]


def ragged_arrays(rank: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s pruning-metadata stand-ins: ragged lengths (one rank has none), three dtypes."""
    n = LENGTHS[rank % len(LENGTHS)]
    return {
        "advantage": (rank * 100 + np.arange(n * 3, dtype=np.float32).reshape(n, 3)) / 7,
        "index": rank * 1000 + np.arange(n, dtype=np.int64),
        "kept": (np.arange(n) + rank) % 2 == 0,
    }


def main() -> None:
    out_dir, tp = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1
    torch.set_num_threads(1)
    info = init_process_group_from_env("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    record = {
        "launcher": info.launcher,
        "rank": rank,
        "world_size": world,
        "info": {"rank": info.rank, "world_size": info.world_size, "local_rank": info.local_rank,
                 "master_addr": info.master_addr, "master_port": info.master_port},
        "all_reduce": total.item(),
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")},
    }
    if info.launcher == "mpi":
        from mpi4py import MPI

        record["mpi_rank"] = MPI.COMM_WORLD.Get_rank()
        # Data-parallel groups of a TP=tp layout (TP fastest): {r : r % tp == t}.
        groups = [list(range(t, world, tp)) for t in range(tp)]
        torch_groups = [dist.new_group(g) for g in groups]
        mine = rank % tp
        dp_comm = mpi_comm_for_group(groups[mine], MPI.COMM_WORLD)
        record["dp_group"] = groups[mine]
        record["dp_comm_rank"] = dp_comm.Get_rank()
        gathered: dict[str, dict[str, list]] = {}
        for key, array in ragged_arrays(rank).items():
            via_mpi = mpi_allgatherv(array, dp_comm)
            via_torch: list = [None] * len(groups[mine])
            dist.all_gather_object(via_torch, array, group=torch_groups[mine])
            gathered[key] = {
                "mpi": [a.tolist() for a in via_mpi],
                "torch": [a.tolist() for a in via_torch],
                "mpi_dtypes": [str(a.dtype) for a in via_mpi],
                "mpi_shapes": [list(a.shape) for a in via_mpi],
            }
        record["gathered"] = gathered
        # Ranks that disagree on the dtype get an error naming every rank's dtype and shape.
        try:
            mpi_allgatherv(np.zeros(2, dtype=np.float32 if rank == 0 else np.float64), MPI.COMM_WORLD)
            record["mismatch_error"] = None
        except ValueError as err:
            record["mismatch_error"] = str(err)
        dp_comm.Free()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()
    finalize_mpi()  # clean exit: mpirun reports a process that skips it as an error


if __name__ == "__main__":
    main()
