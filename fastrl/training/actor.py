"""The actor: PPO-family policy updates of a megatron-core policy, plus its log-probs.

One :meth:`Actor.update` is one optimizer step on one mini-batch (this DP rank's share of it):

1. The loss denominator (response tokens, or responses, of the whole mini-batch) is summed over
   the data-parallel group once (one all-reduce of one float64).
2. megatron-core's schedule (1F1B with pipeline parallelism) runs forward and backward over the
   micro-batches; each micro-batch's loss is ``sum(its token losses) / global denominator``
   (:mod:`fastrl.algorithms.losses`), so the losses of all micro-batches of all DP ranks add up to the
   mini-batch loss, whatever the layout. Without pipeline parallelism each micro-batch runs at its
   own longest row (:func:`fastrl.models.logprobs.fit_micro_batches`). megatron averages micro-batch losses over micro-batches and
   gradients over DP ranks; the loss handed to it is scaled by ``micro-batches x DP size`` to undo both
   (the DP size is the step geometry's, :attr:`fastrl.training.geometry.UpdatePlan.dp_size`, passed in).
3. Gradients are reduced over DP (all-reduce, or reduce-scatter with the DistributedOptimizer),
   clipped to the global norm, and megatron's Adam steps; the LR schedule the actor is handed (the
   train state's, :func:`build_lr_scheduler`) moves to the update's position (one unit per update
   of a step that makes them all, :func:`fastrl.training.geometry.lr_positions`).
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch

from fastrl.algorithms.losses import gspo_loss, kl_loss, loss_denominator, ppo_clip_loss
from fastrl.batch import PolicyBatch
from fastrl.config import AlgorithmConfig, OptimizerConfig, ParallelConfig, PrecisionConfig
from fastrl.distributed import collectives, world
from fastrl.models import logprobs as logprob_ops
from fastrl.models.provider import MegatronPolicy
from fastrl.training.rollout_batch import sequence_multiple

#: The per-rollout tensors of a ``PolicyBatch`` an update needs.
REQUIRED_TENSORS = ("advantages", "old_log_probs")


def build_optimizer(policy: MegatronPolicy, optimizer: OptimizerConfig, parallel: ParallelConfig, precision: PrecisionConfig) -> Any:
    """megatron-core Adam (DistributedOptimizer when configured), fp32 master weights and state for bf16."""
    from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
    from megatron.core.optimizer import get_megatron_optimizer

    bf16 = precision.mode != "fp32"
    config = MegatronOptimizerConfig(
        optimizer="adam",
        lr=optimizer.lr,
        min_lr=optimizer.min_lr,
        weight_decay=optimizer.weight_decay,
        adam_beta1=optimizer.adam_beta1,
        adam_beta2=optimizer.adam_beta2,
        adam_eps=optimizer.adam_eps,
        clip_grad=optimizer.clip_grad,
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_distributed_optimizer=parallel.use_distributed_optimizer,
    )
    return get_megatron_optimizer(config, policy.chunks)


def build_lr_scheduler(megatron_optimizer: Any, optimizer: OptimizerConfig, total_steps: int) -> Any:
    """megatron-core's OptimizerParamScheduler: linear warm-up, then constant / linear / cosine decay,
    over ``total_steps`` units (its horizon: RL steps x
    :func:`~fastrl.training.geometry.updates_per_step_estimate`), setting the LR of
    ``megatron_optimizer`` (the actor's). The trainer builds it for the train state
    (:class:`~fastrl.checkpoint.train_state.TrainState`, which owns and saves it); the update hands
    it to :meth:`Actor.step`.

    Built with ``override_opt_param_scheduler=True``: loading a checkpoint's scheduler state keeps
    only its step count, and the peak / minimum LR, warm-up, decay style, decay horizon and weight
    decay are this config's (megatron's default would silently keep the checkpoint's). The resume
    logs every changed key (:mod:`fastrl.checkpoint.config_diff`); with an unchanged config both
    are the same values, so an exact resume stays bit-identical.
    """
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    warmup = min(optimizer.lr_warmup_steps, max(total_steps - 1, 0))
    return OptimizerParamScheduler(
        megatron_optimizer,
        init_lr=0.0 if warmup > 0 else optimizer.lr,
        max_lr=optimizer.lr,
        min_lr=optimizer.min_lr,
        lr_warmup_steps=warmup,
        lr_decay_steps=max(total_steps, warmup + 1),
        lr_decay_style=optimizer.lr_decay_style,
        start_wd=optimizer.weight_decay,
        end_wd=optimizer.weight_decay,
        wd_incr_steps=max(total_steps, 1),
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=True,
    )


class Actor:
    """Trainable policy: log-probs, the loss of one mini-batch, and optimizer steps.

    Args:
        policy: built with ``trainable=True`` (megatron DDP).
        algorithm: loss type, clipping, KL and aggregation settings.
        optimizer / parallel / precision: optimizer, micro-batch size and dtype settings.
        temperature: sampling temperature of the rollouts (log-probs use the same).

    Attributes:
        policy_version: the trainer's count of refits (weights sent to the rollout engine since it
            was built; :func:`fastrl.training.update_phase.refit`). Every generate request carries
            it, and an engine whose loaded weights are older refuses
            (:class:`fastrl.rollout.engine.StaleWeightsError`).
    """

    def __init__(
        self,
        policy: MegatronPolicy,
        *,
        algorithm: AlgorithmConfig,
        optimizer: OptimizerConfig,
        parallel: ParallelConfig,
        precision: PrecisionConfig,
        temperature: float = 1.0,
    ) -> None:
        from megatron.core.distributed import finalize_model_grads

        if not policy.trainable:
            raise ValueError("Actor needs a policy built with trainable=True")
        self.policy = policy
        self.algorithm = algorithm
        self.micro_batch_size = parallel.micro_batch_size
        self.sequence_multiple = sequence_multiple(precision, parallel)
        self.temperature = temperature
        self.policy_version = 0
        self.optimizer = build_optimizer(policy, optimizer, parallel, precision)
        config = policy.chunks[0].config
        config.finalize_model_grads_func = finalize_model_grads
        config.grad_scale_func = self.optimizer.scale_loss
        config.no_sync_func = [chunk.no_sync for chunk in policy.chunks]
        if len(policy.chunks) == 1:
            config.no_sync_func = config.no_sync_func[0]

    # ---- log-probs --------------------------------------------------------------------------

    def log_probs(self, batch: PolicyBatch, *, temperature: float | None = None) -> torch.Tensor:
        """float32 [N, T] log-probs of ``batch`` under the current policy (see ``compute_log_probs``),
        the logits divided by ``temperature`` (None: the rollouts' sampling temperature; the refit
        probe passes 1, the engine's scoring temperature)."""
        return logprob_ops.compute_log_probs(
            self.policy.chunks, batch, micro_batch_size=self.micro_batch_size,
            temperature=self.temperature if temperature is None else temperature,
            sequence_multiple=self.sequence_multiple,
        )

    # ---- loss -------------------------------------------------------------------------------

    @property
    def agg_mode(self) -> str:
        return self.algorithm.loss_agg.replace("_", "-")

    def micro_batch_loss(
        self, mb: PolicyBatch, log_probs: torch.Tensor, global_denominator: torch.Tensor, *, on_policy: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """This micro-batch's share of the mini-batch loss and its metrics (pure given log-probs).

        Policy loss (PPO clip / GSPO / GSPO-token, :mod:`fastrl.algorithms.losses`) plus
        ``kl_coef x`` KL to the reference policy when ``use_kl_loss``; truncated importance weights
        when the batch carries ``engine_log_probs`` and ``tis_cap`` is set.

        ``on_policy``: the weights being updated are the weights that generated ``mb`` (the step's
        first update, ``trainer.old_log_probs`` auto / engine), so the old log-probs are
        ``log_probs.detach()`` (the PPO ratio is 1, its gradient that of the log-probs) and
        ``mb.old_log_probs`` is not read (NaN there until this update fills it in).
        """
        alg = self.algorithm
        use_kl = alg.use_kl_loss and alg.kl_coef > 0
        required = [k for k in REQUIRED_TENSORS if not (on_policy and k == "old_log_probs")]
        missing = [k for k in (*required, *(("ref_log_probs",) if use_kl else ())) if getattr(mb, k) is None]
        if missing:
            raise KeyError(f"the batch lacks {missing}; the actor update needs {list(REQUIRED_TENSORS)} (+ ref_log_probs with KL loss)")
        old = log_probs.detach() if on_policy else mb.old_log_probs
        mask = mb.response_mask
        weights = None
        if alg.tis_cap is not None and mb.engine_log_probs is not None:
            from fastrl.algorithms.importance_sampling import truncated_importance_weights

            weights, _ = truncated_importance_weights(
                old, mb.engine_log_probs, mask, level=alg.tis_level, cap=alg.tis_cap
            )
        if alg.loss_type == "ppo":
            loss, metrics = ppo_clip_loss(
                log_probs, old, mb.advantages, mask,
                global_denominator=global_denominator, clip_low=alg.clip_low, clip_high=alg.clip_high,
                dual_clip=alg.dual_clip_c, agg_mode=self.agg_mode, importance_weights=weights,
            )  # fmt: skip
        else:
            loss, metrics = gspo_loss(
                log_probs, old, mb.advantages, mask,
                global_denominator=global_denominator, clip_low=alg.gspo_clip_low, clip_high=alg.gspo_clip_high,
                variant="token" if alg.loss_type == "gspo_token" else "sequence", agg_mode=self.agg_mode,
                importance_weights=weights,
            )  # fmt: skip
        metrics = {f"actor/{k}": v for k, v in metrics.items()}
        metrics["actor/pg_loss"] = loss.detach()
        if use_kl:
            kl, kl_metrics = kl_loss(
                log_probs, mb.ref_log_probs, mask, global_denominator=global_denominator,
                estimator=alg.kl_estimator, agg_mode=self.agg_mode, row_weights=mb.kl_weights,
            )  # fmt: skip
            loss = loss + alg.kl_coef * kl
            metrics["actor/kl_loss"] = kl.detach()
            metrics.update({f"actor/{k}": v for k, v in kl_metrics.items()})
        metrics["actor/loss"] = loss.detach()
        return loss, metrics

    def local_denominator(self, batch: PolicyBatch) -> torch.Tensor:
        """This rank's share of the mini-batch loss denominator (float64 0-dim): response tokens (or
        responses) of ``batch``, each rollout counted ``kl_weights`` times when the batch carries KL
        weights (``pruning.zero_adv_kl='sample'``: a sampled uniform rollout stands for U / s of them
        in the denominator as in the KL sum; :func:`~fastrl.algorithms.losses.loss_denominator`)."""
        return loss_denominator(batch.response_mask, self.agg_mode, row_weights=batch.kl_weights)

    def forward_backward(self, batch: PolicyBatch, micro_sizes: list[int] | None = None, *, dp_size: int) -> dict[str, float]:
        """Gradients of the mini-batch loss, reduced over DP, in the DDP grad buffers (no step).
        See :meth:`_forward_backward` (with the batch's own ``old_log_probs``)."""
        return self._forward_backward(batch, micro_sizes, on_policy=False, dp_size=dp_size)[0]

    def forward_backward_on_policy(
        self, batch: PolicyBatch, micro_sizes: list[int] | None = None, *, dp_size: int
    ) -> tuple[dict[str, float], torch.Tensor]:
        """:meth:`forward_backward` of an on-policy mini-batch (the weights being updated generated
        its rows): the old log-probs are the detached log-probs of this forward pass
        (:meth:`micro_batch_loss` with ``on_policy``), and they are returned, float32 [N, T] (zero
        outside ``batch.response_mask``, as :func:`~fastrl.models.logprobs.compute_log_probs`
        gives them) on every pipeline stage, for the later passes over these rows and the
        engine/trainer mismatch guard."""
        metrics, captured = self._forward_backward(batch, micro_sizes, on_policy=True, dp_size=dp_size)
        return metrics, cast(torch.Tensor, captured)

    def _forward_backward(
        self, batch: PolicyBatch, micro_sizes: list[int] | None, *, on_policy: bool, dp_size: int
    ) -> tuple[dict[str, float], torch.Tensor | None]:
        """Gradients of the mini-batch loss, reduced over DP, in the DDP grad buffers (no step).

        ``micro_sizes``: rows of each consecutive micro-batch (summing to ``len(batch)``; the free
        geometry's token-budget cut, :func:`fastrl.training.geometry.token_micro_batches`; no
        pipeline parallelism). None: micro-batches of ``parallel.micro_batch_size``. The loss of
        each micro-batch is its token sum over the global denominator, so the gradient is the same
        for every cut (``tests/distributed/test_split_invariance.py``).

        ``dp_size``: the data-parallel ranks running this update alike (the step geometry's,
        :attr:`~fastrl.training.geometry.UpdatePlan.dp_size`): megatron averages the gradients
        over them, and the loss handed to it is scaled by it to undo that average.

        Returns:
            The metrics: ``actor/loss`` (the global mini-batch loss, identical on every rank of the
            last pipeline stage after the DP all-reduce; also broadcast to earlier stages),
            ``actor/pg_loss``, ``actor/kl_loss``, and for every other loss metric its plain mean
            over the micro-batches and then over the DP ranks (each micro-batch counts once,
            whatever its token count; within a micro-batch the metric is a token mean,
            :mod:`fastrl.algorithms.losses`); and with ``on_policy`` the forward's detached
            log-probs, float32 [N, T] on every pipeline stage (None otherwise).
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {dp_size}")
        chunks = self.policy.chunks
        for chunk in chunks:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        if micro_sizes is None:
            micro_batches = list(batch.micro_batches(self.micro_batch_size))
        else:
            if sum(micro_sizes) != len(batch) or min(micro_sizes, default=0) < 1:
                raise ValueError(f"micro-batch sizes {micro_sizes} do not split {len(batch)} rollouts")
            bounds = [0]
            for size in micro_sizes:
                bounds.append(bounds[-1] + size)
            micro_batches = [batch.select(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]
        micro_batches = logprob_ops.fit_micro_batches(micro_batches, self.sequence_multiple)
        global_den = collectives.all_reduce_sum_dp(self.local_denominator(batch))  # the one DP reduction before the loss
        if float(global_den) <= 0:
            raise ValueError("the mini-batch has no response tokens on any DP rank")
        scale = len(micro_batches) * dp_size
        captured: list[torch.Tensor] = []
        t = batch.seq_length

        def loss_fn(mb: PolicyBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            lp = logprob_ops.token_log_probs_from_logits(logits, mb.input_ids, self.temperature)
            if on_policy:
                captured.append(torch.nn.functional.pad(lp.detach() * mb.response_mask, (0, t - mb.seq_length)))
            loss, metrics = self.micro_batch_loss(mb, lp, global_den.to(lp.dtype), on_policy=on_policy)
            return loss * scale, metrics

        outputs = get_forward_backward_func()(
            forward_step_func=logprob_ops.forward_step_fn(micro_batches, loss_fn),
            data_iterator=None,
            model=chunks,
            num_microbatches=len(micro_batches),
            seq_length=batch.seq_length,
            micro_batch_size=len(micro_batches[0]),  # unused without pipeline parallelism
            forward_only=False,
        )
        metrics = self._reduce_metrics(outputs, dp_size)
        if not on_policy:
            return metrics, None
        device = batch.input_ids.device
        local = torch.cat(captured).to(device) if collectives.pipeline_is_last_stage() else None
        return metrics, collectives.broadcast_from_last_pipeline_stage(local, (len(batch), t), torch.float32, device)

    def _reduce_metrics(self, outputs: list[dict[str, torch.Tensor]], dp: int) -> dict[str, float]:
        sums = {"actor/loss", "actor/pg_loss", "actor/kl_loss"}  # shares of the mini-batch loss: add up

        def on_last_stage() -> dict[str, float]:  # the last pipeline stage holds the loss outputs
            return {
                k: float(torch.stack([o[k].double() for o in outputs]).sum() if k in sums else torch.stack([o[k].double() for o in outputs]).mean())
                for k in sorted(outputs[0])
            }

        local = collectives.computed_on_last_pipeline_stage(on_last_stage, what="the update's loss metrics")
        keys = sorted(local)
        values = collectives.all_reduce_sum_dp(torch.tensor([local[k] for k in keys], dtype=torch.float64))
        return {k: float(v) if k in sums else float(v) / dp for k, v in zip(keys, values)}

    #: Optimizer updates skipped in a row by :meth:`step` (non-finite loss or gradient); 0 after an applied one.
    skipped_in_a_row: int = 0

    def step(
        self, *, scheduler: Any, lr_position: int | float | None = None, loss: float | None = None
    ) -> dict[str, float]:
        """Clip the gradient norm, take the optimizer step and advance the LR schedule ``scheduler``
        (the train state's, :func:`build_lr_scheduler` over this actor's optimizer), unless the
        loss or a gradient is not finite: then the update is skipped (weights, Adam moments and the
        schedule unchanged; ``actor/update_skipped`` 1, :attr:`skipped_in_a_row` counts it), as
        megatron-LM skips an iteration whose gradients overflow. The check is this rank's ``loss``
        (None: not checked) and its gradient buffers, agreed over every rank (one MAX all-reduce).

        ``lr_position``: the schedule position after this update, in schedule units (the
        trainer's :func:`~fastrl.training.geometry.lr_positions`: ``updates_per_step_estimate``
        units per RL step); None advances the schedule by one unit. The LR returned
        (``actor/lr``) is the one the schedule sets for the next update. ``actor/grad_norm`` is
        megatron's (NaN when it computes none, e.g. fp32 without clipping, or for a skipped update).

        Raises:
            ValueError: ``lr_position`` is negative or not finite.
        """
        if lr_position is not None and not (0 <= lr_position < float("inf")):
            raise ValueError(f"lr_position must be a finite number of schedule units >= 0, got {lr_position!r}")
        sums = [g.sum() for g in _grad_buffers(self.policy.chunks)]  # NaN / inf propagate (no copy of the buffer)
        grads_bad = bool(sums) and not bool(torch.isfinite(torch.stack([x.float() for x in sums])).all())
        if world.any_rank(grads_bad or (loss is not None and not math.isfinite(loss))):
            self.skipped_in_a_row += 1
            return {"actor/grad_norm": float("nan"), "actor/lr": float(self.optimizer.param_groups[0]["lr"]),
                    "actor/update_skipped": 1.0}
        self.skipped_in_a_row = 0
        ok, grad_norm, _ = self.optimizer.step()
        if lr_position is None:
            scheduler.step(increment=1)
        else:
            scheduler.num_steps = lr_position
            scheduler.step(increment=0)
        return {
            "actor/grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
            "actor/lr": float(self.optimizer.param_groups[0]["lr"]),
            "actor/update_skipped": float(not ok),
        }

    def update(
        self, batch: PolicyBatch, micro_sizes: list[int] | None = None, *, dp_size: int, scheduler: Any,
        lr_position: int | float | None = None,
    ) -> dict[str, float]:
        """One optimizer step on this DP rank's share of a mini-batch; global metrics
        (``dp_size``: :meth:`_forward_backward`; ``scheduler``, ``lr_position`` and the skip of a
        non-finite update: :meth:`step`)."""
        metrics = self.forward_backward(batch, micro_sizes, dp_size=dp_size)
        metrics.update(self.step(scheduler=scheduler, lr_position=lr_position, loss=metrics.get("actor/loss")))
        return metrics


def _grad_buffers(chunks: list[Any]) -> list[torch.Tensor]:
    """The gradients of megatron DDP model ``chunks``: each grad buffer's data (DP-reduced after the
    backward pass), or, for a chunk without buffers, each parameter's ``main_grad`` / ``grad``."""
    out = []
    for chunk in chunks:
        # megatron's DDP sets these lists (shadowing nn.Module.buffers()); other modules have none
        buffers = [b for name in ("buffers", "expert_parallel_buffers")
                   if isinstance(found := getattr(chunk, name, None), (list, tuple)) for b in found]
        if buffers:
            out.extend(b.grad_data for b in buffers)
            continue
        for p in chunk.parameters():
            g = getattr(p, "main_grad", None)
            g = p.grad if g is None else g
            if g is not None:
                out.append(g)
    return out
