"""Two gloo processes scatter the column halves of a matrix (``torch.chunk(dim=1)`` views, as
megatron-bridge splits a row-parallel weight), once as they are and once made contiguous (the
``fastrl.compat.megatron_bridge`` fix), and report whether each rank received its half.

    python _gloo_scatter.py

Prints one JSON line: ``{"views": [rank 0 ok, rank 1 ok], "contiguous": [rank 0 ok, rank 1 ok]}``.
"""

from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        full = torch.arange(24.0).reshape(4, 6)
        views = list(torch.chunk(full, 2, dim=1))
        got = {}
        for name, splits in (("views", views), ("contiguous", [v.contiguous() for v in views])):
            out = torch.empty(4, 3)
            dist.scatter(out, splits if rank == 0 else None, src=0)
            got[name] = torch.equal(out, views[rank])
        results.put((rank, got))
    finally:
        dist.destroy_process_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in range(2))
    for p in procs:
        p.join(30)
    print(json.dumps({name: [got[r][name] for r in range(2)] for name in ("views", "contiguous")}))


if __name__ == "__main__":
    main()
