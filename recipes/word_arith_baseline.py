"""Base accuracy of a model on the word-problem splits, measured with vLLM (greedy, as validation does).

    .venv-vllm/bin/python recipes/word_arith_baseline.py [--model DIR] [--splits val test train] \
        [--skip 0] [--limit 500] [--max-tokens 128] [--per-problem FILE.jsonl] [--template FILE.jinja ...] [--probe N] [--out FILE.json] \
        [--sample N --sampling temperature=1.0 temperature=0.5 ...]

``--model`` defaults to the cached SmolLM2-135M-Instruct conversion (built by the trainer's
environment: ``.venv/bin/python -c "from fastrl.models.packaged import packaged_model_dir;
packaged_model_dir('smollm2-135m-instruct')"``). Prompts are rendered as the recipes render them
(``recipes/data/word_arith.jinja`` inside the model's chat template, no special tokens added) and
graded with :func:`recipes.word_arith.grade`. Prints, per split and per kind: accuracy with its
binomial standard error, and the fractions wrong and invalid; ``--out`` writes them as JSON, and
``--per-problem`` one line per problem (split, row index, kind, subset, outcome, parsed answer).
``--skip N --limit M``: rows N to N + M of each split (``--splits test_large --skip 300 --limit
300``: a random sample of 300 of the larger test split's new problems, which are shuffled).

``--probe N`` measures every story shape of :data:`recipes.word_arith.KINDS` instead of the splits:
N problems of each, drawn with :data:`PROBE_SEED` (not the splits' seed), so that the mix
(:data:`recipes.word_arith.MIX`) can be chosen without looking at the validation or test problems
(a probe problem may coincide with a split's by chance). ``--template`` takes one or more prompt
templates and measures each (default ``recipes/data/word_arith.jinja``, the recipes' template).
``--sample N`` samples N responses per problem (seed 1) under each ``--sampling`` setting instead of
decoding greedily, and counts the mixed groups (some but not all of the N correct): how much signal
a GRPO step at that setting gets.
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

from recipes.word_arith import DATA_DIR, KINDS, grade, kind_problems, parse_answer  # noqa: E402

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


def _setting(text: str) -> dict:
    """``"temperature=1.0,top_p=0.9"`` -> ``{"temperature": 1.0, "top_p": 0.9}``."""
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        out[key.strip()] = int(value) if key.strip() == "top_k" else float(value)
    return out


def _render(tok, template, rows) -> list[dict]:
    prompts = []
    for r in rows:
        text = tok.apply_chat_template([{"role": "user", "content": template.render(problem=r["problem"]).strip()}],
                                       tokenize=False, add_generation_prompt=True)
        prompts.append({"prompt_token_ids": tok(text, add_special_tokens=False)["input_ids"]})
    return prompts


def sampled(llm, tok, sets: dict, args) -> dict:
    """``--sample N``: per split and sampling setting, the accuracy of N sampled responses per problem
    and how many problems' groups are mixed (some but not all N correct: the groups whose GRPO
    advantages are not all zero)."""
    from jinja2 import Template
    from vllm import SamplingParams

    template = Template(args.template[0].read_text())
    out: dict = {}
    for split, rows in sets.items():
        prompts = _render(tok, template, rows)
        for text in args.sampling:
            start = time.time()
            params = SamplingParams(n=args.sample, max_tokens=args.max_tokens, seed=1, **_setting(text))
            outs = llm.generate(prompts, params, use_tqdm=False)
            grades = [[grade(c.text, r["answer"]) for c in o.outputs] for r, o in zip(rows, outs)]
            lengths = [len(c.token_ids) for o in outs for c in o.outputs]
            correct = [g.count("correct") for g in grades]
            entry = {**_summary([x for g in grades for x in g]), "sample": args.sample,
                     "mixed_groups": sum(0 < c < args.sample for c in correct), "groups": len(rows),
                     "response_tokens_mean": sum(lengths) / len(lengths),
                     "truncated": sum(n >= args.max_tokens for n in lengths) / len(lengths),
                     "seconds": round(time.time() - start, 1)}
            out[f"{split} [{text}]"] = entry
            print(f"{split} [{text}]: accuracy {entry['accuracy']:.3f} +- {entry['stderr']:.3f} (n={entry['n']}), invalid "
                  f"{entry['invalid']:.3f}, mixed groups {entry['mixed_groups']}/{len(rows)}; "
                  f"{entry['response_tokens_mean']:.0f} tokens per response, {entry['truncated']:.2f} truncated", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--splits", nargs="+", default=["val", "test", "train"])
    parser.add_argument("--limit", type=int, default=500, help="first N problems of each split (after --skip)")
    parser.add_argument("--skip", type=int, default=0, help="skip the first N problems of each split")
    parser.add_argument("--per-problem", type=Path, default=None, help="write each problem's outcome here (jsonl)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--template", nargs="+", type=Path, default=[DATA_DIR / "word_arith.jinja"])
    parser.add_argument("--probe", type=int, default=0, help="N problems of every kind instead of the splits")
    parser.add_argument("--kinds", nargs="+", default=None, help="--probe: these kinds only (default: every kind)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--sample", type=int, default=0,
                        help="N sampled responses per problem (seed 1) instead of greedy, for each --sampling setting")
    parser.add_argument("--sampling", nargs="+", default=["temperature=1.0"],
                        help="vLLM SamplingParams of --sample, one setting each, e.g. temperature=0.5 temperature=1.0,top_p=0.9")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from jinja2 import Template
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    model = args.model or _default_model()
    tok = AutoTokenizer.from_pretrained(model)
    start = time.time()
    # whole prefills: vLLM 0.32 on CPU cannot split a seeded request's prefill (fastrl/rollout/engine_server.py)
    llm = LLM(model, dtype="float32", max_model_len=512, enforce_eager=True, kv_cache_memory_bytes=512 * 2**20, seed=0,
              enable_chunked_prefill=False, max_num_batched_tokens=8192)
    print(f"engine ready in {time.time() - start:.0f} s", flush=True)
    results: dict = {"model": model, "max_tokens": args.max_tokens, "splits": {}}
    if args.probe:
        sets = {"probe": [{"problem": p.text, "answer": str(p.answer), "kind": p.kind}
                          for kind in (args.kinds or KINDS) for p in kind_problems(kind, args.probe, PROBE_SEED)]}
    else:
        sets = {split: [json.loads(line) for line in (DATA_DIR / f"word_arith_{split}.jsonl").read_text().splitlines()]
                [args.skip: args.skip + args.limit] for split in args.splits}
    if args.sample:
        results["sampled"] = sampled(llm, tok, sets, args)
        if args.out:
            args.out.write_text(json.dumps(results, indent=2) + "\n")
        return
    for (split, rows), template_path in ((x, t) for x in sets.items() for t in args.template):
        template = Template(template_path.read_text())
        if len(args.template) > 1:
            split = f"{split} [{template_path.name}]"
        prompts = _render(tok, template, rows)
        start = time.time()
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=False)
        seconds = time.time() - start
        outcomes = [grade(o.outputs[0].text, r["answer"]) for r, o in zip(rows, outs)]
        if args.per_problem:
            with open(args.per_problem, "a") as f:
                for i, (r, o, g) in enumerate(zip(rows, outs, outcomes)):
                    f.write(json.dumps({"split": split, "row": args.skip + i, "kind": r["kind"],
                                        "subset": r.get("subset"), "outcome": g,
                                        "parsed": parse_answer(o.outputs[0].text)}) + "\n")
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
