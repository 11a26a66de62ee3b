"""Which ranks hold a rollout engine, and what the others hold instead.

Only the first rank of each model-parallel group (TP rank 0 of pipeline stage 0,
:func:`fastrl.distributed.collectives.is_model_parallel_source`) generates, so only it builds an
engine; with ``rollout.engine_tensor_parallel_size = t > 1`` that engine sees the GPUs of the first
``t`` ranks of its model-parallel group (:func:`engine_gpus`). Every other rank holds an
:class:`EnginelessPeer`: it takes part in the refit only through the weight export's collectives
(TP all-gathers, PP broadcasts; it reads the stream and drops it), gets its rollouts and
validation results by the model-parallel broadcast, and carries the engine's tokenizer, pad token
and verification schedule, which it received from the source at start-up.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from fastrl.distributed import collectives


class EnginelessPeer:
    """The rollout-engine slot of a rank that does not generate (module docstring).

    Attributes:
        tokenizer / pad_token_id / suppressed_ids: the source engine's (prompt rendering, padding,
            the refit probe).
        verify_every / verify_tolerance: the source engine's refit-verification schedule, so that
            :attr:`verify_due` is the source's and every rank joins the probe's forward pass.
        export_to_cpu: where this rank's weight export puts its tensors (the GPU on a GPU: no copy).
    """

    def __init__(self, *, tokenizer: Any, pad_token_id: int, suppressed_ids: Sequence[int] = (),
                 verify_every: int = 0, verify_tolerance: float = 0.0, export_to_cpu: bool = True) -> None:
        self.tokenizer = tokenizer
        self.pad_token_id = int(pad_token_id)
        self.suppressed_ids = list(suppressed_ids)
        self.verify_every = int(verify_every)
        self.verify_tolerance = float(verify_tolerance)
        self.export_to_cpu = export_to_cpu
        self.weight_version = 0
        self.refit_metrics: dict[str, float] = {}

    @property
    def verify_due(self) -> bool:
        from fastrl.rollout.refit_checks import verify_due_at

        return verify_due_at(self.weight_version, self.verify_every)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Read the export (its collectives need every rank) and drop it; returns the tensor count."""
        count = sum(1 for _ in named_tensors)
        self.weight_version += 1
        return count

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def reset_prefix_cache(self) -> None:
        pass

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("this rank holds no rollout engine: only the first rank of a model-parallel group generates")

    def shutdown(self) -> None:
        pass


def engine_gpus(device: torch.device, engine_tp: int) -> list[str] | None:
    """The ``CUDA_VISIBLE_DEVICES`` entries of the source engine's GPUs: those of the first
    ``engine_tp`` ranks of this model-parallel group (collective over the group: every rank calls
    it). None on CPU, and with ``engine_tp = 1`` (the engine sees its rank's own GPU).

    Raises:
        ValueError: the model-parallel group has fewer than ``engine_tp`` ranks, or they are not
            all on the source's node.
    """
    if device.type != "cuda" or engine_tp == 1:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible else None
    index = device.index or 0
    mine = (socket.gethostname(), entries[index] if entries else str(index))
    members = collectives.all_gather_objects_model_parallel(mine)
    if len(members) < engine_tp:
        raise ValueError(
            f"rollout.engine_tensor_parallel_size={engine_tp} needs {engine_tp} GPUs of one model-parallel group, "
            f"which has {len(members)} rank(s) (parallel.tensor_model_parallel_size x pipeline_model_parallel_size)"
        )
    chosen = members[:engine_tp]
    hosts = sorted({host for host, _ in chosen})
    if len(hosts) > 1:  # every rank of the group sees the same list and raises alike
        raise ValueError(
            f"rollout.engine_tensor_parallel_size={engine_tp}: the first {engine_tp} ranks of the model-parallel "
            f"group are on nodes {hosts}; one engine needs them on one node"
        )
    return [gpu for _, gpu in chosen]


def build_rank_engine(cfg: Any, device: torch.device, build: Callable[[list[str] | None], Any]) -> Any:
    """This rank's engine slot (collective over the model-parallel group): ``build(gpus)`` on the
    source rank (``gpus``: :func:`engine_gpus`), an :class:`EnginelessPeer` elsewhere, given the
    source engine's tokenizer, pad token, suppressed ids and verification schedule
    (:func:`~fastrl.distributed.collectives.computed_on_model_parallel_source`: an engine that fails
    to start raises on every rank of the group)."""
    from fastrl.rollout.refit_transport import export_to_cpu

    gpus = engine_gpus(device, cfg.rollout.engine_tensor_parallel_size)
    if collectives.model_parallel_size() == 1:
        return build(gpus)
    built: list[Any] = []

    def start() -> dict[str, Any]:
        engine = build(gpus)
        built.append(engine)
        return {
            "tokenizer": engine.tokenizer, "pad_token_id": engine.pad_token_id,
            "suppressed_ids": list(engine.suppressed_ids), "verify_every": int(engine.verify_every),
            "verify_tolerance": float(engine.verify_tolerance),
        }

    facts = collectives.computed_on_model_parallel_source(start, what="the rollout engine's start")
    return built[0] if built else EnginelessPeer(**facts, export_to_cpu=export_to_cpu(device))
