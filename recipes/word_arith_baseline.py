"""Base accuracy of a model on the word-problem splits, measured with vLLM (greedy, as validation does).

    .venv-vllm/bin/python recipes/word_arith_baseline.py [--model DIR] [--splits val test train] \
        [--limit 500] [--max-tokens 128] [--template FILE.jinja ...] [--probe N] [--out FILE.json]

``--model`` defaults to the cached SmolLM2-135M-Instruct conversion (built by the trainer's
environment: ``.venv/bin/python -c "from fastrl.models.packaged import packaged_model_dir;
packaged_model_dir('smollm2-135m-instruct')"``). Prompts are rendered as the recipes render them
(``recipes/data/word_arith.jinja`` inside the model's chat template, no special tokens added) and
graded with :func:`recipes.word_arith.grade`. Prints, per split and per kind: accuracy with its
binomial standard error, and the fractions wrong and invalid; ``--out`` writes them as JSON.

``--probe N`` measures every story shape of :data:`recipes.word_arith.KINDS` instead of the splits:
N problems of each, drawn with :data:`PROBE_SEED` (not the splits' seed), so that the mix
(:data:`recipes.word_arith.MIX`) can be chosen without looking at the validation or test problems
(a probe problem may coincide with a split's by chance). ``--template`` takes one or more prompt
templates and measures each (default ``recipes/data/word_arith.jinja``, the recipes' template).
Runs in the engine environment (vLLM, transformers 5); imports only this directory's task module.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from recipes.word_arith import DATA_DIR, KINDS, grade, kind_problems  # noqa: E402

#: seed of the ``--probe`` problems (the splits use :data:`recipes.word_arith.SEED`)
PROBE_SEED = 1031


def _default_model() -> str:
    cache = Path(os.environ.get("FASTRL_CACHE_DIR") or Path.home() / ".cache" / "fastrl")
    found = sorted(glob.glob(str(cache / "models" / "smollm2-135m-instruct-*" / "fastrl_packaged_model.json")))
    if not found:
        sys.exit("no cached SmolLM2 conversion; build it first (see the module docstring) or pass --model")
    return str(Path(found[-1]).parent)


def _summary(outcomes: list[str]) -> dict:
    n = len(outcomes)
    c = collections.Counter(outcomes)
    acc = c["correct"] / n
    return {"n": n, "accuracy": acc, "stderr": math.sqrt(acc * (1 - acc) / n), "wrong": c["wrong"] / n,
            "invalid": c["invalid"] / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--splits", nargs="+", default=["val", "test", "train"])
    parser.add_argument("--limit", type=int, default=500, help="first N problems of each split")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--template", nargs="+", type=Path, default=[DATA_DIR / "word_arith.jinja"])
    parser.add_argument("--probe", type=int, default=0, help="N problems of every kind instead of the splits")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from jinja2 import Template
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    model = args.model or _default_model()
    tok = AutoTokenizer.from_pretrained(model)
    start = time.time()
    llm = LLM(model, dtype="float32", max_model_len=512, enforce_eager=True, kv_cache_memory_bytes=512 * 2**20, seed=0)
    print(f"engine ready in {time.time() - start:.0f} s", flush=True)
    results: dict = {"model": model, "max_tokens": args.max_tokens, "splits": {}}
    if args.probe:
        sets = {"probe": [{"problem": p.text, "answer": str(p.answer), "kind": p.kind}
                          for kind in KINDS for p in kind_problems(kind, args.probe, PROBE_SEED)]}
    else:
        sets = {split: [json.loads(line) for line in (DATA_DIR / f"word_arith_{split}.jsonl").read_text().splitlines()]
                [: args.limit] for split in args.splits}
    for (split, rows), template_path in ((x, t) for x in sets.items() for t in args.template):
        template = Template(template_path.read_text())
        if len(args.template) > 1:
            split = f"{split} [{template_path.name}]"
        prompts = []
        for r in rows:
            text = tok.apply_chat_template([{"role": "user", "content": template.render(problem=r["problem"]).strip()}],
                                           tokenize=False, add_generation_prompt=True)
            prompts.append({"prompt_token_ids": tok(text, add_special_tokens=False)["input_ids"]})
        start = time.time()
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=False)
        seconds = time.time() - start
        outcomes = [grade(o.outputs[0].text, r["answer"]) for r, o in zip(rows, outs)]
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        by_kind = collections.defaultdict(list)
        for r, o in zip(rows, outcomes):
            by_kind[r["kind"]].append(o)
        entry = {**_summary(outcomes), "seconds": round(seconds, 1), "response_tokens_mean": tokens / len(rows),
                 "truncated": sum(len(o.outputs[0].token_ids) >= args.max_tokens for o in outs) / len(rows),
                 "by_kind": {k: _summary(v) for k, v in sorted(by_kind.items())}}
        results["splits"][split] = entry
        print(f"{split}: accuracy {entry['accuracy']:.3f} +- {entry['stderr']:.3f} (n={entry['n']}), wrong "
              f"{entry['wrong']:.3f}, invalid {entry['invalid']:.3f}; {entry['response_tokens_mean']:.0f} tokens per "
              f"response, {entry['truncated']:.2f} truncated, {seconds:.0f} s", flush=True)
        for kind, s in entry["by_kind"].items():
            print(f"    {kind:12s} {s['accuracy']:.3f} +- {s['stderr']:.3f} (n={s['n']}) invalid {s['invalid']:.3f}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
