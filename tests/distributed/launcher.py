"""Run a function on several CPU processes joined by a gloo process group (torch.distributed).

``run_distributed(fn, world_size, *args)`` spawns ``world_size`` processes, sets the launcher
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``), calls
``fn(*args, **kwargs)`` in each and returns the per-rank results (picklable) in rank order. An exception in
any rank is re-raised in the caller with that rank's traceback.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(rank: int, world_size: int, port: int, fn: Callable, args: tuple, kwargs: dict, results: Any) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
    )  # fmt: skip
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    try:
        results.put((rank, True, pickle.dumps(fn(*args, **kwargs))))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, traceback.format_exc()))
    finally:
        from fastrl.distributed import parallel_state

        parallel_state.destroy()


#: attempts of :func:`run_distributed` when rank 0 cannot listen on the port it was given
PORT_ATTEMPTS = 3


def run_distributed(fn: Callable, world_size: int, *args: Any, timeout_s: float = 150.0, **kwargs: Any) -> list[Any]:
    """``[fn(*args, **kwargs) on rank 0, ..., on rank world_size - 1]``.

    The port is free when chosen but may be taken before rank 0 listens on it (another test running
    beside this one: ``EADDRINUSE``, seen under ``make test``'s two workers); the ranks then start
    again on a new port, at most :data:`PORT_ATTEMPTS` times.

    Raises:
        RuntimeError: a rank raised (its traceback is in the message) or did not finish in time.
    """
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return _run_once(fn, world_size, args, kwargs, timeout_s)
        except RuntimeError as error:
            if "EADDRINUSE" not in str(error) or attempt == PORT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _run_once(fn: Callable, world_size: int, args: tuple, kwargs: dict, timeout_s: float) -> list[Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_child, args=(r, world_size, port, fn, args, kwargs, results)) for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            rank, ok, value = results.get(timeout=timeout_s)
            if ok:
                out[rank] = pickle.loads(value)
            else:
                errors.append(f"rank {rank}:\n{value}")
                break
    except queue.Empty:
        errors.append(f"ranks {sorted(set(range(world_size)) - set(out))} did not finish within {timeout_s} s")
    finally:
        for p in procs:
            p.join(timeout=5 if errors else 60)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RuntimeError("distributed test failed on " + "\n".join(errors))
    return [out[r] for r in range(world_size)]
