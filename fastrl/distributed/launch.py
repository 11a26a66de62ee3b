"""Which launcher started this process, and the torch.distributed ``env://`` variables it implies.

Supported launchers, checked in this order (the first that matches wins):

``torchrun``
    ``TORCHELASTIC_RUN_ID`` is set, or all of ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` are. The variables are taken as they are. Under ``srun`` + ``torchrun`` the
    ``SLURM_*`` variables describe the per-node torchrun agents, not the trainer processes, so
    torchrun takes precedence over Slurm.
``mpi``
    ``OMPI_COMM_WORLD_RANK`` (``mpirun``), ``PMIX_RANK`` (``srun --mpi=pmix``) or ``PMI_RANK``.
    Rank and world size come from ``MPI.COMM_WORLD`` (mpi4py); the local rank counts the lower
    ranks on the same host; rank 0 picks the master address (its host name, or ``MASTER_ADDR``)
    and a free TCP port (or ``MASTER_PORT``) and broadcasts both over MPI.
``slurm``
    Inside an ``srun`` job step (``SLURM_STEP_ID`` and ``SLURM_PROCID`` set). Rank =
    ``SLURM_PROCID``, world size = ``SLURM_STEP_NUM_TASKS``, local rank = ``SLURM_LOCALID``, master
    address = first host of ``SLURM_STEP_NODELIST`` (where task 0 runs with Slurm's default block
    distribution), master port = ``MASTER_PORT`` or derived from the job and step id. The batch
    script itself (the batch step) has no ``SLURM_STEP_ID`` and is treated as a single process.
``single``
    None of the above: rank 0 of 1 on ``127.0.0.1`` and a free port.

:func:`init_process_group_from_env` is what the trainer calls; :func:`mpi_allgatherv` is a
host-side gather of ragged NumPy arrays (pruning metadata) over an MPI communicator, the
alternative to ``torch.distributed.all_gather_object``; :func:`mpi_comm_for_group` builds the MPI
communicator that matches a torch process group (e.g. the data-parallel group).

Fail-fast under MPI: MPI is imported without automatic ``MPI_Finalize`` at exit (see
:func:`import_mpi`), so a rank that fails exits at once and the launcher ends the job; the trainer
calls :func:`finalize_mpi` on its clean exit path only.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import sys
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Mapping, MutableMapping, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from mpi4py import MPI

Launcher = Literal["torchrun", "mpi", "slurm", "single"]

#: Environment variables whose presence means an MPI launcher started this process.
MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
#: Ports derived from the Slurm job id lie in [SLURM_PORT_BASE, SLURM_PORT_BASE + SLURM_PORT_SPAN).
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 20000


class LaunchError(RuntimeError):
    """The launcher's environment is incomplete or inconsistent; the message names the variable."""


@dataclass(frozen=True, kw_only=True)
class LaunchInfo:
    """Where this process sits in the job, as torch.distributed's ``env://`` init needs it."""

    launcher: Launcher
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise LaunchError(f"{self.launcher}: world size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise LaunchError(f"{self.launcher}: rank {self.rank} is outside [0, {self.world_size})")
        if self.local_rank < 0:
            raise LaunchError(f"{self.launcher}: local rank must be >= 0, got {self.local_rank}")
        if not 0 < self.master_port < 65536:
            raise LaunchError(f"{self.launcher}: master port {self.master_port} is not a TCP port")

    def torch_env(self) -> dict[str, str]:
        """The variables ``torch.distributed.init_process_group(init_method='env://')`` reads."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


# --------------------------------------------------------------------------------------------
# Detection
# --------------------------------------------------------------------------------------------


def detect_launcher(env: Mapping[str, str] | None = None) -> Launcher:
    """Name of the launcher that started this process (see the module docstring for the rules)."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env or all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return "torchrun"
    if any(k in env for k in MPI_RANK_VARIABLES):
        return "mpi"
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:
        return "slurm"
    return "single"


def launch_info_from_env(env: Mapping[str, str] | None = None, *, comm: Any = None) -> LaunchInfo:
    """Rank, world size, local rank and master address/port of this process.

    Args:
        env: the environment to read (default ``os.environ``).
        comm: MPI communicator for the ``mpi`` launcher (default ``mpi4py.MPI.COMM_WORLD``);
            collective: every rank of it must call this function.

    Raises:
        LaunchError: a variable the detected launcher needs is missing or malformed.
    """
    env = os.environ if env is None else env
    launcher = detect_launcher(env)
    if launcher == "torchrun":
        return _from_torchrun(env)
    if launcher == "mpi":
        return _from_mpi(env, comm)
    if launcher == "slurm":
        return _from_slurm(env)
    return LaunchInfo(
        launcher="single",
        rank=0,
        world_size=1,
        local_rank=0,
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", "single") if "MASTER_PORT" in env else free_port(),
    )


def _int(env: Mapping[str, str], key: str, launcher: str) -> int:
    if key not in env:
        raise LaunchError(f"{launcher} launch: environment variable {key} is not set")
    try:
        return int(env[key])
    except ValueError:
        raise LaunchError(f"{launcher} launch: {key}={env[key]!r} is not an integer") from None


def _from_torchrun(env: Mapping[str, str]) -> LaunchInfo:
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if key not in env:
            raise LaunchError(
                f"torchrun launch (TORCHELASTIC_RUN_ID={env.get('TORCHELASTIC_RUN_ID')!r}): "
                f"environment variable {key} is not set"
            )
    return LaunchInfo(
        launcher="torchrun",
        rank=_int(env, "RANK", "torchrun"),
        world_size=_int(env, "WORLD_SIZE", "torchrun"),
        local_rank=_int(env, "LOCAL_RANK", "torchrun") if "LOCAL_RANK" in env else 0,
        master_addr=env["MASTER_ADDR"],
        master_port=_int(env, "MASTER_PORT", "torchrun"),
    )


def _from_slurm(env: Mapping[str, str]) -> LaunchInfo:
    world = _int(env, "SLURM_STEP_NUM_TASKS", "slurm") if "SLURM_STEP_NUM_TASKS" in env else _int(env, "SLURM_NTASKS", "slurm")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if "MASTER_ADDR" in env:
        addr = env["MASTER_ADDR"]
    elif nodelist:
        addr = expand_hostlist(nodelist)[0]
    else:
        raise LaunchError("slurm launch: neither SLURM_STEP_NODELIST nor MASTER_ADDR is set")
    if "MASTER_PORT" in env:
        port = _int(env, "MASTER_PORT", "slurm")
    else:
        port = slurm_master_port(_int(env, "SLURM_JOB_ID", "slurm"), _int(env, "SLURM_STEP_ID", "slurm"))
    return LaunchInfo(
        launcher="slurm",
        rank=_int(env, "SLURM_PROCID", "slurm"),
        world_size=world,
        local_rank=_int(env, "SLURM_LOCALID", "slurm"),
        master_addr=addr,
        master_port=port,
    )


def slurm_master_port(job_id: int, step_id: int) -> int:
    """A port every task of a step computes alike: ``20000 + (job_id * 7 + step_id) mod 20000``.

    The first seven steps of a job, and jobs with nearby ids, get different ports. Set ``MASTER_PORT`` when
    the range [20000, 40000) is not free on the cluster's nodes.
    """
    return SLURM_PORT_BASE + (job_id * 7 + step_id) % SLURM_PORT_SPAN


def _from_mpi(env: Mapping[str, str], comm: Any) -> LaunchInfo:
    if comm is None:
        try:
            MPI = import_mpi()
        except ImportError as err:  # pragma: no cover - mpi4py is a requirement
            raise LaunchError(
                f"MPI launch detected ({', '.join(k for k in MPI_RANK_VARIABLES if k in env)} set) "
                f"but mpi4py cannot be imported: {err}"
            ) from err
        comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    # Local rank: how many lower ranks run on the same host (what a shared-memory split gives).
    hosts = comm.allgather(socket.gethostname())
    local_rank = hosts[:rank].count(hosts[rank])
    endpoint = None
    if rank == 0:
        addr = env.get("MASTER_ADDR") or hosts[0]
        port = _int(env, "MASTER_PORT", "mpi") if "MASTER_PORT" in env else free_port()
        endpoint = (addr, port)
    addr, port = comm.bcast(endpoint, root=0)
    return LaunchInfo(
        launcher="mpi", rank=rank, world_size=world, local_rank=local_rank, master_addr=addr, master_port=port
    )


def import_mpi() -> Any:
    """``mpi4py.MPI``, imported so that MPI is *not* finalized automatically at exit.

    ``MPI_Finalize`` waits for every rank (Open MPI with PMIx runs a fence), so a rank that exits
    with an error would block in it at exit instead of exiting, and ``srun --kill-on-bad-exit`` /
    ``mpirun`` could not end the job: a failing rank must simply exit. A clean exit calls
    :func:`finalize_mpi` (``mpirun`` reports a process that exits without it as an error).
    A warning is issued when ``mpi4py.MPI`` was already imported with automatic finalization.
    """
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.finalize = False
    elif mpi4py.rc.finalize is not False:
        warnings.warn(
            "mpi4py.MPI was imported before fastrl.distributed.launch with automatic MPI_Finalize at "
            "exit; a failing rank may then block at exit instead of ending the job. Import "
            "fastrl.distributed.launch.import_mpi() first, or set mpi4py.rc.finalize = False.",
            stacklevel=3,
        )
    from mpi4py import MPI

    return MPI


def finalize_mpi() -> None:
    """``MPI_Finalize`` on a clean exit (a no-op when MPI was never initialized or is finalized).

    Collective: every rank must call it. Never call it on an error path (see :func:`import_mpi`).
    """
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


def free_port(host: str = "") -> int:
    """A TCP port that was free a moment ago on this host (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------------------------
# Slurm host lists
# --------------------------------------------------------------------------------------------

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm host list, as ``scontrol show hostnames`` does.

    ``"gpu[01-03,07],login1"`` -> ``["gpu01", "gpu02", "gpu03", "gpu07", "login1"]``. Zero padding
    of a range is kept (``[08-10]`` -> ``08, 09, 10``); several bracket groups in one name expand as
    a product (``r[1-2]n[1-2]`` -> ``r1n1, r1n2, r2n1, r2n2``).

    Raises:
        LaunchError: unbalanced brackets, an empty or descending range, or an empty host list.
    """
    names: list[str] = []
    for item in _split_top_level(hostlist):
        names.extend(_expand_one(item, hostlist))
    if not names:
        raise LaunchError(f"empty Slurm host list {hostlist!r}")
    return names


def _split_top_level(hostlist: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(hostlist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise LaunchError(f"unbalanced ']' at position {i} of Slurm host list {hostlist!r}")
        elif ch == "," and depth == 0:
            items.append(hostlist[start:i])
            start = i + 1
    if depth != 0:
        raise LaunchError(f"unbalanced '[' in Slurm host list {hostlist!r}")
    items.append(hostlist[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_one(item: str, hostlist: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, body, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    values: list[str] = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise LaunchError(f"bad range {part!r} in Slurm host list {hostlist!r}")
        lo, hi = match.group(1), match.group(2) or match.group(1)
        if int(hi) < int(lo):
            raise LaunchError(f"descending range {part!r} in Slurm host list {hostlist!r}")
        width = len(lo) if lo.startswith("0") else 0
        values.extend(str(v).zfill(width) for v in range(int(lo), int(hi) + 1))
    tails = _expand_one(rest, hostlist) if rest else [""]
    return [f"{prefix}{v}{t}" for v in values for t in tails]


# --------------------------------------------------------------------------------------------
# torch.distributed
# --------------------------------------------------------------------------------------------


def export_torch_env(info: LaunchInfo, env: MutableMapping[str, str] | None = None) -> None:
    """Write ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` into ``env``.

    Raises:
        LaunchError: ``env`` already holds a different value for one of them (for example a
            ``MASTER_PORT`` exported by hand that disagrees with the MPI broadcast); nothing is
            overwritten silently.
    """
    env = os.environ if env is None else env
    wanted = info.torch_env()
    for key, value in wanted.items():
        if key in env and env[key] != value:
            raise LaunchError(
                f"{info.launcher} launch: {key}={env[key]!r} is already set but the launcher says {value!r}; "
                f"unset {key} or launch with a matching value"
            )
    env.update(wanted)


def init_process_group_from_env(
    backend: str = "gloo", *, timeout: datetime.timedelta | None = None, comm: Any = None
) -> LaunchInfo:
    """Detect the launcher, export the ``env://`` variables and initialize torch.distributed.

    Args:
        backend: ``"gloo"`` or ``"nccl"`` (passed to ``torch.distributed.init_process_group``).
        timeout: collective timeout (default: torch's).
        comm: MPI communicator for the ``mpi`` launcher (default ``MPI.COMM_WORLD``).

    Returns:
        The :class:`LaunchInfo` used. Under MPI, torch rank == ``comm`` rank.

    Raises:
        LaunchError: see :func:`launch_info_from_env`, or a process group already initialized.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        raise LaunchError("torch.distributed is already initialized; init_process_group_from_env runs once")
    info = launch_info_from_env(comm=comm)
    export_torch_env(info)
    kwargs: dict[str, Any] = {"backend": backend, "init_method": "env://", "rank": info.rank, "world_size": info.world_size}
    if timeout is not None:
        kwargs["timeout"] = timeout
    dist.init_process_group(**kwargs)
    return info


# --------------------------------------------------------------------------------------------
# MPI host-side collectives
# --------------------------------------------------------------------------------------------


def mpi_comm_for_group(ranks: Sequence[int], comm: "MPI.Comm | None" = None) -> "MPI.Comm":
    """The sub-communicator of ``comm`` holding ``ranks``, in that order.

    Collective over ``comm``: every rank calls it with the ranks of *its own* group, e.g.
    ``torch.distributed.get_process_group_ranks(dp_group)``; groups must partition ``comm``. Rank
    ``i`` of the result is ``ranks[i]``, so gathers return data in the torch group's rank order.

    Raises:
        LaunchError: this process's rank is not in ``ranks``.
    """
    if comm is None:
        comm = import_mpi().COMM_WORLD
    ranks = [int(r) for r in ranks]
    me = comm.Get_rank()
    if me not in ranks:
        raise LaunchError(f"MPI rank {me} is not in the group {ranks} it was asked to join")
    return comm.Split(color=min(ranks), key=ranks.index(me))


def mpi_allgatherv(array: np.ndarray, comm: "MPI.Comm") -> list[np.ndarray]:
    """Gather one ragged array per rank onto every rank (``MPI_Allgatherv``).

    Args:
        array: this rank's array, shape ``(n_r, *trailing)``; ``n_r`` may differ per rank (0 too),
            ``trailing`` and the dtype must agree across ranks. Numeric or bool dtypes only.
        comm: the communicator (e.g. from :func:`mpi_comm_for_group` over the data-parallel group).

    Returns:
        ``comm.Get_size()`` arrays, element ``r`` equal to rank ``r``'s input (same dtype and shape).

    Raises:
        ValueError: an object/string dtype, a 0-d array, or ranks that disagree on dtype or
            trailing shape (the message lists every rank's dtype and shape).
    """
    array = np.ascontiguousarray(array)
    if array.ndim == 0:
        raise ValueError("mpi_allgatherv needs an array with a leading dimension, got a 0-d array")
    if array.dtype.kind not in "biufc":
        raise ValueError(f"mpi_allgatherv supports numeric and bool arrays, got dtype {array.dtype}")
    metas = comm.allgather((array.dtype.str, array.shape))
    dtypes = {m[0] for m in metas}
    trailing = {tuple(m[1][1:]) for m in metas}
    if len(dtypes) != 1 or len(trailing) != 1:
        listing = ", ".join(f"rank {r}: {np.dtype(d)} {tuple(s)}" for r, (d, s) in enumerate(metas))
        raise ValueError(f"mpi_allgatherv: ranks disagree on dtype or trailing shape ({listing})")
    counts = [int(np.prod(shape, dtype=np.int64)) for _, shape in metas]
    recv = np.empty(sum(counts), dtype=array.dtype)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    comm.Allgatherv(array.reshape(-1), [recv, (counts, displs)])
    return [recv[d : d + c].reshape(shape) for d, c, (_, shape) in zip(displs, counts, metas)]
