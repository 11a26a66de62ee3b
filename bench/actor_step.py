#!/usr/bin/env python
"""Actor step throughput and memory: the tiny and a ~1B Qwen2.5-VL-architecture policy, per precision.

Measures, in one process on one device (a GPU when CUDA is available, else the CPU), for each
model and precision:

- the log-prob pass (``compute_log_probs``: what the old and reference passes cost) in tokens/s;
- the actor update (``Actor.forward_backward`` + ``Actor.step``: PPO loss, backward, clipped Adam
  step of megatron's DistributedOptimizer) in tokens/s, and its model FLOPs utilization (MFU);
- peak memory: ``torch.cuda.max_memory_allocated`` on a GPU (bytes), the process's peak resident
  set on the CPU (bytes, monotone over the run, so only the first configuration's is its own);

and each configuration's update throughput as a ratio to the first precision measured for the
same model (the baseline of the same run). Tokens are every non-padding token of the batch (prompt
and response, image tokens included). FP8 goes through Transformer Engine layers; where Transformer
Engine is missing, the FP8 row says "not measured" with the reason -- never a silent bf16 run under
the FP8 name. FP8 batches are padded to the FP8-safe sequence multiple of the trainer
(:func:`fastrl.training.rollout_batch.sequence_multiple`).

Rows are written as soon as they are measured: each is appended to ``OUT/actor_step.jsonl`` (and
flushed) and the table files are rewritten, so a later crash loses nothing measured. A
configuration that fails (out of memory or any other error) is recorded as a row with its error,
and the next one runs.

Models (random weights, built locally from a config; no download):

- ``tiny``: the CPU recipes' policy (text hidden 256, 4 layers; vision depth 2, width 128; 3.5M
  parameters);
- ``1b``: text hidden 2048, 16 layers, 16 query / 2 key-value heads, MLP 8192; vision depth 4,
  width 1280 (about 1.03B parameters). Both use the tiny word-level vocabulary (128 entries), so
  the output layer is negligible here; Qwen2.5-VL's 152k vocabulary adds ``2 x 152k x hidden``
  FLOPs per token to every pass.

Rollouts: each prompt holds one ``--image-size`` x ``--image-size`` image (random pixels through the
model's own Qwen2.5-VL image processor: 64 image tokens at 224, 256 patches through the vision tower)
followed by ordinary words up to ``--prompt-len`` tokens, then ``--response-len`` response tokens;
``--image-size 0`` makes them text-only. ``--rollouts`` per step in micro-batches of
``--micro-batch``.

MFU: model FLOPs per step over the device's dense bf16 peak (``--peak-tflops``; known for H100 /
H200 SXM, 989 TFLOP/s): forward ``2 x parameters`` FLOPs per token for the language model (word
embeddings excluded) and per patch for the vision tower, plus causal attention ``2 x layers x
hidden x T`` per token; the update counts forward + backward as 3 forwards.

    python bench/actor_step.py                                 # GPU: tiny and 1b, bf16 and fp8
    python bench/actor_step.py --models tiny --precisions fp32 --rollouts 8 --repeats 1   # CPU smoke

Writes ``OUT/actor_step.jsonl`` (one row per line, as measured), ``OUT/actor_step.md`` and
``OUT/actor_step.json`` (``--out``, default runs/actor_step).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
import traceback
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

#: Dense bf16 peak (TFLOP/s) by device-name substring, for MFU.
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,1b", help=f"comma-separated, of {sorted(MODELS)}")
    p.add_argument("--precisions", default=None, help="comma-separated of fp32, bf16, fp8 (default: bf16,fp8 on a GPU, fp32 on CPU)")
    p.add_argument("--rollouts", type=int, default=64, help="rollouts per step")
    p.add_argument("--micro-batch", type=int, default=8, help="rollouts per micro-batch")
    p.add_argument("--prompt-len", type=int, default=256, help="prompt tokens per rollout (image tokens included)")
    p.add_argument("--response-len", type=int, default=768, help="response tokens per rollout")
    p.add_argument("--image-size", type=int, default=224, help="side of the square image of each prompt (0: text-only)")
    p.add_argument("--repeats", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak for MFU (default: by device name)")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "actor_step")
    p.add_argument("--cache", type=Path, default=None, help="model directory cache (default: FASTRL_CACHE_DIR/models)")
    args = p.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {sorted(MODELS)}")
    if args.rollouts % args.micro_batch:
        p.error(f"--rollouts ({args.rollouts}) must be a multiple of --micro-batch ({args.micro_batch})")
    if args.image_size < 0 or (args.image_size and args.image_size < 28):
        p.error(f"--image-size ({args.image_size}) must be 0 (text-only) or >= 28")
    if args.image_size:
        tokens = image_tokens_for(args.image_size)
        if args.prompt_len < tokens + 3:
            p.error(f"--prompt-len ({args.prompt_len}) must hold the image's {tokens} tokens and 3 more")
    return args


def image_tokens_for(side: int) -> int:
    """Image tokens of a ``side`` x ``side`` image under the default pixel bounds."""
    from fastrl.config import DataConfig
    from fastrl.data.images import image_token_count

    d = DataConfig()
    return image_token_count(side, side, min_pixels=d.min_pixels, max_pixels=d.max_pixels)


def model_dir(name: str, cache: Path) -> Path:
    from fastrl.config import ModelConfig
    from fastrl.models.tiny import cached_tiny_model_dir

    return cached_tiny_model_dir(cache, ModelConfig(source="tiny", **MODELS[name]))


def synthetic_batch(
    hf_dir: Path, rollouts: int, prompt_len: int, response_len: int, device, *, image_size: int = 0, pad_to_multiple: int = 1
):
    """``rollouts`` rollouts of ordinary word tokens, each prompt led by one image (when
    ``image_size``) as the model's processor encodes it; GRPO-like advantages (float32 [N]). The
    sequence length is rounded up to ``pad_to_multiple`` (masked padding)."""
    import json as _json

    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoTokenizer

    from fastrl.batch import PolicyBatch

    tok = AutoTokenizer.from_pretrained(hf_dir)
    words = torch.tensor(sorted(i for t, i in tok.get_vocab().items() if not t.startswith("<")))
    g = torch.Generator().manual_seed(0)
    total = prompt_len + response_len
    width = -(-total // pad_to_multiple) * pad_to_multiple
    ids = torch.full((rollouts, width), int(tok.pad_token_id or 0), dtype=torch.long)
    ids[:, :total] = words[torch.randint(len(words), (rollouts, total), generator=g)]
    attention = torch.zeros(rollouts, width, dtype=torch.bool)
    attention[:, :total] = True
    response = torch.zeros(rollouts, width, dtype=torch.bool)
    response[:, prompt_len:total] = True
    pixels = grids = None
    if image_size:
        from transformers import Qwen2VLImageProcessor

        from fastrl.data.images import num_image_tokens, process_images

        config = _json.loads((Path(hf_dir) / "config.json").read_text())
        image_processor = Qwen2VLImageProcessor.from_pretrained(hf_dir)  # the model's own settings
        rng = np.random.default_rng(0)
        image = Image.fromarray(rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8), "RGB")
        out = process_images(image_processor, [image])
        n_img = num_image_tokens(out["image_grid_thw"])[0]
        ids[:, 0] = config["vision_start_token_id"]
        ids[:, 1 : 1 + n_img] = config["image_token_id"]
        ids[:, 1 + n_img] = config["vision_end_token_id"]
        pixels = [out["pixel_values"].clone() for _ in range(rollouts)]
        grids = [out["image_grid_thw"].clone() for _ in range(rollouts)]
    adv = torch.randn(rollouts, generator=g)
    batch = PolicyBatch(
        input_ids=ids, attention_mask=attention, response_mask=response, pixel_values=pixels,
        image_grid_thw=grids, advantages=adv,
    )
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


def forward_flops(policy, batch) -> float:
    """Model FLOPs of one forward pass over ``batch`` (see the module docstring)."""
    lang = vision = 0
    for chunk in policy.chunks:
        for name, p in chunk.named_parameters():
            if "word_embeddings" in name:
                continue
            if "visual" in name or "vision" in name:  # megatron-bridge names the tower "visual"
                vision += p.numel()
            else:
                lang += p.numel()
    cfg = policy.config
    tokens = int(batch.attention_mask.sum())
    patches = sum(int(g.prod(dim=-1).sum()) for g in (batch.image_grid_thw or []) if g is not None)
    attention = 2 * cfg.num_layers * cfg.hidden_size * batch.seq_length * tokens  # causal QK^T + AV
    return 2.0 * lang * tokens + 2.0 * vision * patches + attention


def peak_flops(args: argparse.Namespace) -> float | None:
    import torch

    if args.peak_tflops:
        return args.peak_tflops * 1e12
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in name:
            return tflops * 1e12
    return None


def measure(name: str, precision: str, args: argparse.Namespace, cache: Path) -> dict:
    """One model at one precision: log-prob and update tokens/s, MFU and peak memory."""
    import torch

    from fastrl.config import AlgorithmConfig, ConfigError, OptimizerConfig, ParallelConfig, PrecisionConfig
    from fastrl.models.logprobs import compute_log_probs
    from fastrl.models.provider import build_policy
    from fastrl.training.actor import Actor, build_lr_scheduler
    from fastrl.training.rollout_batch import sequence_multiple

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
        parallel=parallel, precision=prec,
    )  # fmt: skip
    scheduler = build_lr_scheduler(actor.optimizer, OptimizerConfig(lr=1e-6), args.repeats + 1)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    batch = synthetic_batch(
        hf_dir, args.rollouts, args.prompt_len, args.response_len, device, image_size=args.image_size,
        pad_to_multiple=sequence_multiple(prec, parallel),
    )
    tokens = int(batch.attention_mask.sum())
    row["parameters"] = sum(p.numel() for chunk in policy.chunks for p in chunk.parameters())
    row["image_tokens_per_rollout"] = image_tokens_for(args.image_size) if args.image_size else 0
    flops = forward_flops(policy, batch)
    logprob_s, update_s = [], []
    for i in range(args.repeats + 1):  # the first is warm-up
        _sync()
        t0 = time.perf_counter()
        old = compute_log_probs(policy.chunks, batch, micro_batch_size=args.micro_batch)
        _sync()
        t1 = time.perf_counter()
        actor.forward_backward(batch.with_tensors(old_log_probs=old), dp_size=1)  # one process
        metrics = actor.step(scheduler=scheduler)
        _sync()
        t2 = time.perf_counter()
        if i:
            logprob_s.append(t1 - t0)
            update_s.append(t2 - t1)
    update_seconds = sum(update_s) / len(update_s)
    peak = peak_flops(args)
    row.update(
        status="measured", tokens_per_step=tokens, seq_length=batch.seq_length,
        logprob_tokens_per_s=tokens * len(logprob_s) / sum(logprob_s),
        update_tokens_per_s=tokens * len(update_s) / sum(update_s),
        update_seconds=update_seconds, peak_memory_bytes=_peak_bytes(),
        update_tflops=3 * flops / update_seconds / 1e12,
        update_mfu=(3 * flops / update_seconds / peak) if peak else None,
        grad_norm=metrics["actor/grad_norm"],
    )  # fmt: skip
    del actor, policy, batch
    return row


def measure_or_record_failure(name: str, precision: str, args: argparse.Namespace, cache: Path) -> dict:
    """:func:`measure`, or a row ``status = "failed: <error>"`` when it raises (out of memory or any
    other error); memory is released either way so that the next configuration can run."""
    import torch

    try:
        return measure(name, precision, args, cache)
    except Exception as err:  # noqa: BLE001 - recorded in the row; the benchmark goes on
        oom = isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()
        text = " ".join(str(err).split())[:300]
        row = {"model": name, "precision": precision,
               "status": f"failed: {'out of memory: ' if oom else ''}{type(err).__name__}: {text}",
               "traceback": traceback.format_exc()[-4000:]}
        if torch.cuda.is_available():
            row["peak_memory_bytes"] = _peak_bytes()
        return row
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


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
        "| model | parameters | precision | log-prob tokens/s | update tokens/s | update MFU | update vs first precision | peak memory (GiB) |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r.get("status") != "measured":
            lines.append(f"| {r['model']} | | {r['precision']} | {r['status']} | | | | |")
            continue
        mfu = f"{100 * r['update_mfu']:.1f}%" if r.get("update_mfu") is not None else "n/a"
        ratio = f"{r['update_ratio']:.2f}x" if "update_ratio" in r else ""
        lines.append(
            f"| {r['model']} | {r['parameters'] / 1e6:.1f}M | {r['precision']} | {r['logprob_tokens_per_s']:,.0f} | "
            f"{r['update_tokens_per_s']:,.0f} | {mfu} | {ratio} | {r['peak_memory_bytes'] / 2**30:.2f} |"
        )
    return "\n".join(lines)


class RowWriter:
    """Appends each row to ``OUT/actor_step.jsonl`` as it arrives (flushed to disk) and rewrites the
    table files, so that whatever was measured survives a later crash."""

    def __init__(self, out: Path, device: str, settings: str) -> None:
        self.out, self.device, self.settings = out, device, settings
        out.mkdir(parents=True, exist_ok=True)
        self.jsonl = out / "actor_step.jsonl"
        self.jsonl.write_text("")  # a new run starts a new file
        self.rows: list[dict] = []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        with self.jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.write_tables()

    def write_tables(self) -> str:
        add_ratios(self.rows)
        md = markdown(self.rows, self.device)
        (self.out / "actor_step.md").write_text(f"{self.settings}.\n\n{md}\n")
        payload = {"device": self.device, "settings": self.settings, "rows": self.rows}
        (self.out / "actor_step.json").write_text(json.dumps(payload, indent=1))
        return md


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from fastrl.config import ParallelConfig
    from fastrl.data.easy_vqa import default_cache_dir
    from fastrl.distributed.session import distributed_session

    gpu = torch.cuda.is_available()
    precisions = (args.precisions or ("bf16,fp8" if gpu else "fp32")).split(",")
    cache = args.cache or default_cache_dir() / "models"
    device = torch.cuda.get_device_name(0) if gpu else f"CPU ({torch.get_num_threads()} torch threads)"
    images = f", one {args.image_size}x{args.image_size} image per prompt" if args.image_size else ", text-only"
    settings = (f"{args.rollouts} rollouts x ({args.prompt_len} prompt + {args.response_len} response) tokens{images}, "
                f"micro-batches of {args.micro_batch}, {args.repeats} timed steps after one warm-up")
    writer = RowWriter(args.out, device, settings)
    with distributed_session(ParallelConfig(micro_batch_size=args.micro_batch), seed=1):
        for name in args.models.split(","):
            for precision in precisions:
                print(f"actor_step: {name} {precision} ...", flush=True)
                row = measure_or_record_failure(name, precision, args, cache)
                writer.add(row)
                print(f"  {json.dumps({k: v for k, v in row.items() if k != 'traceback'})}", flush=True)
    md = writer.write_tables()
    print(settings)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
