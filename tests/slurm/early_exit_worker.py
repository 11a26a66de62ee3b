"""``python early_exit_worker.py``: form the process group, then rank 1 fails while rank 0 hangs.

Rank 1 exits with code 3 after a message naming itself; rank 0 stands for a rank stuck in a long
computation or in a collective that never detects the lost peer (NCCL without a watchdog), so only
the launcher can end the job.
"""

from __future__ import annotations

import sys
import time

import torch.distributed as dist

from fastrl.distributed.launch import init_process_group_from_env

info = init_process_group_from_env("gloo")
dist.barrier()
print(f"rank {info.rank}: process group ready", flush=True)
if info.rank == 1:
    print("rank 1: simulated failure, exiting with code 3", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(600)
