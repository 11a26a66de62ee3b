"""Functions run on every rank by the distributed tests (importable by spawned processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fastrl.config import ParallelConfig, PrecisionConfig
from hf_models import VOCAB

IMAGE_TOKEN = VOCAB - 4
PATCH_DIM = 3 * 2 * 14 * 14  # channels x temporal patch x patch x patch


def make_batch(n: int = 4, t: int = 12, *, seed: int = 0, images: bool = False):
    """A deterministic right-padded batch: prompts of 3-5 tokens, responses of 2-7 tokens.

    With ``images`` every even rollout's prompt starts with one image (a 2x2 patch grid merged into
    one image token).
    """
    from fastrl.training.policy_batch import PolicyBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(n, t, dtype=torch.long)
    attn = torch.zeros(n, t, dtype=torch.bool)
    resp = torch.zeros(n, t, dtype=torch.bool)
    pixels: list[Any] = []
    grids: list[Any] = []
    for i in range(n):
        p = 3 + i % 3
        r = 2 + (5 * i) % 6
        ids[i, : p + r] = torch.randint(0, VOCAB - 8, (p + r,), generator=g)
        attn[i, : p + r] = True
        resp[i, p : p + r] = True
        if images and i % 2 == 0:
            ids[i, 1] = IMAGE_TOKEN
            pixels.append(torch.randn(4, PATCH_DIM, generator=g))
            grids.append(torch.tensor([[1, 2, 2]]))
        else:
            pixels.append(None)
            grids.append(None)
    return PolicyBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp,
        pixel_values=pixels if images else None,
        image_grid_thw=grids if images else None,
    )


def hf_log_probs(hf_dir: Path, batch) -> torch.Tensor:
    """Reference: a plain Hugging Face forward of the same weights, float32 [N, T] aligned with input_ids."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2_5_VLForConditionalGeneration

    config = AutoConfig.from_pretrained(hf_dir)
    if config.model_type == "qwen2_5_vl":
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(hf_dir, torch_dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    model.eval()
    kwargs: dict[str, Any] = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask.long()}
    if batch.image_grid_thw is not None:
        kwargs.update(batch.model_inputs())
        kwargs.pop("position_ids")
        kwargs["attention_mask"] = batch.attention_mask.long()
    with torch.no_grad():
        logits = model(**kwargs).logits.float()
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(lp, (1, 0)) * batch.response_mask


def _init(tp: int, pp: int, seed: int = 1):
    from fastrl.distributed import parallel_state

    parallel = ParallelConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, backend="gloo")
    return parallel, parallel_state.initialize(parallel, seed=seed)


def log_probs_worker(hf_dir: Path, tp: int, pp: int, images: bool, precision: str = "fp32") -> dict[str, Any]:
    """Log-probs of :func:`make_batch` (this DP rank's share) under the megatron policy."""
    from fastrl.models.provider import build_policy
    from fastrl.training.logprobs import compute_log_probs

    parallel, ctx = _init(tp, pp)
    policy = build_policy(hf_dir, parallel=parallel, precision=PrecisionConfig(mode=precision), trainable=False)
    batch = make_batch(images=images)
    share = len(batch) // ctx.dp_size
    mine = batch.select(range(ctx.dp_rank * share, (ctx.dp_rank + 1) * share))
    lp = compute_log_probs(policy.chunks, mine, micro_batch_size=1)
    return {"dp_rank": ctx.dp_rank, "tp_rank": ctx.tp_rank, "pp_rank": ctx.pp_rank, "log_probs": lp}


def make_train_batch(hf_dir: Path, n: int = 4):
    """:func:`make_batch` with advantages, old and reference log-probs near the model's own."""
    batch = make_batch(n)
    g = torch.Generator().manual_seed(7)
    lp = hf_log_probs(hf_dir, batch)
    m = batch.response_mask
    old = (lp + 0.3 * torch.randn(lp.shape, generator=g)) * m  # ratios away from 1: clipping is active
    ref = (lp + 0.2 * torch.randn(lp.shape, generator=g)) * m
    adv = torch.randn(n, generator=g)
    return batch.with_tensors(advantages=adv, old_log_probs=old, ref_log_probs=ref)


def hf_loss_and_grads(hf_dir: Path, algorithm) -> tuple[float, dict[str, torch.Tensor]]:
    """Reference loss and gradients: a plain Hugging Face forward/backward of the whole batch."""
    from transformers import AutoModelForCausalLM

    from fastrl.algorithms.losses import kl_loss, loss_denominator, ppo_clip_loss

    batch = make_train_batch(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    lp = torch.nn.functional.pad(lp, (1, 0))
    agg = algorithm.loss_agg.replace("_", "-")
    den = loss_denominator(batch.response_mask, agg)
    t = batch.tensors
    pg, _ = ppo_clip_loss(
        lp, t["old_log_probs"], t["advantages"], batch.response_mask, global_denominator=den,
        clip_low=algorithm.clip_low, clip_high=algorithm.clip_high, dual_clip=algorithm.dual_clip_c, agg_mode=agg,
    )  # fmt: skip
    kl, _ = kl_loss(lp, t["ref_log_probs"], batch.response_mask, global_denominator=den, estimator=algorithm.kl_estimator, agg_mode=agg)
    loss = pg + algorithm.kl_coef * kl
    loss.backward()
    return float(loss.detach()), {name: p.grad.clone() for name, p in model.named_parameters()}


def train_worker(hf_dir: Path, tp: int, pp: int, algorithm, *, distributed_optimizer: bool, step: bool, precision: str = "fp32") -> dict[str, Any]:
    """One mini-batch through the actor: the global loss, and either the full gradients (exported
    under Hugging Face names, ``step=False``, plain DDP) or the weights after one Adam step."""
    from fastrl.config import OptimizerConfig
    from fastrl.distributed import parallel_state
    from fastrl.models.provider import build_policy, export_hf_weights
    from fastrl.training.actor import Actor

    parallel = ParallelConfig(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, backend="gloo",
        use_distributed_optimizer=distributed_optimizer, micro_batch_size=1,
    )  # fmt: skip
    ctx = parallel_state.initialize(parallel, seed=1)
    policy = build_policy(hf_dir, parallel=parallel, precision=PrecisionConfig(mode=precision), trainable=True)
    actor = Actor(
        policy, algorithm=algorithm, optimizer=OptimizerConfig(lr=1e-3, clip_grad=1.0, weight_decay=0.0),
        parallel=parallel, precision=PrecisionConfig(mode=precision), total_steps=10,
    )  # fmt: skip
    batch = make_train_batch(hf_dir)
    share = len(batch) // ctx.dp_size
    mine = batch.select(range(ctx.dp_rank * share, (ctx.dp_rank + 1) * share))
    metrics = actor.forward_backward(mine)
    if step:
        metrics.update(actor.step())
    else:
        with torch.no_grad():
            for p in policy.parameters():
                p.data.copy_(p.main_grad.to(p.dtype))
    tensors = {name: t.clone() for name, t in export_hf_weights(policy)}
    return {"metrics": metrics, "tensors": tensors if ctx.rank == 0 else None}
