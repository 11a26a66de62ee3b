"""How far bf16 rounding moves the refit probe's log-probs: greedy tokens against uniformly random ones.

The refit probe (fastrl/training/refit_verify.py) compares the engine's and the trainer's log-probs of
its tokens; in bf16 the two sides round differently, so the bound (rollout.verify_refit_tolerance,
5e-2 for bf16) must sit above that rounding spread and below what a stale or wrong weight moves.
This measures the rounding spread on a real model: SmolLM2-135M-Instruct (the packaged model,
``packaged:smollm2-135m-instruct``), the probe's three questions, 12 response tokens each, either the
model's greedy response (the probe now) or 12 uniformly random tokens (the probe before), scored by
the fp32 model and by its bf16 copy (bf16 weights and compute, log-softmax in fp32).

    python bench/refit_probe_bf16.py --out bench/results/refit_probe_bf16.json

CPU, about a minute. One model and one pair of numerics (fp32 vs bf16 on CPU), not a GPU engine
against a GPU trainer: evidence for the direction and size of the effect, not a GPU measurement.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from fastrl.models.packaged import packaged_model_dir
from fastrl.training.refit_verify import PROBE_QUESTIONS, PROBE_RESPONSE_TOKENS


def _logprobs(model, seq: torch.Tensor, start: int) -> torch.Tensor:
    with torch.no_grad():
        logits = model(seq[None]).logits[0, start - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, seq[start:, None])[:, 0]


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    d = packaged_model_dir("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(d)
    fp32 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    bf16 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(1234)
    banned = set(tok.all_special_ids)
    allowed = torch.tensor([i for i in range(len(tok)) if i not in banned])
    rows = {"greedy": [], "random": []}
    for q in PROBE_QUESTIONS:
        text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        prompt = torch.tensor(tok(text, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            out = fp32.generate(prompt[None], max_new_tokens=PROBE_RESPONSE_TOKENS, do_sample=False)[0]
        responses = {"greedy": out[prompt.numel():],
                     "random": allowed[torch.randint(0, allowed.numel(), (PROBE_RESPONSE_TOKENS,), generator=gen)]}
        for kind, response in responses.items():
            seq = torch.cat([prompt, response])
            a, b = _logprobs(fp32, seq, prompt.numel()), _logprobs(bf16, seq, prompt.numel())
            rows[kind].append((a, (a - b).abs()))
    result = {}
    for kind, pairs in rows.items():
        lp = torch.cat([a for a, _ in pairs])
        diff = torch.cat([d for _, d in pairs])
        result[kind] = {"tokens": int(lp.numel()), "logprob_mean": float(lp.mean()), "logprob_min": float(lp.min()),
                        "abs_diff_mean": float(diff.mean()), "abs_diff_max": float(diff.max())}
    result["model"] = "SmolLM2-135M-Instruct (packaged), fp32 vs bf16, CPU"
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
