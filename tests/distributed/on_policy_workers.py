"""Worker of tests/distributed/test_on_policy_old_log_probs.py (importable by spawned processes)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from workers import hf_log_probs, make_batch

from fastrl.config import AlgorithmConfig, OptimizerConfig, ParallelConfig, PrecisionConfig, RunConfig


def on_policy_worker(hf_dir: Path, update_rows: tuple[int, ...], passes: int) -> dict[str, Any]:
    """One step's update of a batch of ``sum(update_rows)`` rollouts (non-zero advantages, KL loss,
    truncated importance weights) by two identical actors: one with the old-policy pass on every
    row (``trainer.old_log_probs=recompute``), one whose first update is on-policy
    (``auto``: no old-policy pass over its rows). Returns each actor's metrics, weights after the
    step, and the old log-probs the second path's batch holds before the update (NaN on the first
    update's rows), plus a third run of the on-policy path whose guard raises."""
    from fastrl.distributed import parallel_state
    from fastrl.models.provider import build_policy
    from fastrl.training.actor import Actor, build_lr_scheduler
    from fastrl.training.geometry import UpdatePlan, step_geometry
    from fastrl.training.update_phase import add_log_probs, update_policy

    parallel = ParallelConfig(backend="gloo", micro_batch_size=2)
    parallel_state.initialize(parallel, seed=1)
    algorithm = AlgorithmConfig(clip_low=0.2, clip_high=0.28, use_kl_loss=True, kl_coef=0.05, tis_cap=2.0)
    n = sum(update_rows)
    batch = make_batch(n)
    g = torch.Generator().manual_seed(3)
    lp = hf_log_probs(hf_dir, batch)
    m = batch.response_mask
    batch = batch.with_tensors(
        advantages=torch.randn(n, generator=g),
        engine_log_probs=(lp + 0.05 * torch.randn(lp.shape, generator=g)) * m,  # engine numerics differ a little
    )
    plan = UpdatePlan(
        row_order=tuple(range(n)), update_rows=update_rows, micro_batches=tuple((2,) * (k // 2) for k in update_rows),
        passes=passes, lr_positions=tuple(range(1, passes * len(update_rows) + 1)), dp_size=1,
    )
    geometry = step_geometry(RunConfig(parallel=parallel), 1, n)  # the log-prob passes: micro-batches of 2 rows

    def actor() -> Actor:
        policy = build_policy(hf_dir, parallel=parallel, precision=PrecisionConfig(mode="fp32"), trainable=True)
        return Actor(
            policy, algorithm=algorithm, optimizer=OptimizerConfig(lr=1e-2, clip_grad=1.0, weight_decay=0.0),
            parallel=parallel, precision=PrecisionConfig(mode="fp32"),
        )  # fmt: skip

    def schedule(a: Actor) -> Any:
        return build_lr_scheduler(a.optimizer, OptimizerConfig(lr=1e-2, clip_grad=1.0, weight_decay=0.0), 10)

    reference = build_policy(hf_dir, parallel=parallel, precision=PrecisionConfig(mode="fp32"), trainable=False)

    def weights(a: Actor) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in a.policy.chunks[0].named_parameters()}

    def phase(name: str) -> Any:
        return contextlib.nullcontext()

    out: dict[str, Any] = {}
    for name, old_from in (("recompute", 0), ("auto", update_rows[0])):
        a = actor()
        before = weights(a)
        prepared, pre_metrics = add_log_probs(batch, a, reference, geometry=geometry, phase=phase, old_from=old_from)
        seen: list[dict[str, float]] = []
        metrics = update_policy(prepared, a, plan, scheduler=schedule(a), on_policy_rows=old_from, guard=seen.append)
        out[name] = {
            "metrics": {**pre_metrics, **metrics}, "before": before, "after": weights(a), "guard_saw": seen,
            "old_before_update": prepared.old_log_probs,
        }

    a = actor()
    before = weights(a)
    prepared, _ = add_log_probs(batch, a, reference, geometry=geometry, phase=phase, old_from=update_rows[0])

    def refuse(metrics: dict[str, float]) -> None:
        raise RuntimeError("mismatch guard")

    try:
        update_policy(prepared, a, plan, scheduler=schedule(a), on_policy_rows=update_rows[0], guard=refuse)
        out["guard_raised"] = False
    except RuntimeError:
        out["guard_raised"] = True
    out["guarded_unchanged"] = all(torch.equal(before[k], v) for k, v in weights(a).items())
    return out
