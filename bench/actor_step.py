#!/usr/bin/env python
"""Actor step throughput and memory: the tiny and a ~1B Qwen2.5-VL-architecture policy, per precision.

Measures, in one process on one device (a GPU when CUDA is available, else the CPU), for each
model and precision:

- the log-prob pass (``compute_log_probs``: what the old and reference passes cost) in tokens/s;
- the actor update (``Actor.forward_backward`` + ``Actor.step``: PPO loss, backward, clipped Adam
  step of megatron's DistributedOptimizer) in tokens/s;
- peak memory: ``torch.cuda.max_memory_allocated`` on a GPU (bytes), the process's peak resident
  set on the CPU (bytes, monotone over the run, so only the first configuration's is its own);

and each configuration's update throughput as a ratio to the first precision measured for the
same model (the baseline of the same run). Tokens are every non-padding token of the batch (prompt
and response). FP8 goes through Transformer Engine layers; where Transformer Engine is missing,
the FP8 row says "not measured" with the reason -- never a silent bf16 run under the FP8 name.

Models (random weights, built locally from a config; no download):

- ``tiny``: the CPU recipes' policy (text hidden 256, 4 layers; vision depth 2, width 128; 3.5M
  parameters);
- ``1b``: text hidden 2048, 16 layers, 16 query / 2 key-value heads, MLP 8192; vision depth 4,
  width 1280 (about 1.03B parameters). Both use the tiny word-level vocabulary (128 entries), so
  the output layer is negligible here; Qwen2.5-VL's 152k vocabulary adds ``2 x 152k x hidden``
  FLOPs per token to every pass.

Rollouts are text-only (``--prompt-len`` + ``--response-len`` tokens of ordinary words; the vision
tower is built but not run), ``--rollouts`` per step in micro-batches of ``--micro-batch``.

    python bench/actor_step.py                                 # GPU: tiny and 1b, bf16 and fp8
    python bench/actor_step.py --models tiny --precisions fp32 --rollouts 8 --repeats 1   # CPU smoke

Writes ``OUT/actor_step.md`` and ``OUT/actor_step.json`` (``--out``, default runs/actor_step).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: Model sizes: ModelConfig tiny_* fields.
MODELS = {
    "tiny": {},
    "1b": dict(
        tiny_hidden_size=2048, tiny_num_layers=16, tiny_intermediate_size=8192, tiny_num_attention_heads=16,
        tiny_num_key_value_heads=2, tiny_vision_depth=4, tiny_vision_hidden_size=1280,
    ),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,1b", help=f"comma-separated, of {sorted(MODELS)}")
    p.add_argument("--precisions", default=None, help="comma-separated of fp32, bf16, fp8 (default: bf16,fp8 on a GPU, fp32 on CPU)")
    p.add_argument("--rollouts", type=int, default=64, help="rollouts per step")
    p.add_argument("--micro-batch", type=int, default=8, help="rollouts per micro-batch")
    p.add_argument("--prompt-len", type=int, default=256, help="prompt tokens per rollout")
    p.add_argument("--response-len", type=int, default=768, help="response tokens per rollout")
    p.add_argument("--repeats", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "actor_step")
    p.add_argument("--cache", type=Path, default=None, help="model directory cache (default: FASTRL_CACHE_DIR/models)")
    args = p.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {sorted(MODELS)}")
    if args.rollouts % args.micro_batch:
        p.error(f"--rollouts ({args.rollouts}) must be a multiple of --micro-batch ({args.micro_batch})")
    return args


def model_dir(name: str, cache: Path) -> Path:
    from fastrl.config import ModelConfig
    from fastrl.models.tiny import cached_tiny_model_dir

    return cached_tiny_model_dir(cache, ModelConfig(source="tiny", **MODELS[name]))


def synthetic_batch(hf_dir: Path, rollouts: int, prompt_len: int, response_len: int, device):
    """``rollouts`` text-only rollouts of ordinary word tokens, GRPO-like advantages (float32 [N])."""
    import torch
    from transformers import AutoTokenizer

    from fastrl.batch import PolicyBatch

    tok = AutoTokenizer.from_pretrained(hf_dir)
    words = torch.tensor(sorted(i for t, i in tok.get_vocab().items() if not t.startswith("<")))
    g = torch.Generator().manual_seed(0)
    total = prompt_len + response_len
    ids = words[torch.randint(len(words), (rollouts, total), generator=g)]
    attention = torch.ones(rollouts, total, dtype=torch.bool)
    response = torch.zeros(rollouts, total, dtype=torch.bool)
    response[:, prompt_len:] = True
    adv = torch.randn(rollouts, generator=g)
    batch = PolicyBatch(input_ids=ids, attention_mask=attention, response_mask=response, tensors={"advantages": adv})
    return batch.to(device)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_bytes() -> int:
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def measure(name: str, precision: str, args: argparse.Namespace, cache: Path) -> dict:
    """One model at one precision: log-prob and update tokens/s and peak memory."""
    import torch

    from fastrl.config import AlgorithmConfig, ConfigError, OptimizerConfig, ParallelConfig, PrecisionConfig
    from fastrl.models.provider import build_policy
    from fastrl.training.actor import Actor
    from fastrl.models.logprobs import compute_log_probs

    row: dict = {"model": name, "precision": precision}
    parallel = ParallelConfig(micro_batch_size=args.micro_batch, use_distributed_optimizer=True)
    hf_dir = model_dir(name, cache)
    try:
        prec = PrecisionConfig(mode=precision)
        policy = build_policy(hf_dir, parallel=parallel, precision=prec, trainable=True)
    except ConfigError as err:
        row["status"] = f"not measured: {err}"
        return row
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    actor = Actor(
        policy, algorithm=AlgorithmConfig(kl_coef=0.0), optimizer=OptimizerConfig(lr=1e-6),
        parallel=parallel, precision=prec, total_steps=args.repeats + 1,
    )  # fmt: skip
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    batch = synthetic_batch(hf_dir, args.rollouts, args.prompt_len, args.response_len, device)
    tokens = int(batch.attention_mask.sum())
    row["parameters"] = sum(p.numel() for chunk in policy.chunks for p in chunk.parameters())
    logprob_s, update_s = [], []
    for i in range(args.repeats + 1):  # the first is warm-up
        _sync()
        t0 = time.perf_counter()
        old = compute_log_probs(policy.chunks, batch, micro_batch_size=args.micro_batch)
        _sync()
        t1 = time.perf_counter()
        actor.forward_backward(batch.with_tensors(old_log_probs=old))
        metrics = actor.step()
        _sync()
        t2 = time.perf_counter()
        if i:
            logprob_s.append(t1 - t0)
            update_s.append(t2 - t1)
    row.update(
        status="measured", tokens_per_step=tokens,
        logprob_tokens_per_s=tokens * len(logprob_s) / sum(logprob_s),
        update_tokens_per_s=tokens * len(update_s) / sum(update_s),
        update_seconds=sum(update_s) / len(update_s), peak_memory_bytes=_peak_bytes(),
        grad_norm=metrics["actor/grad_norm"],
    )  # fmt: skip
    del actor, policy
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def add_ratios(rows: list[dict]) -> None:
    """``update_ratio``: update tokens/s over the first measured precision of the same model."""
    base: dict[str, float] = {}
    for r in rows:
        if r.get("status") != "measured":
            continue
        b = base.setdefault(r["model"], r["update_tokens_per_s"])
        r["update_ratio"] = r["update_tokens_per_s"] / b


def markdown(rows: list[dict], device: str) -> str:
    lines = [
        f"Device: {device}.",
        "",
        "| model | parameters | precision | log-prob tokens/s | update tokens/s | update vs first precision | peak memory (GiB) |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r.get("status") != "measured":
            lines.append(f"| {r['model']} | | {r['precision']} | {r['status']} | | | |")
            continue
        lines.append(
            f"| {r['model']} | {r['parameters'] / 1e6:.1f}M | {r['precision']} | {r['logprob_tokens_per_s']:,.0f} | "
            f"{r['update_tokens_per_s']:,.0f} | {r['update_ratio']:.2f}x | {r['peak_memory_bytes'] / 2**30:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from fastrl.config import ParallelConfig
    from fastrl.data.easy_vqa import default_cache_dir
    from fastrl.distributed import parallel_state

    gpu = torch.cuda.is_available()
    precisions = (args.precisions or ("bf16,fp8" if gpu else "fp32")).split(",")
    cache = args.cache or default_cache_dir() / "models"
    device = torch.cuda.get_device_name(0) if gpu else f"CPU ({torch.get_num_threads()} torch threads)"
    parallel_state.initialize(ParallelConfig(micro_batch_size=args.micro_batch), seed=1)
    rows = []
    try:
        for name in args.models.split(","):
            for precision in precisions:
                print(f"actor_step: {name} {precision} ...", flush=True)
                rows.append(measure(name, precision, args, cache))
                print(f"  {rows[-1]}", flush=True)
    finally:
        parallel_state.destroy()
    add_ratios(rows)
    md = markdown(rows, device)
    settings = (f"{args.rollouts} rollouts x ({args.prompt_len} prompt + {args.response_len} response) tokens, "
                f"micro-batches of {args.micro_batch}, {args.repeats} timed steps after one warm-up")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "actor_step.md").write_text(f"{settings}.\n\n{md}\n")
    (args.out / "actor_step.json").write_text(json.dumps({"device": device, "settings": settings, "rows": rows}, indent=1))
    print(settings)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
