"""Process groups: torch.distributed plus megatron-core's tensor / pipeline / data parallel state.

One call, :func:`initialize`, sets up a process for training: the default process group (NCCL with
GPUs, gloo on CPU), megatron-core's model-parallel groups for the configured TP x PP layout (the
remaining factor of the world is data parallel), and megatron's RNG tracker. On CPU it first applies
:mod:`fastrl.compat`'s CPU patches. :func:`destroy` undoes it (tests run several layouts in one
process). The returned :class:`ParallelContext` carries the sizes, ranks and the DP group that the
rest of FastRL passes around explicitly.

With NCCL and model parallelism it also builds a gloo copy of the model-parallel groups, the
**wait group** (:func:`model_parallel_wait_group`): where a model-parallel group's first rank works
alone (starts its engine, generates, validates) its peers wait on the CPU, with the wait timeout,
instead of inside an NCCL collective, which spins on each peer GPU (the TP engine's workers compute
there) and which NCCL's watchdog aborts after the collective timeout (10 minutes by default; a
72B engine's start or a 32B step's generation can take longer).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from fastrl import compat
from fastrl.config import ParallelConfig


@dataclass(frozen=True)
class ParallelContext:
    """Where this process sits in the TP x PP x DP grid."""

    backend: str
    rank: int
    world_size: int
    tp_size: int
    pp_size: int
    dp_size: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    dp_group: dist.ProcessGroup
    device: torch.device

    @property
    def is_first_pipeline_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_pipeline_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def is_logging_rank(self) -> bool:
        """Global rank 0 (prints and writes metrics)."""
        return self.rank == 0


#: The gloo copy of this rank's model-parallel group (NCCL runs with TP x PP > 1), or None.
_MODEL_PARALLEL_WAIT_GROUP: dist.ProcessGroup | None = None


def model_parallel_wait_group() -> dist.ProcessGroup | None:
    """The gloo group over this rank's model-parallel group that peers wait on while the group's
    first rank works alone (built by :func:`initialize` for NCCL runs with model parallelism; None
    otherwise: on gloo the collective itself waits on the CPU)."""
    return _MODEL_PARALLEL_WAIT_GROUP


def build_model_parallel_wait_group(timeout_s: float) -> dist.ProcessGroup:
    """A gloo group per megatron-core model-parallel group (the same ranks), with ``timeout_s``;
    returns this rank's. Collective over the world: every rank gathers every rank's model-parallel
    ranks, and all create the groups in the same (sorted) order."""
    from megatron.core import parallel_state as mpu

    mine = dist.get_process_group_ranks(mpu.get_model_parallel_group())
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    groups = [list(g) for g in sorted({tuple(sorted(r)) for r in everyone})]
    group, _ = dist.new_subgroups_by_enumeration(groups, timeout=timedelta(seconds=timeout_s), backend="gloo")
    return group


def resolve_backend(requested: str) -> str:
    """'nccl' or 'gloo' for ``parallel.backend`` ('auto': NCCL when CUDA is available).

    Raises:
        RuntimeError: 'nccl' requested without CUDA.
    """
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise RuntimeError(
            "no GPU: parallel.backend='nccl' (the GPU recipes' setting) needs CUDA GPUs and torch.cuda sees none "
            "here; run the GPU recipes on a GPU node (README, GPU quick start), or a *_cpu recipe on this machine"
        )
    return requested


def cuda_device_index(local_rank: int, device_count: int, visible: str | None) -> int:
    """The CUDA device index (among the visible ones) of the process with ``local_rank``.

    Two ways clusters hand GPUs to tasks: every task of a node sees all its GPUs (``srun
    --gpus-per-node=8``, torchrun): the device is ``local_rank``; or each task sees only its own
    (``--gpus-per-task=1``, Slurm binds ``CUDA_VISIBLE_DEVICES`` per task): the device is 0.

    Args:
        local_rank: the process's rank on its node (``LOCAL_RANK``).
        device_count: ``torch.cuda.device_count()`` of this process.
        visible: ``CUDA_VISIBLE_DEVICES`` (for the error message).

    Raises:
        RuntimeError: no visible GPU, or fewer GPUs than local ranks but more than one (neither
            layout): the message names both numbers and the Slurm options that give one.
    """
    if device_count < 1:
        raise RuntimeError(f"local rank {local_rank}: no CUDA device is visible (CUDA_VISIBLE_DEVICES={visible!r})")
    if local_rank < device_count:
        return local_rank
    if device_count == 1:
        return 0
    raise RuntimeError(
        f"local rank {local_rank} sees {device_count} GPUs (CUDA_VISIBLE_DEVICES={visible!r}): neither one GPU per "
        "task nor every GPU of the node; launch one task per GPU with --gpus-per-task=1, or give every task the "
        "node's GPUs (--gpus-per-node=N with --ntasks-per-node=N)"
    )


def free_port() -> int:
    """An unused TCP port on this machine (for single-process runs and tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def initialize(
    parallel: ParallelConfig, *, seed: int, timeout_s: float = 600.0, wait_timeout_s: float | None = None,
) -> ParallelContext:
    """Initialize torch.distributed and megatron-core's parallel state for this process.

    Rank and world size come from the launcher's environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``); without them this is a single-process run.
    An already initialized default process group is reused.

    Args:
        parallel: TP / PP sizes and the backend choice.
        seed: seed of megatron's RNG tracker (tensor-parallel ranks get distinct streams).
        timeout_s: collective timeout.
        wait_timeout_s: timeout of the wait group (NCCL with TP x PP > 1; default ``timeout_s``):
            the longest a model-parallel group's first rank may work alone.

    Raises:
        ConfigError: the world size is not divisible by TP x PP (or differs from parallel.world_size).
        RuntimeError: NCCL requested without CUDA, or GPUs handed out in neither usual way
            (:func:`cuda_device_index`).
    """
    compat.hide_unusable_transformer_engine()  # before megatron-core's first import (TE without its extension)
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel

    backend = resolve_backend(parallel.backend)
    if backend == "gloo" and not torch.cuda.is_available():
        compat.apply_cpu_patches()
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
            os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"
        if backend == "nccl":
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(
                cuda_device_index(local_rank, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
            )
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    world = dist.get_world_size()
    if parallel.world_size is not None and parallel.world_size != world:
        from fastrl.config import ConfigError

        raise ConfigError(
            f"parallel.world_size={parallel.world_size} but the launcher started {world} processes"
        )
    dp = parallel.dp_size(world)
    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    if backend == "gloo" and not torch.cuda.is_available():
        compat.apply_cpu_patches()  # patch megatron modules imported by the calls above
    global _MODEL_PARALLEL_WAIT_GROUP
    _MODEL_PARALLEL_WAIT_GROUP = None
    if backend == "nccl" and parallel.tensor_model_parallel_size * parallel.pipeline_model_parallel_size > 1:
        _MODEL_PARALLEL_WAIT_GROUP = build_model_parallel_wait_group(wait_timeout_s or timeout_s)
    return ParallelContext(
        backend=backend,
        rank=dist.get_rank(),
        world_size=world,
        tp_size=parallel.tensor_model_parallel_size,
        pp_size=parallel.pipeline_model_parallel_size,
        dp_size=dp,
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        pp_rank=mpu.get_pipeline_model_parallel_rank(),
        dp_rank=mpu.get_data_parallel_rank(),
        dp_group=mpu.get_data_parallel_group(),
        device=torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu"),
    )


def destroy() -> None:
    """Tear down megatron's parallel state and the default process group (if initialized)."""
    from megatron.core import parallel_state as mpu

    global _MODEL_PARALLEL_WAIT_GROUP
    _MODEL_PARALLEL_WAIT_GROUP = None
    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
