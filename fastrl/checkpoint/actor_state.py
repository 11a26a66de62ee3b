"""The ``actor/`` and ``rng/`` parts of a checkpoint: megatron distributed state and RNG streams.

``actor/`` is a megatron-core ``dist_checkpointing`` directory of ``{"model": <sharded state
dict>}`` (``model0``, ``model1``, ... for virtual pipeline chunks) and, in a trainer checkpoint
that keeps it, ``"optimizer"``: the DistributedOptimizer's state in megatron's
``distrib_optim_sharding_type`` (``fully_reshardable`` by default, so a run resumes at another
TP/PP/DP layout; ``dp_reshardable`` reshards over DP only). Imported checkpoints hold the model
only. Every function here is collective over the ranks that hold the model (dist_checkpointing
reshards on load).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from fastrl.checkpoint.layout import ACTOR_DIR
from fastrl.checkpoint.manager import CheckpointError


def rng_state() -> dict[str, Any]:
    """This rank's RNG states: torch CPU (and CUDA), Python, numpy, megatron's tracker."""
    from megatron.core import tensor_parallel

    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    from megatron.core import tensor_parallel

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _unwrapped(chunks: Sequence[Any]) -> list[Any]:
    from megatron.core.utils import unwrap_model

    return unwrap_model(list(chunks))


def sharded_state_dict(
    chunks: Sequence[Any], optimizer: Any = None, *, is_loading: bool, optimizer_format: str = "fully_reshardable"
) -> dict[str, Any]:
    """megatron sharded state dict of the model ``chunks`` (+ ``optimizer`` in ``optimizer_format``,
    a megatron ``distrib_optim_sharding_type``, when given)."""
    models = _unwrapped(chunks)
    if len(models) == 1:
        model_sd = models[0].sharded_state_dict()
        state = {"model": model_sd}
    else:
        state = {f"model{i}": m.sharded_state_dict() for i, m in enumerate(models)}
        model_sd = dict(state)
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(
            model_sd, is_loading=is_loading, metadata={"distrib_optim_sharding_type": optimizer_format}
        )
    return state


def load_model_state(chunks: Sequence[Any], loaded: dict[str, Any]) -> None:
    """Copy the model part of a loaded sharded state dict into ``chunks``."""
    models = _unwrapped(chunks)
    if len(models) == 1:
        models[0].load_state_dict(loaded["model"])
    else:
        for i, m in enumerate(models):
            m.load_state_dict(loaded[f"model{i}"])


def save_actor(
    chunks: Sequence[Any], optimizer: Any, actor_dir: Path, *, optimizer_format: str, parallel_group: Any = None,
) -> None:
    """Write ``actor/`` (``optimizer=None``: the model only). Collective.

    ``parallel_group``: the data-parallel process group over which megatron-core's
    ``FullyParallelSaveStrategyWrapper`` spreads the writing of replicated tensors (each rank writes
    about an equal share; only metadata is exchanged); None, or a group of one rank, uses the
    default strategy, under which the first rank of each replica group writes every replicated tensor.
    """
    from fastrl.compat import dist_checkpointing

    module = dist_checkpointing()
    state = sharded_state_dict(chunks, optimizer, is_loading=False, optimizer_format=optimizer_format)
    strategy = None
    if parallel_group is not None and torch.distributed.get_world_size(parallel_group) > 1:
        from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
        from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

        strategy = FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(), parallel_group)
    module.save(state, str(actor_dir), sharded_strategy=strategy)


def load_actor(chunks: Sequence[Any], optimizer: Any, actor_dir: Path, *, optimizer_format: str) -> dict[str, Any]:
    """Load ``actor/`` into ``chunks`` and return the loaded state (its ``"optimizer"`` entry, when
    ``optimizer`` is given, is for the caller to load). Collective.

    Raises:
        CheckpointError: the checkpoint's model or layout does not fit (names the directory and cause).
    """
    from fastrl.compat import dist_checkpointing

    sharded = sharded_state_dict(chunks, optimizer, is_loading=True, optimizer_format=optimizer_format)
    try:
        with torch.no_grad():
            loaded = dist_checkpointing().load(sharded, str(actor_dir))
    except Exception as err:  # megatron raises many kinds; name the checkpoint and the cause
        raise CheckpointError(
            f"cannot load the actor from {actor_dir}: {type(err).__name__}: {err}. The checkpoint's "
            f"model or parallel layout does not fit this run (TP/PP resharding is supported; other "
            f"architectures or sizes are not)"
        ) from err
    load_model_state(chunks, loaded)
    return loaded


def load_model_weights(chunks: Sequence[Any], actor_dir: Path) -> None:
    """Load only the model part of a trainer / imported checkpoint's ``actor/`` (collective).

    Raises:
        CheckpointError: naming ``actor_dir`` and the cause, instead of megatron's internal error.
    """
    from fastrl.compat import dist_checkpointing

    check_actor_files(actor_dir)
    sharded = sharded_state_dict(chunks, is_loading=True)
    try:
        with torch.no_grad():
            loaded = dist_checkpointing().load(sharded, str(actor_dir))
    except Exception as err:  # megatron / torch.distributed.checkpoint raise many kinds
        cause = str(err).strip().splitlines()
        raise CheckpointError(
            f"cannot load the model from {actor_dir}: {type(err).__name__}: {cause[0] if cause else ''}. "
            f"A file in it is corrupted, or the checkpoint holds another model or model size"
        ) from None
    load_model_state(chunks, loaded)


def check_actor_files(actor_dir: Path) -> None:
    """Read the index files of a dist_checkpointing directory (``metadata.json``, ``.metadata``,
    ``common.pt``) so that a damaged one is reported by name (the tensor data files, ``*.distcp``,
    are checked by size against the ``COMPLETE`` marker).

    Raises:
        CheckpointError: a missing or unreadable index file, named.
    """
    from torch.distributed.checkpoint import FileSystemReader

    readers = {
        "metadata.json": lambda f: json.loads(f.read_text()),
        ".metadata": lambda f: FileSystemReader(str(actor_dir)).read_metadata(),
        "common.pt": lambda f: torch.load(f, map_location="cpu", weights_only=False),
    }
    for name, read in readers.items():
        file = actor_dir / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {actor_dir.parent}: {ACTOR_DIR}/{name} is missing")
        try:
            read(file)
        except Exception as err:  # json, pickle and zip readers raise many kinds
            raise CheckpointError(
                f"checkpoint {actor_dir.parent}: cannot read {ACTOR_DIR}/{name} ({type(err).__name__}: {err}); "
                f"the file is corrupted"
            ) from None
