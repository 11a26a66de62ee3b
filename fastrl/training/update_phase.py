"""Phases 8-9 of a step and the refit: old / reference log-probs, the policy update, and the
weight transfer to the rollout engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ContextManager, cast

from fastrl.batch import PolicyBatch
from fastrl.distributed import collectives
from fastrl.distributed.dp_pruning import concat_batches
from fastrl.models import logprobs as lp_ops
from fastrl.models.provider import export_hf_weights
from fastrl.training.geometry import StepGeometry, UpdatePlan, padded_token_share
from fastrl.training.rollout_batch import padding_rows

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.models.provider import MegatronPolicy
    from fastrl.rollout.engine import RolloutEngine, VerifiableEngine
    from fastrl.training.actor import Actor

Metrics = dict[str, float]
Phase = Callable[[str], ContextManager[Any]]


def add_log_probs(
    batch: PolicyBatch, actor: "Actor", reference: "MegatronPolicy | None", *, geometry: StepGeometry, phase: Phase,
    old_from: int = 0, engine_old: bool = False,
) -> tuple[PolicyBatch, Metrics]:
    """``batch`` with ``old_log_probs`` (and ``ref_log_probs`` when there is a reference policy),
    float32 [N, T]: a new batch, ``batch`` is unchanged; metrics: ``actor/log_prob_padding_fraction``
    (the share of the tokens the reference and old-policy passes computed that is padding, over
    all data-parallel ranks, :func:`computed_tokens`; the zero-weight rows that fill a pass's last
    micro-batch count as padding; 0 when neither pass runs), and the engine/trainer log-prob mismatch
    (:func:`~fastrl.models.logprobs.reduce_mismatch_metrics`) when every row has its old log-probs
    here (else the update measures it: :func:`update_policy`).

    ``old_from``: the rows before it are the step's first, on-policy update
    (:attr:`~fastrl.config.RunConfig.on_policy_first_update`), whose old log-probs that update's
    own forward pass gives: here they are NaN (read by nothing before the update fills them in),
    and the old-policy pass runs over rows ``old_from:`` only (none when it is ``N``).
    ``engine_old``: rows ``old_from:`` take the engine's log-probs (``trainer.old_log_probs='engine'``)
    instead of the old-policy pass.

    The passes are cut by the step's ``geometry``
    (:class:`~fastrl.training.geometry.StepGeometry`). ``geometry.group_by_length``
    (``trainer.group_by_length``): the passes run with the rows sorted by
    length, longest first, and the results are put back in the batch's order, so the
    micro-batches hold rows of similar length (little padding; exact: a row's log-probs do not
    depend on its micro-batch). ``N`` need not be a multiple of
    ``geometry.micro_batch_size`` (the full batch before pruning, e.g. after DAPO's filter): the forward
    passes run on the batch padded with zero-weight copies of its shortest row
    (:func:`~fastrl.training.rollout_batch.padding_rows`), whose log-probs are dropped.
    ``geometry.micro_batch_tokens > 0`` (free geometry, no pipeline parallelism): the passes run over
    micro-batches of at most that many tokens and ``geometry.log_prob_max_rows`` rows instead, no
    padding rows (:meth:`~fastrl.training.geometry.StepGeometry.log_prob_cut`).

    Raises:
        ValueError: no engine log-probs on the batch, or ``old_from`` outside ``[0, N]``.
    """
    import torch

    if batch.engine_log_probs is None:
        raise ValueError("add_log_probs needs the engine's log-probs on the batch (to_policy_batch sets them)")
    n = len(batch)
    if not 0 <= old_from <= n:
        raise ValueError(f"old_from={old_from} is not a row boundary of a batch of {n} rollouts")
    added: dict[str, Any] = {}
    tokens = [(0, 0)]  # (real, computed) of each pass
    if reference is not None:
        with phase("ref"):
            added["ref_log_probs"], counts = _passes(batch, reference.chunks, actor, geometry)
            tokens.append(counts)
    if engine_old:
        later = batch.engine_log_probs[old_from:].clone()
    elif old_from < n:
        with phase("old"):
            later, counts = _passes(batch.select(range(old_from, n)), actor.policy.chunks, actor, geometry)
            tokens.append(counts)
    else:
        later = batch.engine_log_probs[n:].clone()  # no rows
    head = torch.full((old_from, batch.seq_length), float("nan"), dtype=torch.float32, device=later.device)
    added["old_log_probs"] = torch.cat([head, later]) if old_from else later
    out = batch.with_tensors(**added)
    metrics = {"actor/log_prob_padding_fraction": _dp_padding(*(sum(c) for c in zip(*tokens)))[0]}
    if old_from:
        return out, metrics
    return out, {**metrics, **lp_ops.reduce_mismatch_metrics(lp_ops.mismatch_metrics(later, batch.engine_log_probs, batch.response_mask))}


def _passes(batch: PolicyBatch, chunks: list[Any], actor: "Actor", geometry: StepGeometry) -> tuple[Any, tuple[int, int]]:
    """float32 [N, T] log-probs of ``batch`` under ``chunks`` (the actor's or the reference's), the
    rows run sorted by length (longest first; ``geometry.group_by_length``), cut by ``geometry``
    (:meth:`~fastrl.training.geometry.StepGeometry.log_prob_cut`) and returned in the batch's order;
    and the pass's ``(real, computed)`` tokens (:func:`computed_tokens`; the zero-weight rows that
    pad the batch to whole micro-batches are computed, not real)."""
    import torch

    n = len(batch)
    lengths = batch.lengths.tolist()
    order = sorted(range(n), key=lambda i: -lengths[i]) if geometry.group_by_length else list(range(n))
    inverse = torch.empty(n, dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(n)
    rows = batch.select(order)
    micro_batch_size = geometry.micro_batch_size
    cut = geometry.log_prob_cut(rows.lengths)
    real = int(rows.lengths.sum())
    if cut is not None:
        computed = computed_tokens(rows, cut, actor.sequence_multiple)
        outs, start = [], 0
        for size in cut:
            outs.append(lp_ops.compute_log_probs(
                chunks, rows.select(range(start, start + size)), micro_batch_size=size,
                temperature=actor.temperature, sequence_multiple=actor.sequence_multiple,
            ))
            start += size
        out = torch.cat(outs, dim=0)
    else:
        extra = -n % micro_batch_size
        inputs = rows if extra == 0 else concat_batches([rows, padding_rows(rows, extra)])
        computed = computed_tokens(inputs, _equal_cuts(len(inputs), micro_batch_size), actor.sequence_multiple)
        out = lp_ops.compute_log_probs(
            chunks, inputs, micro_batch_size=micro_batch_size, temperature=actor.temperature,
            sequence_multiple=actor.sequence_multiple,
        )[:n]
    return out[inverse.to(out.device)], (real, computed)


def computed_tokens(batch: PolicyBatch, micro_batches: list[int] | tuple[int, ...], multiple: int | None) -> int:
    """Tokens a forward pass computes over ``batch`` cut into consecutive micro-batches of
    ``micro_batches`` rows: each micro-batch at its longest row rounded up to ``multiple``
    (:func:`~fastrl.training.geometry.padded_token_share`,
    :func:`~fastrl.models.logprobs.fit_micro_batches`); with pipeline parallelism or ``multiple``
    None every micro-batch at the batch's ``T`` (one fixed shape between stages; no trimming).

    Raises:
        ValueError: the micro-batch sizes do not sum to the batch's row count.
    """
    if sum(micro_batches) != len(batch):
        raise ValueError(f"micro-batch sizes {list(micro_batches)} do not split a batch of {len(batch)} rollouts")
    if multiple is None or collectives.pipeline_size() > 1:
        return len(batch) * batch.seq_length
    return padded_token_share(batch.lengths, micro_batches, multiple)[1]


def update_policy(
    batch: PolicyBatch, actor: "Actor", plan: UpdatePlan, *, scheduler: Any, on_policy_rows: int = 0,
    guard: Callable[[Metrics], None] | None = None, engine_old: bool = False,
) -> Metrics:
    """``plan.passes`` passes over this rank's rows, one optimizer update per entry of
    ``plan.update_rows`` (its micro-batch cut and LR position from the plan, the position set on
    ``scheduler``, the train state's LR schedule,
    :meth:`~fastrl.training.geometry.StepGeometry.plan_update`; ``batch`` already in ``plan.row_order``);
    returns the mean of each update metric, ``actor/updates``, the padded share of the
    update's computed tokens (``actor/padding_fraction``) and its real (prompt + response) tokens
    in one pass over the rows (``actor/update_tokens``; zero-weight padding rows included), both
    summed over the data-parallel ranks.

    ``on_policy_rows`` (``plan.update_rows[0]``, or 0): the first update is on-policy
    (:attr:`~fastrl.config.RunConfig.on_policy_first_update`; its rows' ``old_log_probs`` are NaN
    placeholders, :func:`add_log_probs`): its forward pass gives their old log-probs
    (:meth:`~fastrl.training.actor.Actor.forward_backward_on_policy`), which the later passes
    reuse; the engine/trainer mismatch of the whole batch is then measured there and handed to
    ``guard`` (metrics reduced over DP, every rank decides alike) before the first optimizer step,
    so a guard that raises stops the step before any weight changes. Its metrics are returned.
    ``engine_old`` (``trainer.old_log_probs='engine'``): the later rows' old log-probs are the
    engine's own, so the mismatch is measured on the first update's rows only (the others would
    add zeros and dilute it).

    Every DP rank must run the same number of updates (the gradient all-reduce); the kept count is
    a multiple of dp_size, so every rank holds the same number of rows and plans the same updates
    (and the same LR positions). The actor takes the plan's ``dp_size`` (the step geometry's).

    Raises:
        ValueError: the plan's rows are not the batch's, or ``on_policy_rows`` is neither 0 nor the
            first update's rows.
    """
    import torch

    if sum(plan.update_rows) != len(batch):
        raise ValueError(f"the update plan covers {sum(plan.update_rows)} rows, the batch holds {len(batch)}")
    if on_policy_rows not in (0, plan.update_rows[0]):
        raise ValueError(f"on_policy_rows={on_policy_rows} is not the first update's {plan.update_rows[0]} rows")
    positions = iter(plan.lr_positions)
    collected: dict[str, list[float]] = {}
    real = computed = 0
    for epoch in range(plan.passes):
        start = 0
        for size, micro in zip(plan.update_rows, plan.micro_batches):
            part = batch.select(range(start, start + size))
            cut = None if micro is None else list(micro)
            if epoch == 0 and start == 0 and on_policy_rows:
                out, old = actor.forward_backward_on_policy(part, cut, dp_size=plan.dp_size)
                batch = batch.with_tensors(old_log_probs=torch.cat([old.to(batch.old_log_probs.device), batch.old_log_probs[size:]]))
                measured = size if engine_old else len(batch)  # rows whose old log-probs are the trainer's
                mismatch = lp_ops.reduce_mismatch_metrics(lp_ops.mismatch_metrics(
                    batch.old_log_probs[:measured], batch.engine_log_probs[:measured], batch.response_mask[:measured]
                ))
                out.update(mismatch)
                if guard is not None:
                    guard(mismatch)
                out.update(actor.step(scheduler=scheduler, lr_position=next(positions), loss=out.get("actor/loss")))
            else:
                out = actor.update(part, micro_sizes=cut, lr_position=next(positions), dp_size=plan.dp_size, scheduler=scheduler)
            if epoch == 0:
                real += int(part.lengths.sum())
                computed += computed_tokens(
                    part, micro if micro is not None else _equal_cuts(size, actor.micro_batch_size), actor.sequence_multiple
                )
            start += size
            for k, v in out.items():
                collected.setdefault(k, []).append(v)
    m = {k: sum(v) / len(v) for k, v in collected.items()}
    m["actor/updates"] = float(plan.updates)
    m["actor/padding_fraction"], m["actor/update_tokens"] = _dp_padding(real, computed)
    return m


def _dp_padding(real: int, computed: int) -> tuple[float, float]:
    """The padded share ``1 - real / computed`` (0 when nothing was computed) and the real tokens,
    both over the ``(real, computed)`` tokens summed over the data-parallel ranks (every rank calls
    this alike), so that the share is the step's, not one rank's."""
    import torch

    total = collectives.all_reduce_sum_dp(torch.tensor([float(real), float(computed)], dtype=torch.float64))
    real_all, computed_all = float(total[0]), float(total[1])
    return (1.0 - real_all / computed_all if computed_all else 0.0), real_all


def _equal_cuts(rows: int, size: int) -> list[int]:
    """Micro-batches of ``size`` rows over ``rows`` (the last shorter)."""
    return [min(size, rows - i) for i in range(0, rows, size)]


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
    parallelism the source rank makes the probe, every rank runs the actor's forward pass over it,
    the source compares; the probe and the outcome (metrics, or the error) reach every rank
    (:func:`collectives.computed_on_model_parallel_source`)."""
    from fastrl.training.refit_verify import actor_probe_logprobs, make_probe, verify_refit

    def trainer(probe):
        return actor_probe_logprobs(actor, probe, engine.pad_token_id)

    if collectives.model_parallel_size() == 1:
        return verify_refit(engine, trainer, tolerance=engine.verify_tolerance)
    probe = collectives.computed_on_model_parallel_source(
        lambda: make_probe(engine.tokenizer, engine.suppressed_ids, engine), what="the refit probe")  # engine's greedy responses
    # Every rank runs the actor's forward pass (its TP / PP collectives) before the source asks the
    # engine, so an engine error cannot leave the peers waiting inside the forward pass.
    trainer_lp = trainer(probe)
    return collectives.computed_on_model_parallel_source(
        lambda: verify_refit(engine, lambda _probe: trainer_lp, tolerance=engine.verify_tolerance, probe=probe),
        what="the refit verification")
