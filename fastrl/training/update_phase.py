"""Phases 8-9 of a step and the refit: old / reference log-probs, the policy update, and the
weight transfer to the rollout engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ContextManager, cast

from fastrl.batch import PolicyBatch
from fastrl.distributed.dp_pruning import concat_batches
from fastrl.models import logprobs as lp_ops
from fastrl.models.provider import export_hf_weights
from fastrl.training.geometry import UpdatePlan, token_micro_batches
from fastrl.training.rollout_batch import padding_rows

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.models.provider import MegatronPolicy
    from fastrl.rollout.engine import RolloutEngine, VerifiableEngine
    from fastrl.training.actor import Actor

Metrics = dict[str, float]
Phase = Callable[[str], ContextManager[Any]]


def add_log_probs(
    batch: PolicyBatch, actor: "Actor", reference: "MegatronPolicy | None", *, micro_batch_size: int, phase: Phase,
    micro_batch_tokens: int = 0,
) -> tuple[PolicyBatch, Metrics]:
    """``batch`` with ``old_log_probs`` (and ``ref_log_probs`` when there is a reference policy),
    float32 [N, T]: a new batch, ``batch`` is unchanged; metrics: the engine/trainer log-prob mismatch.

    ``N`` need not be a multiple of ``micro_batch_size`` (the full batch before pruning, e.g. after
    DAPO's filter): the forward passes run on the batch padded with zero-weight copies of row 0
    (:func:`~fastrl.training.rollout_batch.padding_rows`), whose log-probs are dropped.
    ``micro_batch_tokens > 0`` (free geometry, no pipeline parallelism): the passes run over
    micro-batches of at most that many tokens instead, no padding
    (:func:`~fastrl.training.geometry.token_micro_batches`).
    """
    if batch.engine_log_probs is None:
        raise ValueError("add_log_probs needs the engine's log-probs on the batch (to_policy_batch sets them)")
    n = len(batch)
    if micro_batch_tokens > 0:
        sizes = token_micro_batches(batch.lengths, micro_batch_tokens, micro_batch_size * 8)

        def run(chunks: list[Any]) -> Any:
            import torch

            outs, start = [], 0
            for size in sizes:
                part = batch.select(range(start, start + size))
                outs.append(lp_ops.compute_log_probs(
                    chunks, part, micro_batch_size=size, temperature=actor.temperature,
                    sequence_multiple=actor.sequence_multiple,
                ))
                start += size
            return torch.cat(outs, dim=0)
    else:
        extra = -n % micro_batch_size
        inputs = batch if extra == 0 else concat_batches([batch, padding_rows(batch, extra)])

        def run(chunks: list[Any]) -> Any:
            return lp_ops.compute_log_probs(
                chunks, inputs, micro_batch_size=micro_batch_size, temperature=actor.temperature,
                sequence_multiple=actor.sequence_multiple,
            )[:n]
    with phase("old"):
        old = run(actor.policy.chunks) if micro_batch_tokens > 0 else actor.log_probs(inputs)[:n]
    added = {"old_log_probs": old}
    if reference is not None:
        with phase("ref"):
            added["ref_log_probs"] = run(reference.chunks)
    mismatch = lp_ops.mismatch_metrics(old, batch.engine_log_probs, batch.response_mask)
    return batch.with_tensors(**added), lp_ops.reduce_mismatch_metrics(mismatch)


def update_policy(batch: PolicyBatch, actor: "Actor", plan: UpdatePlan) -> Metrics:
    """``plan.passes`` passes over this rank's rows, one optimizer update per entry of
    ``plan.update_rows`` (its micro-batch cut and LR position from the plan,
    :func:`~fastrl.training.geometry.plan_update`); returns the mean of each update metric and
    ``actor/updates``.

    Every DP rank must run the same number of updates (the gradient all-reduce); the kept count is
    a multiple of dp_size, so every rank holds the same number of rows and plans the same updates
    (and the same LR positions).

    Raises:
        ValueError: the plan's rows are not the batch's.
    """
    if sum(plan.update_rows) != len(batch):
        raise ValueError(f"the update plan covers {sum(plan.update_rows)} rows, the batch holds {len(batch)}")
    positions = iter(plan.lr_positions)
    collected: dict[str, list[float]] = {}
    for _ in range(plan.passes):
        start = 0
        for size, micro in zip(plan.update_rows, plan.micro_batches):
            part = batch.select(range(start, start + size))
            out = actor.update(part, micro_sizes=None if micro is None else list(micro), lr_position=next(positions))
            start += size
            for k, v in out.items():
                collected.setdefault(k, []).append(v)
    m = {k: sum(v) / len(v) for k, v in collected.items()}
    m["actor/updates"] = float(plan.updates)
    return m


def release_cached_memory(device: Any) -> None:
    """On a GPU, ``torch.cuda.empty_cache()``: the caching allocator gives back what it keeps reserved
    (the update's and the old/ref passes' activation peak), so that the engine process, which cannot
    reclaim another process's cache, can wake its weights and KV cache into it. Nothing on the CPU."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def refit(engine: "RolloutEngine", actor: "Actor") -> Metrics:
    """Stream the actor's weights (Hugging Face names, full tensors) into the rollout engine and
    count the refit (``actor.policy_version``, the version every later generate request carries); an
    engine process (``rollout.engine='vllm'``) adds its transfer metrics (``refit/bytes``,
    ``refit/time_s``, ``refit/mb_per_s``) and, when due, the refit verification
    (:mod:`fastrl.training.refit_verify`; raises ``RefitVerificationError``).

    The export puts its tensors where the engine's transport wants them (``engine.export_to_cpu``:
    the CPU for shared memory, the GPU for CUDA IPC; the Hugging Face engine: the CPU); an export on
    the GPU is given back to the device (:func:`release_cached_memory`) before the engine wakes its
    KV cache, here for the verification's probe or at the next generation. Collective
    over the model-parallel group: every rank exports (TP all-gathers, PP broadcasts), only the
    source rank's engine loads; a rank without an engine holds an
    :class:`~fastrl.training.engine_placement.EnginelessPeer`. The verification wakes the engine's
    KV cache for its probe (the engine then stays awake until the next generation's end)."""
    count = engine.update_weights(export_hf_weights(actor.policy, cpu=engine.export_to_cpu))
    actor.policy_version += 1
    if not engine.export_to_cpu:  # the export's gathered tensors and buckets, before any KV cache wakes
        release_cached_memory("cuda")
    m = {"refit/tensors": float(count), **engine.refit_metrics}
    if engine.verify_due:
        engine.wake()
        m.update(_verify(cast("VerifiableEngine", engine), actor))
    return m


def _verify(engine: "VerifiableEngine", actor: "Actor") -> Metrics:
    """The refit verification (the engine's probe log-probs against the actor's). With model
    parallelism the source rank makes the probe and broadcasts it, every rank runs the actor's
    forward pass over it, the source compares and broadcasts its metrics or error."""
    from fastrl.distributed import collectives
    from fastrl.training.refit_verify import actor_probe_logprobs, make_probe, verify_refit

    def trainer(probe):
        return actor_probe_logprobs(actor, probe, engine.pad_token_id)

    if collectives.model_parallel_size() == 1:
        return verify_refit(engine, trainer, tolerance=engine.verify_tolerance)
    source = collectives.is_model_parallel_source()
    probe: Any = None
    if source:
        try:
            probe = make_probe(engine.tokenizer, engine.suppressed_ids, engine)  # the engine's greedy responses
        except Exception as err:  # noqa: BLE001 - the peers raise it too, instead of waiting for a probe
            probe = err
    probe = collectives.broadcast_object_model_parallel(probe)
    if isinstance(probe, BaseException):
        raise probe
    # Every rank runs the actor's forward pass (its TP / PP collectives) before the source asks the
    # engine, so an engine error cannot leave the peers waiting inside the forward pass.
    trainer_lp = trainer(probe)
    if not source:
        outcome = collectives.broadcast_object_model_parallel(None)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    try:
        outcome: Any = verify_refit(engine, lambda _probe: trainer_lp, tolerance=engine.verify_tolerance, probe=probe)
    except Exception as err:  # noqa: BLE001 - the peers raise it too
        collectives.broadcast_object_model_parallel(err)
        raise
    collectives.broadcast_object_model_parallel(outcome)
    return outcome
