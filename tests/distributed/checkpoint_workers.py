"""Rank functions of the checkpoint tests (importable by spawned processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from workers import make_train_batch

from fastrl.config import AlgorithmConfig, OptimizerConfig, ParallelConfig, PrecisionConfig


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts / lists of an optimizer state as ``path -> leaf``."""
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _flat(val, f"{prefix}{key}/").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, val in enumerate(obj) for k, v in _flat(val, f"{prefix}{i}/").items()}
    return {prefix.rstrip("/"): obj.clone() if isinstance(obj, torch.Tensor) else obj}


def fully_parallel_save_worker(hf_dir: Path, out: Path) -> dict[str, Any]:
    """One Adam step at DP=2 (DistributedOptimizer), then ``actor/`` saved twice: spread over the DP
    group (``parallel_group``) and written by DP rank 0 (the default strategy); each is loaded into a
    fresh actor. Returns the bytes each rank wrote per save, the trained weights and, per save, the
    loaded weights and optimizer state."""
    from fastrl.checkpoint.actor_state import load_actor, save_actor
    from fastrl.compat.megatron_optimizer import ensure_optimizer_state
    from fastrl.distributed import parallel_state
    from fastrl.models.provider import build_policy, export_hf_weights
    from fastrl.training.actor import Actor, build_lr_scheduler

    parallel = ParallelConfig(backend="gloo", use_distributed_optimizer=True, micro_batch_size=1)
    ctx = parallel_state.initialize(parallel, seed=1)

    def actor() -> Actor:
        policy = build_policy(hf_dir, parallel=parallel, precision=PrecisionConfig(mode="fp32"), trainable=True)
        return Actor(
            policy, algorithm=AlgorithmConfig(), optimizer=OptimizerConfig(lr=1e-3, clip_grad=1.0, weight_decay=0.0),
            parallel=parallel, precision=PrecisionConfig(mode="fp32"),
        )  # fmt: skip

    trained = actor()
    batch = make_train_batch(hf_dir)
    share = len(batch) // ctx.dp_size
    trained.forward_backward(batch.select(range(ctx.dp_rank * share, (ctx.dp_rank + 1) * share)), dp_size=ctx.dp_size)
    trained.step(scheduler=build_lr_scheduler(trained.optimizer, OptimizerConfig(lr=1e-3, clip_grad=1.0, weight_decay=0.0), 10))
    saves = {"spread": ctx.dp_group, "rank0": None}
    for name, group in saves.items():
        (out / name).mkdir(parents=True, exist_ok=True)  # the trainer's CheckpointIO makes it, as here
        save_actor(trained.policy.chunks, trained.optimizer, out / name, optimizer_format="fully_reshardable",
                   parallel_group=group)
    torch.distributed.barrier()
    result: dict[str, Any] = {
        "bytes": {name: sum(f.stat().st_size for f in (out / name).glob(f"__{ctx.rank}_*.distcp")) for name in saves},
        "trained": {n: t.clone() for n, t in export_hf_weights(trained.policy)},
    }
    for name in saves:
        fresh = actor()
        ensure_optimizer_state(fresh.optimizer)  # as the trainer's CheckpointIO before a load
        loaded = load_actor(fresh.policy.chunks, fresh.optimizer, out / name, optimizer_format="fully_reshardable")
        result[name] = {"weights": {n: t.clone() for n, t in export_hf_weights(fresh.policy)},
                        "optimizer": _flat(loaded["optimizer"])}
    return result
