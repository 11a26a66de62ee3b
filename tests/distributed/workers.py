"""Functions run on every rank by the distributed tests (importable by spawned processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from hf_models import VOCAB

from fastrl.config import ParallelConfig, PrecisionConfig

PATCH_DIM = 3 * 2 * 14 * 14  # channels x temporal patch x patch x patch


def image_token_id(hf_dir: Path) -> int:
    import json

    return int(json.loads((Path(hf_dir) / "config.json").read_text())["image_token_id"])


def make_batch(n: int = 4, t: int = 12, *, seed: int = 0, image_token: int | None = None):
    """A deterministic right-padded batch: prompts of 3-5 tokens, responses of 2-7 tokens.

    Ordinary tokens are drawn from [10, VOCAB - 8) (no special token of either test model). With
    ``image_token`` every even rollout's prompt holds one image (a 2x2 patch grid merged into one
    image token).
    """
    images = image_token is not None
    from fastrl.batch import PolicyBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(n, t, dtype=torch.long)
    attn = torch.zeros(n, t, dtype=torch.bool)
    resp = torch.zeros(n, t, dtype=torch.bool)
    pixels: list[Any] = []
    grids: list[Any] = []
    for i in range(n):
        p = 3 + i % 3
        r = 2 + (5 * i) % 6
        ids[i, : p + r] = torch.randint(10, VOCAB - 8, (p + r,), generator=g)
        attn[i, : p + r] = True
        resp[i, p : p + r] = True
        if images and i % 2 == 0:
            ids[i, 1] = image_token
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
    from fastrl.models.logprobs import compute_log_probs
    from fastrl.models.provider import build_policy, export_hf_weights

    parallel, ctx = _init(tp, pp)
    policy = build_policy(hf_dir, parallel=parallel, precision=PrecisionConfig(mode=precision), trainable=False)
    batch = make_batch(image_token=image_token_id(hf_dir) if images else None)
    share = len(batch) // ctx.dp_size
    mine = batch.select(range(ctx.dp_rank * share, (ctx.dp_rank + 1) * share))
    seen: list[int] = []  # the sequence length each forward of the first chunk was given

    def record(module: Any, args: tuple, kwargs: dict) -> None:
        seen.append(int(kwargs["input_ids"].shape[1]))

    hook = policy.chunks[0].register_forward_pre_hook(record, with_kwargs=True)
    lp = compute_log_probs(policy.chunks, mine, micro_batch_size=1, sequence_multiple=1)
    hook.remove()
    exported = {name: t.clone() for name, t in export_hf_weights(policy)}
    return {
        "dp_rank": ctx.dp_rank, "tp_rank": ctx.tp_rank, "pp_rank": ctx.pp_rank, "log_probs": lp,
        "exported": exported if ctx.rank == 0 else None, "seen_lengths": seen, "rows": list(range(ctx.dp_rank * share, (ctx.dp_rank + 1) * share)),
    }  # fmt: skip


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

    from fastrl.algorithms.losses import gspo_loss, kl_loss, loss_denominator, ppo_clip_loss

    batch = make_train_batch(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    lp = torch.nn.functional.pad(lp, (1, 0))
    agg = algorithm.loss_agg.replace("_", "-")
    den = loss_denominator(batch.response_mask, agg)
    if algorithm.loss_type == "ppo":
        pg, _ = ppo_clip_loss(
            lp, batch.old_log_probs, batch.advantages, batch.response_mask, global_denominator=den,
            clip_low=algorithm.clip_low, clip_high=algorithm.clip_high, dual_clip=algorithm.dual_clip_c, agg_mode=agg,
        )  # fmt: skip
    else:
        pg, _ = gspo_loss(
            lp, batch.old_log_probs, batch.advantages, batch.response_mask, global_denominator=den,
            clip_low=algorithm.gspo_clip_low, clip_high=algorithm.gspo_clip_high,
            variant="token" if algorithm.loss_type == "gspo_token" else "sequence", agg_mode=agg,
        )  # fmt: skip
    kl, _ = kl_loss(lp, batch.ref_log_probs, batch.response_mask, global_denominator=den, estimator=algorithm.kl_estimator, agg_mode=agg)
    loss = pg + algorithm.kl_coef * kl
    loss.backward()
    return float(loss.detach()), {name: p.grad.clone() for name, p in model.named_parameters()}


def train_worker(hf_dir: Path, tp: int, pp: int, algorithm, *, distributed_optimizer: bool, step: bool, precision: str = "fp32") -> dict[str, Any]:
    """One mini-batch through the actor: the global loss, and either the full gradients (exported
    under Hugging Face names, ``step=False``, plain DDP) or the weights after one Adam step."""
    from fastrl.config import OptimizerConfig
    from fastrl.distributed import parallel_state
    from fastrl.models.provider import build_policy, export_hf_weights
    from fastrl.training.actor import Actor, build_lr_scheduler

    parallel = ParallelConfig(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, backend="gloo",
        use_distributed_optimizer=distributed_optimizer, micro_batch_size=1,
    )  # fmt: skip
    ctx = parallel_state.initialize(parallel, seed=1)
    policy = build_policy(hf_dir, parallel=parallel, precision=PrecisionConfig(mode=precision), trainable=True)
    actor = Actor(
        policy, algorithm=algorithm, optimizer=OptimizerConfig(lr=1e-3, clip_grad=1.0, weight_decay=0.0),
        parallel=parallel, precision=PrecisionConfig(mode=precision),
    )  # fmt: skip
    batch = make_train_batch(hf_dir)
    share = len(batch) // ctx.dp_size
    mine = batch.select(range(ctx.dp_rank * share, (ctx.dp_rank + 1) * share))
    metrics = actor.forward_backward(mine, dp_size=ctx.dp_size)
    if step:
        scheduler = build_lr_scheduler(actor.optimizer, OptimizerConfig(lr=1e-3, clip_grad=1.0, weight_decay=0.0), 10)
        metrics.update(actor.step(scheduler=scheduler))
    else:
        with torch.no_grad():
            for p in policy.parameters():
                p.data.copy_(p.main_grad.to(p.dtype))
    tensors = {name: t.clone() for name, t in export_hf_weights(policy)}
    return {"metrics": metrics, "tensors": tensors if ctx.rank == 0 else None}


def make_rollouts(num_groups: int, n: int, *, seed: int = 3):
    """A deterministic global batch of ``num_groups x n`` rollouts for pruning tests.

    Returns ``(batch, group_ids, advantages, responses)``: responses are short token sequences over
    a 6-token alphabet (so some are near-duplicates), rewards are 0/1, advantages GRPO's.
    """
    from fastrl.algorithms.advantages import grpo_advantages
    from fastrl.batch import PolicyBatch

    g = torch.Generator().manual_seed(seed)
    total = num_groups * n
    group_ids = torch.arange(num_groups).repeat_interleave(n)
    rewards = torch.randint(0, 2, (total,), generator=g).double()
    advantages = grpo_advantages(rewards, group_ids)
    prompt_len = 3
    responses = [torch.randint(10, 16, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g) for _ in range(total)]
    t = prompt_len + max(len(r) for r in responses)
    ids = torch.zeros(total, t, dtype=torch.long)
    attn = torch.zeros(total, t, dtype=torch.bool)
    resp = torch.zeros(total, t, dtype=torch.bool)
    for i, r in enumerate(responses):
        ids[i, :prompt_len] = 100 + group_ids[i]
        ids[i, prompt_len : prompt_len + len(r)] = r
        attn[i, : prompt_len + len(r)] = True
        resp[i, prompt_len : prompt_len + len(r)] = True
    batch = PolicyBatch(input_ids=ids, attention_mask=attn, response_mask=resp, advantages=advantages)
    return batch, group_ids, advantages, responses


def split_sizes(total: int, dp: int, uneven: bool) -> list[int]:
    if not uneven:
        return [total // dp] * dp
    sizes = [total // dp] * dp
    sizes[0] += total - sum(sizes)
    if dp > 1 and sizes[1] > 1:  # shift one rollout from rank 1 to rank 0
        sizes[0] += 1
        sizes[1] -= 1
    return sizes


def pruning_worker(tp: int, num_groups: int, n: int, multiple: int, mode: str, weighted: bool = False) -> dict[str, Any]:
    """DP-global MDAP pruning + re-partition on this rank's share of :func:`make_rollouts`
    (``weighted``: advantages scaled by the global bucket-size weights before the re-partition)."""
    from fastrl.algorithms.minhash import ResponseSketch, minhash_sketch
    from fastrl.algorithms.prune_weights import bucket_size_weights
    from fastrl.algorithms.pruning import mdap_select
    from fastrl.distributed import dp_pruning

    _, ctx = _init(tp, 1)
    batch, group_ids, advantages, responses = make_rollouts(num_groups, n)
    sizes = split_sizes(len(batch), ctx.dp_size, uneven=True)
    start = sum(sizes[: ctx.dp_rank])
    rows = list(range(start, start + sizes[ctx.dp_rank]))
    local_batch = batch.select(rows)
    if mode == "exact":
        local = dp_pruning.LocalPruningInputs(
            group_ids=group_ids[rows], advantages=advantages[rows], lengths=local_batch.lengths,
            response_lengths=torch.tensor([len(responses[i]) for i in rows]), responses=[responses[i] for i in rows],
        )  # fmt: skip

        def prune(g):
            return mdap_select(g.advantages, g.group_ids, g.responses, multiple=multiple)
    else:
        sig, resp_len = minhash_sketch([responses[i] for i in rows], num_bins=64).to_tensors()
        local = dp_pruning.LocalPruningInputs(
            group_ids=group_ids[rows], advantages=advantages[rows], lengths=local_batch.lengths,
            signatures=sig, response_lengths=resp_len,
        )  # fmt: skip

        def prune(g):
            sketch = ResponseSketch.from_tensors(g.signatures, g.response_lengths, ngram=1, seed=0)
            return mdap_select(g.advantages, g.group_ids, sketch, multiple=multiple)

    g, result = dp_pruning.dp_global_prune(local, prune, dp_size=ctx.dp_size)
    if weighted:
        local_batch = dp_pruning.scale_local_advantages(
            local_batch, g, bucket_size_weights(g.advantages, g.group_ids, result.keep)
        )
    mine = dp_pruning.repartition(local_batch, g, result.keep)
    offsets = [sum(sizes[:r]) for r in range(ctx.dp_size + 1)]
    same = dp_pruning.repartition_kept(local_batch, result.keep, offsets)  # the trainer's entry point
    assert torch.equal(same.input_ids, mine.input_ids) and torch.equal(same.advantages, mine.advantages)
    logged = dp_pruning.gather_for_logging(local.advantages)
    return {
        "dp_rank": ctx.dp_rank,
        "tp_rank": ctx.tp_rank,
        "keep": result.keep,
        "keep_local": result.keep[g.rows_of(ctx.dp_rank)],
        "input_ids": mine.input_ids,
        "lengths": mine.lengths,
        "advantages": mine.advantages,
        "logged_advantages": logged,
    }


def bf16_and_reference_worker(hf_dir: Path) -> dict[str, Any]:
    """bf16 actor update (fp32 master weights) next to a frozen, CPU-offloaded reference policy."""
    from fastrl.config import AlgorithmConfig, OptimizerConfig
    from fastrl.distributed import parallel_state
    from fastrl.models.logprobs import compute_log_probs, mismatch_metrics
    from fastrl.models.provider import build_policy, offload_to_cpu, reload_to_device
    from fastrl.training.actor import Actor, build_lr_scheduler

    parallel = ParallelConfig(tensor_model_parallel_size=2, backend="gloo", micro_batch_size=2)
    ctx = parallel_state.initialize(parallel, seed=1)
    bf16 = PrecisionConfig(mode="bf16")
    actor_policy = build_policy(hf_dir, parallel=parallel, precision=bf16, trainable=True)
    reference = build_policy(hf_dir, parallel=parallel, precision=PrecisionConfig(), trainable=False)
    actor = Actor(
        actor_policy, algorithm=AlgorithmConfig(), optimizer=OptimizerConfig(lr=1e-3),
        parallel=parallel, precision=bf16,
    )  # fmt: skip
    batch = make_train_batch(hf_dir)
    offload_to_cpu(reference)
    reload_to_device(reference, torch.device("cpu"))
    ref_lp = compute_log_probs(reference.chunks, batch, micro_batch_size=2)
    before = actor.log_probs(batch)
    scheduler = build_lr_scheduler(actor.optimizer, OptimizerConfig(lr=1e-3), 4)
    metrics = actor.update(batch.with_tensors(ref_log_probs=ref_lp), dp_size=ctx.dp_size, scheduler=scheduler)
    after = actor.log_probs(batch)
    ref_after = compute_log_probs(reference.chunks, batch, micro_batch_size=2)
    return {
        "param_dtypes": sorted({str(p.dtype) for p in actor_policy.parameters()}),
        "main_param_dtypes": sorted({str(p.dtype) for g in actor.optimizer.optimizer.param_groups for p in g["params"]}),
        "ref_requires_grad": any(p.requires_grad for p in reference.parameters()),
        "metrics": metrics,
        "before": before,
        "after": after,
        "ref": ref_lp,
        "ref_after": ref_after,
        "mismatch": {k: float(v) for k, v in mismatch_metrics(before, ref_lp, batch.response_mask).items()},
    }
