"""Per-token log-probabilities of rollouts under a megatron-core policy, and engine/trainer mismatch.

The output layer of a tensor-parallel model holds a slice of the vocabulary on each TP rank; the
log-softmax is computed across those slices without gathering the logits
(megatron-core ``vocab_parallel_cross_entropy``: one all-reduce of the max and one of the sum of
exponentials per token over the TP group, plus one of the target logit). With pipeline parallelism
the micro-batches run through megatron-core's schedule (``get_forward_backward_func``,
``forward_only=True``); log-probs are produced on the last stage and broadcast to the others.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import torch

from fastrl.batch import PolicyBatch
from fastrl.distributed import collectives


def token_log_probs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of ``input_ids`` from vocab-parallel logits, aligned with ``input_ids``.

    Args:
        logits: float [N, T, V / TP], this TP rank's vocabulary slice (``V`` padded vocabulary).
        input_ids: int64 [N, T].
        temperature: logits are divided by it (the sampling temperature of the rollouts).

    Returns:
        float32 [N, T]; column ``t >= 1`` is ``log softmax(logits[:, t-1] / temperature)[input_ids[:, t]]``,
        column 0 is 0. Differentiable.
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    scaled = logits[:, :-1, :].float() / temperature  # a new tensor: the op below works in place
    nll = vocab_parallel_cross_entropy(scaled, input_ids[:, 1:])
    return torch.nn.functional.pad(-nll, (1, 0))


def forward_step_fn(
    micro_batches: list[PolicyBatch],
    loss_fn: Callable[[PolicyBatch, torch.Tensor], Any],
) -> Callable:
    """A megatron ``forward_step_func`` that feeds ``micro_batches`` in order.

    ``loss_fn(micro_batch, output)`` receives the last stage's output (vocab-parallel logits) and
    returns what megatron's schedule expects of a loss function.
    """
    it = iter(micro_batches)

    def forward_step(data_iterator: Any, model: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
        mb = next(it).to(next(model.parameters()).device)  # batches stay on the CPU; micro-batches move
        output = model(**mb.model_inputs())
        # A stage's output is sent to the next stage as is; point-to-point sends need a contiguous
        # tensor (the Qwen2.5-VL chunk returns a transposed view in training mode with more than
        # one rollout per micro-batch). A copy when needed; gradients flow through it.
        return output.contiguous(), partial(_call_loss, loss_fn, mb)

    return forward_step


def _call_loss(loss_fn: Callable, mb: PolicyBatch, output: torch.Tensor, non_loss_data: bool = False) -> Any:
    return loss_fn(mb, output)


def fit_micro_batches(micro_batches: list[PolicyBatch], sequence_multiple: int | None) -> list[PolicyBatch]:
    """Each micro-batch at its own length: cut to its longest row rounded up to
    ``sequence_multiple`` (:meth:`PolicyBatch.trimmed`; the FP8 / sequence-parallel multiple of
    :func:`fastrl.training.rollout_batch.sequence_multiple`), so a micro-batch of short rollouts
    does not compute on the padding that the rank batch's longest rollout needed.

    Unchanged when ``sequence_multiple`` is None or with pipeline parallelism: megatron-core's
    pipeline schedules send every micro-batch between stages in one fixed shape
    ``[seq_length, micro_batch_size, hidden]`` (``pipeline_parallel.schedules.get_tensor_shapes``).
    """
    if sequence_multiple is None or collectives.pipeline_size() > 1:
        return micro_batches
    return [mb.trimmed(sequence_multiple) for mb in micro_batches]


@torch.no_grad()
def compute_log_probs(
    chunks: list[torch.nn.Module],
    batch: PolicyBatch,
    *,
    micro_batch_size: int,
    temperature: float = 1.0,
    sequence_multiple: int | None = None,
) -> torch.Tensor:
    """Per-token log-probs of ``batch`` under the model ``chunks`` (actor or reference policy).

    Runs on every rank of a model replica (TP x PP ranks); each DP rank passes its own rollouts.

    Args:
        chunks: the model chunks of this pipeline stage.
        batch: N rollouts, N a multiple of ``micro_batch_size``.
        micro_batch_size: rollouts per forward micro-batch.
        temperature: sampling temperature of the rollouts.
        sequence_multiple: None: every micro-batch runs at the batch's ``T``; else each at its own
            longest row rounded up to this multiple (:func:`fit_micro_batches`), its log-probs
            zero-padded back to ``T``.

    Returns:
        float32 [N, T] on every pipeline stage, on ``batch``'s device (micro-batches run on the
        model's device), zero outside ``batch.response_mask``.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    for chunk in chunks:
        chunk.eval()
    micro_batches = fit_micro_batches(list(batch.micro_batches(micro_batch_size)), sequence_multiple)
    t = batch.seq_length

    def loss_fn(mb: PolicyBatch, logits: torch.Tensor) -> torch.Tensor:
        lp = token_log_probs_from_logits(logits, mb.input_ids, temperature) * mb.response_mask
        return torch.nn.functional.pad(lp, (0, t - mb.seq_length))

    outputs = get_forward_backward_func()(
        forward_step_func=forward_step_fn(micro_batches, loss_fn),
        data_iterator=None,
        model=chunks,
        num_microbatches=len(micro_batches),
        seq_length=batch.seq_length,
        micro_batch_size=micro_batch_size,
        forward_only=True,
        collect_non_loss_data=True,
    )
    result = torch.cat(outputs).to(batch.input_ids.device) if collectives.pipeline_is_last_stage() else None
    return collectives.broadcast_from_last_pipeline_stage(
        result, (len(batch), batch.seq_length), torch.float32, batch.input_ids.device
    )


def mismatch_metrics(trainer_log_probs: torch.Tensor, engine_log_probs: torch.Tensor, response_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far the rollout engine's log-probs are from the trainer's on the same tokens.

    Args:
        trainer_log_probs, engine_log_probs: float [N, T]; response_mask: bool [N, T].

    Returns:
        Local sums (reduce over DP by summing, then divide by ``tokens``): ``tokens``,
        ``abs_diff_sum`` (sum |lp_trainer - lp_engine|), ``kl_k3_sum`` (k3 estimate of
        KL(engine || trainer), Schulman 2020 "Approximating KL divergence"), ``ratio_sum``
        (sum exp(lp_trainer - lp_engine)); and ``abs_diff_max`` (reduce with max).
    """
    m = response_mask.to(torch.float64)
    diff = (trainer_log_probs.double() - engine_log_probs.double()) * m
    log_ratio = (engine_log_probs.double() - trainer_log_probs.double()) * m
    k3 = (torch.exp(-log_ratio) - 1 + log_ratio) * m  # r = p_trainer / p_engine; k3 = r - 1 - log r
    return {
        "tokens": m.sum(),
        "abs_diff_sum": diff.abs().sum(),
        "abs_diff_max": diff.abs().max() if diff.numel() else torch.zeros((), dtype=torch.float64),
        "kl_k3_sum": k3.sum(),
        "ratio_sum": (torch.exp(-log_ratio) * m).sum(),
    }


def reduce_mismatch_metrics(local: dict[str, torch.Tensor]) -> dict[str, float]:
    """Global engine/trainer mismatch metrics from :func:`mismatch_metrics` on every DP rank.

    Returns ``mismatch/abs_diff_mean``, ``mismatch/abs_diff_max``, ``mismatch/kl_k3``,
    ``mismatch/ratio_mean`` over all response tokens of all DP ranks.
    """
    sums = collectives.all_reduce_dp(torch.stack([local["tokens"], local["abs_diff_sum"], local["kl_k3_sum"], local["ratio_sum"]]))
    peak = collectives.all_reduce_dp(local["abs_diff_max"].reshape(1), op="max")
    tokens = max(float(sums[0]), 1.0)
    return {
        "mismatch/abs_diff_mean": float(sums[1]) / tokens,
        "mismatch/abs_diff_max": float(peak[0]),
        "mismatch/kl_k3": float(sums[2]) / tokens,
        "mismatch/ratio_mean": float(sums[3]) / tokens,
    }


@torch.no_grad()
def megatron_logits(policy, batch) -> torch.Tensor:
    """Full-vocabulary logits of ``batch`` (a :class:`~fastrl.batch.PolicyBatch`).

    Collective over the model-parallel processes: the vocab-parallel output is gathered over TP
    and broadcast from the last pipeline stage.

    Returns:
        float32 [N, T, V] (``V`` the megatron model's padded vocabulary) on every rank.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region


    for chunk in policy.chunks:
        chunk.eval()
    n = len(batch)
    outputs = get_forward_backward_func()(
        forward_step_func=forward_step_fn([batch], lambda mb, logits: gather_from_tensor_model_parallel_region(logits).float()),
        data_iterator=None,
        model=policy.chunks,
        num_microbatches=1,
        seq_length=batch.seq_length,
        micro_batch_size=n,
        forward_only=True,
        collect_non_loss_data=True,
    )
    result = outputs[0] if collectives.pipeline_is_last_stage() else None
    return collectives.broadcast_from_last_pipeline_stage(
        result, (n, batch.seq_length, policy.vocab_size), torch.float32, batch.input_ids.device
    )
