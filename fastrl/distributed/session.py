"""Start and end a process's part of a distributed job in one place (trainer, tools, benchmarks).

    with distributed_session(parallel, seed=1234) as ctx:
        ...  # ctx: the ParallelContext (ranks, sizes, DP group, device)

Entry: under ``srun`` or ``mpirun`` the ``env://`` variables torch.distributed reads are exported
from the launcher's (torchrun sets them itself; a single process needs none), then
:func:`fastrl.distributed.parallel_state.initialize` sets up the process groups, megatron's parallel
state and RNG tracker (and, on CPU, the :mod:`fastrl.compat` patches).

Exit: megatron's parallel state and the process group are always torn down. ``MPI_Finalize`` runs
only when the block ends without an exception: it waits for every rank, so a failing rank must exit
without it for the launcher to end the job (see :func:`fastrl.distributed.launch.import_mpi`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from fastrl.config import ParallelConfig
from fastrl.distributed.launch import LaunchInfo, export_torch_env, finalize_mpi, launch_info_from_env
from fastrl.distributed.parallel_state import ParallelContext, destroy, initialize


def export_launch_env() -> LaunchInfo:
    """Under ``srun`` or ``mpirun``, set the ``env://`` variables torch.distributed reads (torchrun
    sets them; :func:`~fastrl.distributed.parallel_state.initialize` handles a single process).

    Collective under MPI (every rank must call it). Returns the detected launch.

    Raises:
        LaunchError: the launcher's environment is incomplete or disagrees with what is set.
    """
    info = launch_info_from_env()
    if info.launcher in ("slurm", "mpi"):
        export_torch_env(info)
    return info


@contextlib.contextmanager
def distributed_session(
    parallel: ParallelConfig, *, seed: int, timeout_s: float = 600.0, wait_timeout_s: float | None = None,
) -> Iterator[ParallelContext]:
    """This process's place in the TP x PP x DP grid, for the duration of the ``with`` block.

    Args:
        parallel: TP / PP sizes and the backend choice (see :func:`parallel_state.initialize`).
        seed: seed of megatron's RNG tracker.
        timeout_s: collective timeout.
        wait_timeout_s: the model-parallel wait group's timeout (see :func:`parallel_state.initialize`).

    Yields:
        The :class:`~fastrl.distributed.parallel_state.ParallelContext`.

    Raises:
        LaunchError / ConfigError / RuntimeError: see :func:`export_launch_env` and
            :func:`~fastrl.distributed.parallel_state.initialize`; exceptions of the block propagate
            after the teardown.
    """
    export_launch_env()
    try:
        yield initialize(parallel, seed=seed, timeout_s=timeout_s, wait_timeout_s=wait_timeout_s)
    finally:
        destroy()
    finalize_mpi()
