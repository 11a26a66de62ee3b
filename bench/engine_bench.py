"""The vLLM engine process against the in-process Hugging Face engine: generation and refit.

On the same tiny text-only Qwen2 model directory and the same prompts, with the same thread budget
(``--threads``: the HF engine's torch threads; the engine process's ``OMP_NUM_THREADS``), measures

* generation tokens/s (every response runs to ``--max-tokens``; median of ``--repeats``),
* refit seconds per step (the full state dict, as the trainer sends it every step) and, for the
  engine process, MB/s through the shared-memory buckets,
* refit as a fraction of a rollout step (generation + refit; the trainer's update comes on top, so
  the fraction of a real training step is lower).

``--hidden`` may list several model widths to see how refit MB/s grows with the model (small models
are dominated by the per-request overhead). Needs .venv-vllm (tools/setup_vllm_cpu.sh).

Usage: python bench/engine_bench.py [--prompts 16] [--n 4] [--max-tokens 32] [--threads 1] [--hidden 256 1024]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _prompts(tokenizer, count: int):
    from fastrl.rollout.engine import RolloutPrompt

    questions = ["what color is the shape?", "is there a red circle in the image?", "what shape is in the image?",
                 "does the image contain a triangle?"]
    return [RolloutPrompt(tokenizer.apply_chat_template([{"role": "user", "content": questions[i % 4]}], tokenize=False,
                                                        add_generation_prompt=True)) for i in range(count)]


def _measure(engine, weights: dict, prompts, n: int, max_tokens: int, repeats: int) -> dict:
    from fastrl.rollout.engine import SamplingParams

    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, stop_token_ids=(), seed=0)
    engine.generate(prompts[:2], 1, sampling)  # warm-up
    engine.update_weights(weights.items())
    gen, refit, mbps = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = engine.generate(prompts, n, sampling)
        elapsed = time.perf_counter() - start
        gen.append((sum(out.lengths) / elapsed, elapsed))
        start = time.perf_counter()
        engine.update_weights(weights.items())
        refit.append(time.perf_counter() - start)
        mbps.append(getattr(engine, "refit_metrics", {}).get("refit/mb_per_s", float("nan")))
    gen_s = statistics.median(g[1] for g in gen)
    refit_s = statistics.median(refit)
    return {
        "tokens_per_s": statistics.median(g[0] for g in gen), "gen_s": gen_s, "refit_s": refit_s,
        "refit_mb_per_s": statistics.median(mbps), "refit_fraction": refit_s / (gen_s + refit_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    parser.add_argument("--out", help="also write the results as JSON here")
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "fastrl-engine-bench"))
    args = parser.parse_args()

    import torch
    from safetensors.torch import load_file

    from fastrl.config import ModelConfig, RolloutConfig
    from fastrl.models.tiny import build_tiny_text_model_dir
    from fastrl.rollout.engine_client import EngineProcessClient
    from fastrl.rollout.hf_engine import HFRolloutEngine

    torch.set_num_threads(args.threads)
    results = []
    for hidden in args.hidden:
        model = ModelConfig(tiny_hidden_size=hidden, tiny_num_layers=args.layers, tiny_intermediate_size=2 * hidden,
                            tiny_num_attention_heads=max(1, hidden // 64), tiny_num_key_value_heads=max(1, hidden // 128))
        model_dir = build_tiny_text_model_dir(Path(args.cache) / f"h{hidden}", model)
        weights = load_file(model_dir / "model.safetensors")
        mb = sum(t.numel() * t.element_size() for t in weights.values()) / 2**20
        hf = HFRolloutEngine.from_pretrained(model_dir, RolloutConfig(), torch_threads=args.threads)
        prompts = _prompts(hf.tokenizer, args.prompts)
        row = {"hidden": hidden, "layers": args.layers, "model_mb": mb, "threads": args.threads,
               "hf": _measure(hf, weights, prompts, args.n, args.max_tokens, args.repeats)}
        del hf
        client = EngineProcessClient(
            model_dir, python=REPO / ".venv-vllm" / "bin" / "python", bucket_bytes=int(args.bucket_mb * 2**20),
            llm_kwargs=dict(max_model_len=256, kv_cache_memory_bytes=256 * 2**20, enforce_eager=True, dtype="float32"),
            env={"OMP_NUM_THREADS": str(args.threads)},
        )
        try:
            row["vllm_process"] = _measure(client, weights, prompts, args.n, args.max_tokens, args.repeats)
        finally:
            client.shutdown()
        results.append(row)
        h, v = row["hf"], row["vllm_process"]
        print(f"model {mb:.1f} MB (hidden {hidden}, {args.layers} layers), {args.threads} thread(s) each, "
              f"{args.prompts} prompts x n={args.n} x {args.max_tokens} tokens")
        print(f"  HF engine     : {h['tokens_per_s']:8.0f} tokens/s   refit {h['refit_s']:.3f} s "
              f"({100 * h['refit_fraction']:.1f}% of gen+refit)")
        print(f"  vLLM process  : {v['tokens_per_s']:8.0f} tokens/s   refit {v['refit_s']:.3f} s "
              f"({v['refit_mb_per_s']:.0f} MB/s, {100 * v['refit_fraction']:.1f}% of gen+refit)")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
