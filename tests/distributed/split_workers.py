"""Worker of tests/distributed/test_split_invariance.py (importable by spawned processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers import make_train_batch

from fastrl.config import ParallelConfig, PrecisionConfig


def split_worker(hf_dir: Path, algorithm, splits: list[list[int] | None], n: int = 6) -> dict[str, Any]:
    """The global loss and the gradients of one batch of ``n`` rollouts for each micro-batch cut in
    ``splits`` (None: micro-batches of parallel.micro_batch_size = 1), one process."""
    from fastrl.config import OptimizerConfig
    from fastrl.distributed import parallel_state
    from fastrl.models.provider import build_policy
    from fastrl.training.actor import Actor

    parallel = ParallelConfig(backend="gloo", micro_batch_size=1)
    parallel_state.initialize(parallel, seed=1)
    policy = build_policy(hf_dir, parallel=parallel, precision=PrecisionConfig(mode="fp32"), trainable=True)
    actor = Actor(
        policy, algorithm=algorithm, optimizer=OptimizerConfig(lr=1e-3, clip_grad=1.0, weight_decay=0.0),
        parallel=parallel, precision=PrecisionConfig(mode="fp32"),
    )  # fmt: skip
    batch = make_train_batch(hf_dir, n=n)
    out = []
    for sizes in splits:
        metrics = actor.forward_backward(batch, sizes, dp_size=1)
        grads = {name: p.main_grad.detach().clone() for name, p in policy.chunks[0].named_parameters()}
        out.append({"loss": metrics["actor/loss"], "grads": grads})
    return {"results": out}
